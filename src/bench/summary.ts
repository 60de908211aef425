import type { LoopResult } from './loop.js';
import { latencySummary, phaseMedians, type LatencySummary } from './stats.js';

export interface Rung {
  concurrency: number;
  /** completed operations per second of wall time */
  throughput: number;
  ops: number;
  errors: number;
  latencyMs: LatencySummary;
  phasesMs: Record<string, number>;
}

export interface Baseline {
  name: string;
  throughput?: number;
  latencyMs?: LatencySummary;
  note?: string;
}

/** The summary every bench prints with --json; later issues extend it and never break it. */
export interface BenchSummary {
  workload: string;
  storage?: string;
  argv?: string[];
  startedAt: string;
  rungs: Rung[];
  baselines: Baseline[];
  /** measured value ÷ baseline value, where a baseline applies */
  ratios: Record<string, number>;
  extra?: Record<string, unknown>;
}

const round = (x: number, d = 1): number => Math.round(x * 10 ** d) / 10 ** d;

export function toRung(concurrency: number, r: LoopResult): Rung {
  return {
    concurrency,
    throughput: round((r.latenciesMs.length / r.wallMs) * 1000),
    ops: r.latenciesMs.length,
    errors: r.errors.length,
    latencyMs: latencySummary(r.latenciesMs),
    phasesMs: phaseMedians(r.phases),
  };
}

export function toBaseline(name: string, r: LoopResult): Baseline {
  return { name, throughput: round((r.latenciesMs.length / r.wallMs) * 1000), latencyMs: latencySummary(r.latenciesMs) };
}

export function renderSummary(s: BenchSummary): string {
  const lines = [`workload ${s.workload}${s.storage ? ` on ${s.storage}` : ''}${s.argv ? ` (${s.argv.join(' ')})` : ''}`];
  for (const r of s.rungs) {
    lines.push(`  concurrency ${r.concurrency}: ${r.throughput}/s over ${r.ops} ops${r.errors ? `, ${r.errors} errors` : ''}; latency p50 ${r.latencyMs.p50} ms, p90 ${r.latencyMs.p90} ms, p99 ${r.latencyMs.p99} ms`);
    const ph = Object.entries(r.phasesMs);
    if (ph.length) lines.push(`    phase medians: ${ph.map(([k, v]) => `${k} ${v} ms`).join(', ')}`);
  }
  for (const b of s.baselines) {
    lines.push(`  baseline ${b.name}: ${b.throughput !== undefined ? `${b.throughput}/s` : ''}${b.latencyMs ? `, p50 ${b.latencyMs.p50} ms, p99 ${b.latencyMs.p99} ms` : ''}${b.note ? ` (${b.note})` : ''}`);
  }
  for (const [k, v] of Object.entries(s.ratios)) lines.push(`  ratio ${k}: ${v}`);
  if (s.extra) for (const [k, v] of Object.entries(s.extra)) lines.push(`  ${k}: ${JSON.stringify(v)}`);
  return lines.join('\n');
}
