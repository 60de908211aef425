import { DEFAULT_IMAGE } from '../defaults.js';
import { randomBytes } from 'node:crypto';
import type { LabApi } from '../sdk/api.js';
import { driverInfo } from '../drivers/registry.js';
import { Pool } from '../sdk/pool.js';
import type { RunOutcome } from '../lab/pools/run.js';
import type { TraceSummary } from '../timing/trace.js';
import { closedLoop, type LoopResult } from './loop.js';
import type { BenchSettings } from './settings.js';

/** Phases by path ("take/thaw"), so that the one that grows with load is visible. */
function phasePaths(t: TraceSummary): Record<string, number> {
  const out: Record<string, number> = {};
  const names: string[] = [];
  t.phases.forEach((p, i) => {
    names[i] = p.parent === null ? p.name : `${names[p.parent]}/${p.name}`;
    out[names[i]!] = (out[names[i]!] ?? 0) + p.endMs - p.startMs;
  });
  return out;
}

/**
 * fresh-exec: every execution in a fresh sandbox taken from a pool of paused standbys, kept
 * full in the background; the sandbox is recycled after a clean check (`recycle`) or destroyed.
 * Latency: take → exec → give back, as the run's trace measures it. The pool is made for the
 * run (filled before the clock starts) and removed after it.
 */
export async function freshExec(
  lab: LabApi,
  s: BenchSettings & { recycle: boolean; poolSize?: number },
): Promise<LoopResult> {
  const name = `bench-${randomBytes(3).toString('hex')}`;
  const pool = await lab.createPool({
    name,
    image: DEFAULT_IMAGE,
    size: s.poolSize ?? Math.max(2, s.concurrency * 2),
    limits: {},
    storage: s.storage,
    driver: s.driver,
    // VM standbys are never recycled (each use is a fresh restore): the option does not apply
    recycle: driverInfo(s.driver).capabilities.memorySnapshot ? undefined : s.recycle,
    userns: s.userns,
    ...(s.egress ? { egress: true } : {}),
  });
  try {
    // the embedded pool is refilled by this process; a daemon refills the pools it holds itself
    if (pool instanceof Pool) pool.start();
    return await closedLoop(s.concurrency, { count: s.count, durationMs: s.durationMs }, async () => {
      const t0 = performance.now();
      const r: RunOutcome & { trace?: TraceSummary } = await pool.run(s.argv, { encoding: 'buffer' });
      if (r.exitCode !== 0) throw new Error(`${s.argv.join(' ')} exited ${r.exitCode}: ${r.stderr.toString().trim()}`);
      // through a daemon there is no trace here: the call's wall time, which is what its client waits
      return r.trace
        ? { latencyMs: r.trace.totalMs, phases: phasePaths(r.trace) }
        : { latencyMs: performance.now() - t0, phases: {} };
    });
  } finally {
    await pool.remove();
  }
}
