import { median } from './stats.js';

/** The least a ladder's fit needs from a rung. */
export interface RungPoint {
  concurrency: number;
  throughput: number;
  latencyMs: { p50: number };
}

export type Verdict = 'A faster' | 'B faster' | 'noise';

const round = (x: number, d = 3): number => Math.round(x * 10 ** d) / 10 ** d;

/** The floor: p50 latency at the lowest rung (what one operation costs with nothing queued). */
export function floorMs(rungs: RungPoint[]): number {
  if (rungs.length === 0) return NaN;
  return rungs.reduce((lo, r) => (r.concurrency < lo.concurrency ? r : lo)).latencyMs.p50;
}

/**
 * The slope: added p50 latency per added slot, a least-squares line through (concurrency, p50)
 * over every rung. Null with fewer than two distinct rungs (a line needs two points).
 */
export function slopeMsPerSlot(rungs: RungPoint[]): number | null {
  const pts = rungs.filter((r) => Number.isFinite(r.latencyMs.p50));
  if (new Set(pts.map((r) => r.concurrency)).size < 2) return null;
  const mx = pts.reduce((a, r) => a + r.concurrency, 0) / pts.length;
  const my = pts.reduce((a, r) => a + r.latencyMs.p50, 0) / pts.length;
  let sxy = 0;
  let sxx = 0;
  for (const r of pts) {
    sxy += (r.concurrency - mx) * (r.latencyMs.p50 - my);
    sxx += (r.concurrency - mx) ** 2;
  }
  return round(sxy / sxx);
}

/** The rung where throughput peaks (the lower rung on a tie: the same rate for fewer slots). */
export function peak(rungs: RungPoint[]): { concurrency: number; throughput: number } {
  if (rungs.length === 0) return { concurrency: NaN, throughput: NaN };
  const best = rungs.reduce((b, r) =>
    r.throughput > b.throughput || (r.throughput === b.throughput && r.concurrency < b.concurrency) ? r : b,
  );
  return { concurrency: best.concurrency, throughput: best.throughput };
}

/** Do the ranges [min, max] of two sets of reps share any value? */
export function overlap(a: number[], b: number[]): boolean {
  if (a.length === 0 || b.length === 0) return true;
  return Math.min(...a) <= Math.max(...b) && Math.min(...b) <= Math.max(...a);
}

/**
 * A win needs reps that do not overlap. With a single rep on either side the spread is unknown,
 * so no win is claimed from it either: that is also called noise.
 */
export function verdict(a: number[], b: number[]): Verdict {
  if (a.length < 2 || b.length < 2 || overlap(a, b)) return 'noise';
  return median(a) > median(b) ? 'A faster' : 'B faster';
}

export interface LadderFit {
  floorMs: number;
  slopeMsPerSlot: number | null;
  peak: { concurrency: number; throughput: number };
}

export function fit(rungs: RungPoint[]): LadderFit {
  return { floorMs: floorMs(rungs), slopeMsPerSlot: slopeMsPerSlot(rungs), peak: peak(rungs) };
}
