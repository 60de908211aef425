/**
 * Stopped machines (`snaplab stop`, `snaplab start`): a record in state `dead` whose reason is
 * STOPPED keeps its volume, its user namespace range and its egress namespace (none holds a
 * process), so that `start` raises it again under the same id. There is no `stopped` state of its
 * own: nothing runs, which is what `dead` says everywhere (reconcile, gc, ls).
 */
import { join } from 'node:path';
import { SnaplabError } from '../../errors.js';
import { withLock } from '../../host/lock.js';
import type { SandboxRecord } from '../../store/records.js';
import type { LabContext } from '../context.js';

/** The reason a stopped machine's record carries; its filesystem is kept for `start`, `snapshot`, until rm. */
export const STOPPED = 'stopped (snaplab stop); its filesystem is kept: `snaplab start` runs it again';
/**
 * What a stop by snaplab before `start` existed wrote: that stop gave its user namespace range
 * back, so whether the machine ran in one cannot be told (it is not started; snapshot and restore).
 */
const STOPPED_BEFORE_START = 'stopped (snaplab stop); its filesystem is kept';

/** The reasons a stopped machine's record may carry (a list's `stopped` filters by them in SQL). */
export const STOPPED_REASONS: readonly string[] = [STOPPED, STOPPED_BEFORE_START];

export const isStopped = (s: Pick<SandboxRecord, 'state' | 'reason'>): boolean =>
  s.state === 'dead' && s.reason !== null && STOPPED_REASONS.includes(s.reason);

/**
 * Run `fn` holding the sandbox's state lock, with its record as it is now: pause, resume,
 * snapshot, stop and start each change what runs, and without the lock one could thaw what
 * another just froze, or start what another is stopping.
 */
export async function underStateLock<T>(
  ctx: LabContext,
  s: SandboxRecord,
  fn: () => Promise<T>,
  timeoutMs?: number,
): Promise<T> {
  return withLock(
    join(ctx.home, 'run', s.id, 'state.lock'),
    async () => {
      const fresh = ctx.store.getSandbox(s.id);
      if (!fresh)
        throw new SnaplabError(
          'SANDBOX_NOT_FOUND',
          `sandbox ${s.name} was removed meanwhile`,
          'list sandboxes with `snaplab ls`',
        );
      Object.assign(s, fresh);
      return fn();
    },
    timeoutMs,
  );
}

/** Refuse a stop of a machine that is stopped already. */
export function checkStoppable(s: SandboxRecord): void {
  if (isStopped(s))
    throw new SnaplabError(
      'SANDBOX_STOPPED',
      `sandbox ${s.name} is stopped already`,
      `start it with \`snaplab start ${s.name}\`, or remove it with \`snaplab rm ${s.name}\``,
    );
}

/** Refuse a start of anything but a stopped machine of its own (not a scenario's), saying why. */
export function checkStartable(s: SandboxRecord): void {
  if (s.state === 'running' || s.state === 'paused')
    throw new SnaplabError(
      'SANDBOX_RUNNING',
      `sandbox ${s.name} is ${s.state}: only a stopped machine is started`,
      s.state === 'paused'
        ? `resume it with \`snaplab resume ${s.name}\``
        : `stop it first (\`snaplab stop ${s.name}\`) to boot it afresh`,
    );
  if (!isStopped(s))
    throw new SnaplabError(
      'SANDBOX_DEAD',
      `sandbox ${s.name} is ${s.state}${s.reason ? ` (${s.reason})` : ''}: only a stopped machine is started`,
      `remove it with \`snaplab rm ${s.name}\` and create a new one`,
    );
  if (s.reason === STOPPED_BEFORE_START || s.scenario !== null)
    throw new SnaplabError(
      'BAD_INPUT',
      s.scenario !== null
        ? `sandbox ${s.name} is a machine of scenario ${s.scenario}: its scenario raises it`
        : `sandbox ${s.name} was stopped by an older snaplab, which gave its user namespace range back`,
      s.scenario !== null
        ? `reset the scenario (\`snaplab reset ${s.scenario}\`)`
        : `snapshot it (\`snaplab snapshot ${s.name} --name NAME\`) and restore that`,
    );
}
