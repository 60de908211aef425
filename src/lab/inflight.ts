import { randomBytes } from 'node:crypto';
import { pidAlive } from '../host/procs.js';
import type { LabContext } from './context.js';

/** The mark gc's volume collection holds (a row of the same table, of kind `gc`). */
const GC = 'gc';

/**
 * Mark an operation that makes volumes (clone, snapshot, import) as in flight for its duration.
 * A volume exists on disk a moment before a record names it; gc skips volume collection while
 * any such operation of a live process is running, so it never takes a volume being made.
 *
 * Both sides write their mark first and look for the other's second (the store serializes the
 * two), so at least one sees the other: gc leaves volumes alone, or the operation waits for gc's
 * collection to end before it makes anything. (Marking alone left a window: an operation that
 * began after gc's look had its new volume collected; the soak found it.)
 */
export async function inflight<T>(ctx: LabContext, kind: string, fn: () => Promise<T>): Promise<T> {
  const id = randomBytes(6).toString('hex');
  ctx.store.beginInflight(id, kind);
  try {
    await gcDone(ctx);
    return await fn();
  } finally {
    ctx.store.endInflight(id);
  }
}

/** Wait while a live process's gc collects volumes (never long: it skips the busy). */
async function gcDone(ctx: LabContext): Promise<void> {
  for (;;) {
    let collecting = false;
    for (const op of ctx.store.listInflight()) {
      if (op.kind !== GC) continue;
      if (await pidAlive(op.pid)) collecting = true;
      else ctx.store.endInflight(op.id);
    }
    if (!collecting) return;
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Operations of live processes that are making volumes now; rows of dead processes are dropped. */
export async function liveInflight(ctx: LabContext): Promise<string[]> {
  const live: string[] = [];
  for (const op of ctx.store.listInflight()) {
    if (op.kind === GC) continue;
    if (await pidAlive(op.pid)) live.push(`${op.kind} by pid ${op.pid}`);
    else ctx.store.endInflight(op.id);
  }
  return live;
}

/**
 * Run gc's volume collection under its mark: `fn` gets whether volumes may be collected (no
 * volume-making operation was in flight once the mark was down), or the list of those in flight.
 */
export async function collecting<T>(ctx: LabContext, fn: (busy: string[]) => Promise<T>): Promise<T> {
  const id = randomBytes(6).toString('hex');
  ctx.store.beginInflight(id, GC);
  try {
    return await fn(await liveInflight(ctx));
  } finally {
    ctx.store.endInflight(id);
  }
}
