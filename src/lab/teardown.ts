import type { SandboxRecord } from '../store/records.js';
import type { LabContext } from './context.js';

/** Kill the machine, delete its volume, forget the record. Idempotent; used by rm and by failed raises. */
export async function destroyRecord(ctx: LabContext, s: SandboxRecord): Promise<void> {
  ctx.store.updateSandbox(s.id, { state: 'removing', reason: `being removed by pid ${process.pid}` });
  await ctx.driver(s.driver).destroy({ id: s.id, pid: s.pid ?? 0, pidStart: s.pidStart ?? 0 });
  if (s.volume) await (await ctx.readyBackend(s.storage)).delete(s.volume);
  ctx.store.deleteSandbox(s.id);
}
