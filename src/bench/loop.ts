import type { TraceSummary } from '../timing/trace.js';

export interface LoopResult {
  latenciesMs: number[];
  phases: Record<string, number>[];
  wallMs: number;
  errors: string[];
}

const now = (): number => Number(process.hrtime.bigint()) / 1e6;

/**
 * Operations completed by every closed loop in this process, for the progress line's current
 * rate. A counter rather than a callback so that any workload (whoever wrote it) is counted.
 */
export const loopActivity = { ops: 0 };

/**
 * Run `op` with `concurrency` workers until `count` operations are done or `durationMs` has
 * passed (whichever comes first). Each op returns its own latency (its trace's total, or the
 * time the loop measured) and optionally its phases.
 */
export async function closedLoop(
  concurrency: number,
  limit: { count?: number; durationMs?: number },
  op: (worker: number) => Promise<{ latencyMs?: number; phases?: Record<string, number> } | undefined>,
): Promise<LoopResult> {
  const res: LoopResult = { latenciesMs: [], phases: [], wallMs: 0, errors: [] };
  const t0 = now();
  let started = 0;
  const more = (): boolean =>
    (limit.count === undefined || started < limit.count) &&
    (limit.durationMs === undefined || now() - t0 < limit.durationMs);
  await Promise.all(
    Array.from({ length: concurrency }, async (_, w) => {
      while (more()) {
        started++;
        const s = now();
        try {
          const r = await op(w);
          res.latenciesMs.push(r?.latencyMs ?? now() - s);
          loopActivity.ops++;
          if (r?.phases) res.phases.push(r.phases);
        } catch (e) {
          res.errors.push((e as Error).message);
          if (res.errors.length > 20) throw e;
        }
      }
    }),
  );
  res.wallMs = now() - t0;
  return res;
}

/** The time of each top-level phase of a trace, summed by name: what a loop op reports as its phases. */
export function phasesOf(t: TraceSummary | undefined): Record<string, number> {
  const out: Record<string, number> = {};
  for (const p of t?.phases ?? []) if (p.depth === 0) out[p.name] = (out[p.name] ?? 0) + p.endMs - p.startMs;
  return out;
}
