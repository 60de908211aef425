import { recordFailure } from '../../cleanup.js';
import { SnaplabError } from '../../errors.js';
import { handleOf } from './handle.js';
import { ownerAlive } from './owner.js';
import { releaseRange } from '../../host/userns/registry.js';
import { STOPPED } from './stopped.js';
import type { SandboxRecord } from '../../store/records.js';
import type { LabContext } from '../context.js';

/**
 * Bring a record in line with the host: a sandbox whose init is gone is dead (with the reason the
 * host can give); a sandbox left 'creating' or 'removing' by a process that no longer exists was
 * interrupted. The store never claims a sandbox that is not there.
 *
 * A record found dead here is also reaped: its processes are killed (QEMU and its relay
 * included: a VM whose creator was killed mid-boot would otherwise run on, holding its memory),
 * and its cgroup, run directory and VM RAM file are removed at once. The record and its reason
 * stay for `ls` until `rm`; its volume waits for `rm` or `gc`. Every command that reads records
 * (ls, status, exec, rm, gc, pool and scenario commands) reconciles them.
 *
 * Dead only on evidence: when the host cannot be read (the process is out of file descriptors,
 * /proc refuses it) the record stays as it is, nothing is removed, and why is reported; the next
 * reconcile (the daemon's next tick, the next command) tries again. The owners of 'creating' and
 * 'removing' records are judged the same way (ownerAlive: alive unless known gone).
 */
export async function reconcile(ctx: LabContext, s: SandboxRecord): Promise<SandboxRecord> {
  let reason: string | undefined;
  if (s.state === 'running' || s.state === 'paused') {
    const r = await ctx.driver(s.driver).inspect(handleOf(s));
    if (r.state === 'unknown') return cannotTell(s, r.reason);
    if (r.state === 'dead') reason = r.reason;
    // a pool's template VM lives only while the process making the template does
    if (!reason && s.templateOf && s.owner?.op === 'hold' && !(await ownerAlive(s.owner)))
      reason = "the process making its pool's template exited";
  } else if (s.state === 'creating' || s.state === 'removing') {
    if (!(await ownerAlive(s.owner))) {
      // an interrupted start leaves the machine stopped, as it was before (start.ts)
      reason =
        s.state === 'removing'
          ? 'removal was interrupted'
          : s.owner?.op === 'start'
            ? STOPPED
            : 'creation was interrupted (the process creating it exited)';
    }
  }
  if (reason === undefined) return s;
  // compare and set: a create may have finished (or an rm begun) since `s` was read; then the
  // record is not this call's to kill
  if (!ctx.store.markDead(s, reason)) {
    const now = ctx.store.getSandbox(s.id);
    return now && now.id === s.id ? now : { ...s, state: 'dead', reason: 'removed meanwhile' };
  }
  const reaped = await reap(ctx, s, reason);
  if (reaped !== reason) ctx.store.setDeadReason(s.id, reaped);
  return { ...s, state: 'dead', reason: reaped, uidBase: ctx.store.getSandbox(s.id)?.uidBase ?? null };
}

/** A record whose machine cannot be told alive or dead: kept as it is, and why reported. */
function cannotTell(s: SandboxRecord, why: string): SandboxRecord {
  recordFailure(`reconcile ${s.name} (kept as ${s.state})`, new SnaplabError('HOST_UNREADABLE', why));
  return s;
}

/**
 * Kill what is left of a dead sandbox's machine; the reason, with what could not be done. Once its
 * cgroup is empty no process holds its user namespace range: the range is free again.
 */
async function reap(ctx: LabContext, s: SandboxRecord, reason: string): Promise<string> {
  try {
    await ctx.driver(s.driver).destroy(handleOf(s));
    // a stopped machine keeps its range for its next start (stopped.ts)
    if (s.uidBase !== null && s.scenario === null && reason !== STOPPED) {
      ctx.store.clearUidBase(s.id);
      await releaseRange(s.uidBase, ctx.home, s.id, s.ids ?? null);
    }
    return reason;
  } catch (e) {
    return `${reason}; its processes could not all be stopped (${(e as Error).message}): run \`snaplab gc\``;
  }
}
