import { handleOf } from './handle.js';
import { me, ownerAlive } from './owner.js';
import { RAISING } from '../pools/raising.js';
import { SnaplabError } from '../../errors.js';
import { releaseRange } from '../../host/userns/registry.js';
import type { SandboxRecord } from '../../store/records.js';
import type { Trace } from '../../timing/trace.js';
import type { LabContext } from '../context.js';
import { noted } from '../../cleanup.js';
import { detachEgress } from '../../host/net/egress.js';

/**
 * Kill the machine, delete its volume, forget the record. Idempotent; used by rm and by failed
 * raises. When a step fails the record is kept, `dead` with what failed as its reason (not
 * `removing`: this process may live on, a pool runner for hours), so that `ls` shows it and a
 * later `rm` or `gc` finishes the job.
 */
export async function destroyRecord(ctx: LabContext, s: SandboxRecord, trace?: Trace): Promise<void> {
  const phase = <T>(name: string, fn: () => Promise<T>): Promise<T> => (trace ? trace.phase(name, fn) : fn());
  ctx.store.updateSandbox(s.id, {
    state: 'removing',
    reason: `being removed by pid ${process.pid}`,
    owner: me('remove'),
  });
  try {
    await phase('kill', () => ctx.driver(s.driver).destroy(handleOf(s)));
    // with the machine dead its volume and its egress link are apart: both go at once (one after
    // the other, an E2B kill of a sandbox with internet access waited ~50 + ~100 ms); the first
    // failure is the removal's, once both have settled
    const volume = s.volume;
    const steps = await Promise.allSettled([
      volume ? phase('delete volume', async () => (await ctx.readyBackend(s.storage)).delete(volume)) : undefined,
      s.egress ? phase('egress', () => detachRecordEgress(ctx, s)) : undefined,
    ]);
    const failed = steps.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
  } catch (e) {
    // the owner's step stays 'remove': a dead record with it is a removal that did not finish
    ctx.store.updateSandbox(s.id, {
      state: 'dead',
      reason: `removal failed: ${(e as Error).message} (run \`snaplab rm ${s.name}\` or \`snaplab gc\` again)`,
    });
    throw e;
  }
  ctx.store.deleteSandbox(s.id);
  // its processes are gone with its cgroup; a scenario machine's range is its scenario's (down)
  if (s.uidBase !== null && s.scenario === null) await releaseRange(s.uidBase, ctx.home, s.id, s.ids ?? null);
}

/**
 * Take a record for an rm: SANDBOX_BUSY while another step still makes it (a create, a start:
 * `creating`) in a process that runs. Removed meanwhile, its record and uid range went while the
 * create went on with the range it held; the next create could claim that range, and two machines
 * shared host ids. The take is a compare and set on the record as read (a start that begins
 * between the look and the take is seen). Another process's removal of it is waited for (up to a
 * minute): its end is this one's. Returns the record as taken, as given when it was gone already
 * (the removal is then idempotent), or undefined when another removal took it away meanwhile. A
 * process's own failed raise removes what it made with destroyRecord, never through here.
 */
export async function takeForRemoval(ctx: LabContext, s: SandboxRecord): Promise<SandboxRecord | undefined> {
  const waitUntil = Date.now() + REMOVAL_WAIT_MS;
  // (`missed`: compare-and-sets lost to a change meanwhile, not the waits for another's removal)
  for (let looks = 0, missed = 0; ; looks++) {
    const now = ctx.store.getSandbox(s.id);
    if (now?.id !== s.id) return looks === 0 ? s : undefined;
    const busy = makerOf(now) !== undefined && (await ownerAlive(now.owner));
    if (!busy && ctx.store.claimRemoval(now, me('remove'))) return now;
    // another's removal under way: this one's answer is its end (gone: done), waited for a while
    if (busy && now.state === 'removing' && Date.now() < waitUntil) {
      await new Promise((r) => setTimeout(r, 50));
      continue;
    }
    if (busy || ++missed > 3) throw busyError(s.name, now);
  }
}

/** How long an rm waits for another process's removal of the same machine to end (a VM's takes seconds). */
const REMOVAL_WAIT_MS = 60_000;

/**
 * What a live owner of this record is still doing to it, that an rm must not cut under it: a
 * create or start (`creating`), a removal (two at once each deleted its volume and one failed), a
 * pool's standby being raised (its raiser would write it back as a ready standby). Undefined: none.
 */
function makerOf(r: SandboxRecord): string | undefined {
  if (r.state === 'creating') return r.owner?.op === 'start' ? 'started' : 'created';
  if (r.state === 'removing') return 'removed';
  if (r.owner?.op === 'hold' && r.reason?.startsWith(RAISING)) return 'raised as a standby';
  return undefined;
}

function busyError(name: string, now: SandboxRecord): SnaplabError {
  const what = makerOf(now) ?? 'changed';
  const pid = now.owner?.pid;
  // (a daemon's own create: its callers are not told to stop the daemon)
  const mine = pid === process.pid || pid == null;
  const by = mine ? '' : ` (by pid ${pid})`;
  const hint =
    what === 'removed'
      ? 'it is going: `snaplab ls` shows when it is gone'
      : mine
        ? 'remove it once that returns'
        : `remove it once that returns, or stop pid ${pid}: the machine is then reported dead, and rm removes it`;
  return new SnaplabError('SANDBOX_BUSY', `sandbox ${name} is still being ${what}${by}`, hint);
}

/**
 * A machine's egress link and rules (none: nothing). A scenario machine's namespace is its
 * scenario's, kept (its network links; a reset raises the next machine in it).
 */
export async function detachRecordEgress(ctx: LabContext, s: SandboxRecord): Promise<void> {
  if (!s.egress) return;
  await detachEgress(ctx.home, s.egress.slot, { keepNetns: s.scenario !== null, mark: s.egress.mark });
}

/**
 * Remove what a failed raise made before its error goes back to the caller. A kill that did not
 * finish (a machine slow to exit on a loaded host) is tried once more; what still fails stays
 * recorded as `dead` with its reason (destroyRecord).
 */
export async function undoRaise(ctx: LabContext, s: SandboxRecord): Promise<void> {
  try {
    await destroyRecord(ctx, s);
  } catch {
    await destroyRecord(ctx, s).catch(noted(`remove ${s.name}, second try`));
  }
}
