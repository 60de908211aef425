import { fit, type Verdict } from './fit.js';
import type { LoopResult } from './loop.js';
import { latencySummary, median, phaseMedians, type LatencySummary } from './stats.js';

/** One repetition of one rung: a closed loop of `duration` seconds. */
export interface Rep {
  rep: number;
  throughput: number;
  ops: number;
  errors: number;
  wallMs: number;
  latencyMs: LatencySummary;
  phasesMs: Record<string, number>;
  firstError?: string;
}

export interface Rung {
  concurrency: number;
  /** median over reps of completed operations per second of wall time */
  throughput: number;
  /** the reps' lowest and highest throughput: a difference inside this range is noise */
  throughputRange: { min: number; max: number };
  ops: number;
  errors: number;
  /** percentiles over every sample of every rep */
  latencyMs: LatencySummary;
  /** median of each phase over every operation of every rep */
  phasesMs: Record<string, number>;
  reps: Rep[];
}

export interface Baseline {
  name: string;
  /** at its best rung */
  throughput?: number;
  /** at its lowest rung */
  latencyMs?: LatencySummary;
  note?: string;
  floorMs?: number;
  slopeMsPerSlot?: number | null;
  peak?: { concurrency: number; throughput: number };
  rungs?: Rung[];
}

export interface CompareSide {
  throughput: number;
  throughputReps: number[];
  latencyMs: LatencySummary;
  phasesMs: Record<string, number>;
}

export interface CompareRung {
  concurrency: number;
  a: CompareSide;
  b: CompareSide;
  overlap: boolean;
  verdict: Verdict;
}

export interface Compare {
  a: {
    options: string;
    floorMs: number;
    slopeMsPerSlot: number | null;
    peak: { concurrency: number; throughput: number };
  };
  b: {
    options: string;
    floorMs: number;
    slopeMsPerSlot: number | null;
    peak: { concurrency: number; throughput: number };
  };
  rungs: CompareRung[];
}

/** The summary every bench prints with --json; later issues extend it and never break it. */
export interface BenchSummary {
  workload: string;
  storage?: string;
  argv?: string[];
  startedAt: string;
  finishedAt?: string;
  settings?: {
    ladder: number[];
    reps: number;
    durationMs: number;
    count?: number;
    driver?: string;
    recycle?: boolean;
    poolSize?: number;
  };
  rungs: Rung[];
  floorMs: number;
  slopeMsPerSlot: number | null;
  peak: { concurrency: number; throughput: number };
  baselines: Baseline[];
  /** measured value ÷ baseline value, where a baseline applies */
  ratios: Record<string, number>;
  /** present with --compare: `rungs` above are configuration A's */
  compare?: Compare;
  notes?: string[];
  extra?: Record<string, unknown>;
}

const round = (x: number, d = 1): number => Math.round(x * 10 ** d) / 10 ** d;

export function toRep(rep: number, r: LoopResult): Rep {
  return {
    rep,
    throughput: round((r.latenciesMs.length / r.wallMs) * 1000),
    ops: r.latenciesMs.length,
    errors: r.errors.length,
    wallMs: round(r.wallMs),
    latencyMs: latencySummary(r.latenciesMs),
    phasesMs: phaseMedians(r.phases),
    ...(r.errors[0] ? { firstError: r.errors[0] } : {}),
  };
}

/** Aggregate a rung's reps: the median rep's throughput; latency and phases over all samples. */
export function toRung(concurrency: number, results: LoopResult | LoopResult[]): Rung {
  const rs = Array.isArray(results) ? results : [results];
  const reps = rs.map((r, i) => toRep(i + 1, r));
  const tps = reps.map((r) => r.throughput);
  return {
    concurrency,
    throughput: round(median(tps)),
    throughputRange: { min: Math.min(...tps), max: Math.max(...tps) },
    ops: reps.reduce((a, r) => a + r.ops, 0),
    errors: reps.reduce((a, r) => a + r.errors, 0),
    latencyMs: latencySummary(rs.flatMap((r) => r.latenciesMs)),
    phasesMs: phaseMedians(rs.flatMap((r) => r.phases)),
    reps,
  };
}

/** A baseline measured on the ladder: its throughput at its best rung, its latency at its lowest. */
export function toBaseline(name: string, rungs: Rung[], note?: string): Baseline {
  const f = fit(rungs);
  const lowest = rungs.reduce((lo, r) => (r.concurrency < lo.concurrency ? r : lo));
  return { name, throughput: f.peak.throughput, latencyMs: lowest.latencyMs, ...(note ? { note } : {}), ...f, rungs };
}

export function compareSide(r: Rung): CompareSide {
  return {
    throughput: r.throughput,
    throughputReps: r.reps.map((x) => x.throughput),
    latencyMs: r.latencyMs,
    phasesMs: r.phasesMs,
  };
}

/**
 * Ratios to the baseline that bounds each workload, best rung against best rung (each peaks
 * where it peaks), plus the latency floor for raise.
 */
export function ratiosOf(s: Pick<BenchSummary, 'workload' | 'peak' | 'floorMs' | 'baselines'>): Record<string, number> {
  const out: Record<string, number> = {};
  const b = (name: string): Baseline | undefined =>
    s.baselines.find((x) => x.name === name && x.throughput !== undefined);
  const bare = b('bare-spawn');
  const raw = b('raw-namespace');
  if (s.workload === 'exec' && bare?.throughput)
    out['exec/bare-spawn throughput'] = round(s.peak.throughput / bare.throughput, 2);
  if (s.workload === 'fresh-exec' && raw?.throughput)
    out['fresh-exec/raw-namespace throughput'] = round(s.peak.throughput / raw.throughput, 2);
  if (s.workload === 'fresh-exec' && raw?.floorMs)
    out['fresh-exec/raw-namespace p50 floor'] = round(s.floorMs / raw.floorMs, 2);
  if (s.workload === 'raise' && bare?.floorMs) out['raise/bare-spawn p50 latency'] = round(s.floorMs / bare.floorMs, 1);
  const boot = b('boot');
  if (s.workload === 'restore' && boot?.floorMs) out['restore/boot p50 latency'] = round(s.floorMs / boot.floorMs, 2);
  const downUp = b('down+up');
  if (s.workload === 'scenario-reset' && downUp?.floorMs)
    out['down+up/scenario-reset p50 (times faster)'] = round(downUp.floorMs / s.floorMs, 1);
  const slow = b('no-standby');
  if (s.workload === 'scenario-reset' && slow?.floorMs)
    out['no-standby/scenario-reset p50 (times faster)'] = round(slow.floorMs / s.floorMs, 1);
  return out;
}
