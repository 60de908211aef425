import type { SandboxRecord } from '../store/records.js';
import type { Trace } from '../timing/trace.js';
import type { LabContext } from './context.js';

/** Kill the machine, delete its volume, forget the record. Idempotent; used by rm and by failed raises. */
export async function destroyRecord(ctx: LabContext, s: SandboxRecord, trace?: Trace): Promise<void> {
  const phase = <T>(name: string, fn: () => Promise<T>): Promise<T> => (trace ? trace.phase(name, fn) : fn());
  ctx.store.updateSandbox(s.id, { state: 'removing', reason: `being removed by pid ${process.pid}` });
  await phase('kill', () => ctx.driver(s.driver).destroy({ id: s.id, pid: s.pid ?? 0, pidStart: s.pidStart ?? 0 }));
  if (s.volume) {
    const volume = s.volume;
    await phase('delete volume', async () => (await ctx.readyBackend(s.storage)).delete(volume));
  }
  ctx.store.deleteSandbox(s.id);
}
