import { randomBytes } from 'node:crypto';
import { pidAlive } from '../host/procs.js';
import type { LabContext } from './context.js';

/**
 * Mark an operation that makes volumes (clone, snapshot, import) as in flight for its duration.
 * A volume exists on disk a moment before a record names it; gc skips volume collection while
 * any such operation of a live process is running, so it never takes a volume being made.
 */
export async function inflight<T>(ctx: LabContext, kind: string, fn: () => Promise<T>): Promise<T> {
  const id = randomBytes(6).toString('hex');
  ctx.store.beginInflight(id, kind);
  try {
    return await fn();
  } finally {
    ctx.store.endInflight(id);
  }
}

/** Operations of live processes that are making volumes now; rows of dead processes are dropped. */
export async function liveInflight(ctx: LabContext): Promise<string[]> {
  const live: string[] = [];
  for (const op of ctx.store.listInflight()) {
    if (await pidAlive(op.pid)) live.push(`${op.kind} by pid ${op.pid}`);
    else ctx.store.endInflight(op.id);
  }
  return live;
}
