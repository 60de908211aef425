/** Percentile by linear interpolation between closest ranks; NaN for no samples. */
export function percentile(samples: number[], p: number): number {
  if (samples.length === 0) return NaN;
  const s = [...samples].sort((a, b) => a - b);
  const rank = (p / 100) * (s.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.ceil(rank);
  return s[lo]! + (s[hi]! - s[lo]!) * (rank - lo);
}

export const median = (xs: number[]): number => percentile(xs, 50);

export interface LatencySummary {
  p50: number;
  p90: number;
  p99: number;
}

export function latencySummary(xs: number[]): LatencySummary {
  const r = (v: number): number => Math.round(v * 1000) / 1000;
  return { p50: r(percentile(xs, 50)), p90: r(percentile(xs, 90)), p99: r(percentile(xs, 99)) };
}

/** Median of each named phase over many traces (phases absent from a trace are skipped). */
export function phaseMedians(perOp: Record<string, number>[]): Record<string, number> {
  const by = new Map<string, number[]>();
  for (const op of perOp) for (const [k, v] of Object.entries(op)) (by.get(k) ?? by.set(k, []).get(k)!).push(v);
  return Object.fromEntries([...by].map(([k, v]) => [k, Math.round(median(v) * 1000) / 1000]));
}
