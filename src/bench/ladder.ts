import type { Arm } from './baselines.js';
import type { LoopResult } from './loop.js';
import type { Progress } from './progress.js';

export interface ArmOutcome {
  name: string;
  note?: string;
  /** reps per rung, in ladder order */
  byRung: Map<number, LoopResult[]>;
  /** why this arm stopped early (baselines only; a workload's failure ends the run) */
  failed?: string;
}

/**
 * Climb the ladder: on each rung, each rep runs every arm once, in turn (A B baselines, A B
 * baselines, …), so that drift in the host (other load, page cache, thermal) falls on every arm
 * alike instead of on whichever ran last. Arms marked `optional` (baselines) are dropped with a
 * note when they fail; a workload's failure propagates.
 */
export async function climb(
  arms: (Arm & { optional?: boolean })[],
  ladder: number[],
  reps: number,
  progress: Progress,
): Promise<ArmOutcome[]> {
  const out: ArmOutcome[] = arms.map((a) => ({ name: a.name, note: a.note, byRung: new Map() }));
  for (const [ri, c] of ladder.entries()) {
    for (let rep = 1; rep <= reps; rep++) {
      for (const [ai, arm] of arms.entries()) {
        const o = out[ai]!;
        if (o.failed) continue;
        progress.start({ concurrency: c, rungIndex: ri, rungs: ladder.length, rep, reps, arm: arm.name });
        try {
          const r = await arm.run(c);
          progress.end(r);
          (o.byRung.get(c) ?? o.byRung.set(c, []).get(c)!).push(r);
        } catch (e) {
          const msg = (e as Error).message;
          progress.end(undefined, msg);
          if (!arm.optional) throw e;
          o.failed = msg;
        }
      }
    }
  }
  return out;
}
