import { pidAlive } from '../host/procs.js';
import type { SandboxRecord } from '../store/records.js';
import type { LabContext } from './context.js';

/**
 * Bring a record in line with the host: a sandbox whose init is gone is dead (with the reason the
 * host can give); a sandbox left 'creating' or 'removing' by a process that no longer exists was
 * interrupted.
 * The store never claims a sandbox that is not there.
 */
export async function reconcile(ctx: LabContext, s: SandboxRecord): Promise<SandboxRecord> {
  if (s.state === 'running' || s.state === 'paused') {
    const r = await ctx.driver(s.driver).inspect({ id: s.id, pid: s.pid ?? 0, pidStart: s.pidStart ?? 0 });
    if (!r.alive) {
      ctx.store.updateSandbox(s.id, { state: 'dead', reason: r.reason ?? null });
      return { ...s, state: 'dead', reason: r.reason ?? null };
    }
  } else if (s.state === 'creating' || s.state === 'removing') {
    const m = /pid (\d+)/.exec(s.reason ?? '');
    const owner = m ? Number(m[1]) : 0;
    if (!owner || !(await pidAlive(owner))) {
      const reason = s.state === 'creating' ? 'creation was interrupted (the process creating it exited)' : 'removal was interrupted';
      ctx.store.updateSandbox(s.id, { state: 'dead', reason });
      return { ...s, state: 'dead', reason };
    }
  }
  return s;
}
