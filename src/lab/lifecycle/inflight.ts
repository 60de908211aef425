import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { recordFailure } from '../../cleanup.js';
import { SnaplabError, isSnaplabError } from '../../errors.js';
import { readStat } from '../../host/procs.js';
import type { LabContext } from '../context.js';
import { handleOf } from './handle.js';
import { underStateLock } from './stopped.js';

/** The mark gc's volume collection holds (a row of the same table, of kind `gc`). */
const GC = 'gc';
/** gc marks this process holds now: a row of this pid not among them was left by a failure */
const held = new Set<string>();
/** Longest wait for another gc's collection: far above any real one; then a clear error. */
const GC_WAIT_MS = 120_000;

let bootMs: number | undefined;
/** When a process started (ms since the epoch), from /proc: to tell a reused pid from the marker. */
async function startedAt(pid: number): Promise<number | undefined> {
  const st = await readStat(pid);
  if (!st || st.state === 'Z' || st.state === 'X') return undefined;
  bootMs ??= Number(/^btime (\d+)$/m.exec(readFileSync('/proc/stat', 'utf8'))?.[1] ?? 0) * 1000;
  return bootMs + st.startTime * 10; // USER_HZ is 100 on Linux
}

/**
 * Is the process that wrote a mark at `markedAt` still running? Not when its pid is gone, nor
 * when the pid now belongs to a process started after the mark (a reuse), nor when it is this
 * process and the mark is not one it holds (a mark whose removal failed).
 */
async function markLive(op: { id: string; pid: number; kind: string; startedAt: number }): Promise<boolean> {
  if (op.pid === process.pid)
    return op.kind === GC ? held.has(op.id) : op.kind.startsWith(FREEZE) ? heldFreezes.has(op.id) : true;
  let t: number | undefined;
  try {
    t = await startedAt(op.pid);
  } catch (e) {
    // /proc could not be read (EMFILE, EACCES): its writer may run, so its mark holds
    recordFailure(`check the ${op.kind} mark of pid ${op.pid} (kept)`, e);
    return true;
  }
  return t !== undefined && t <= op.startedAt + 2000; // btime and USER_HZ round: 2 s of slack
}

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
  const until = Date.now() + GC_WAIT_MS;
  for (;;) {
    let by: number | undefined;
    for (const op of ctx.store.listInflight()) {
      if (op.kind !== GC) continue;
      if (await markLive(op)) by = op.pid;
      else ctx.store.endInflight(op.id);
    }
    if (by === undefined) return;
    if (Date.now() > until)
      throw new SnaplabError(
        'TIMEOUT',
        `gc (pid ${by}) has been collecting volumes for over ${GC_WAIT_MS / 1000} s`,
        'wait for it, or stop it if it hangs; then try again',
      );
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Operations of live processes that are making volumes now; rows of dead processes are dropped. */
export async function liveInflight(ctx: LabContext): Promise<string[]> {
  const live: string[] = [];
  for (const op of ctx.store.listInflight()) {
    // a freeze mark makes no volume; a dead one's machine is thawOrphans' to thaw
    if (op.kind === GC || op.kind.startsWith(FREEZE)) continue;
    if (await markLive(op)) live.push(`${op.kind} by pid ${op.pid}`);
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
  held.add(id);
  ctx.store.beginInflight(id, GC);
  try {
    return await fn(await liveInflight(ctx));
  } finally {
    held.delete(id); // first: were the row's removal to fail, it is stale at once
    ctx.store.endInflight(id);
  }
}

/**
 * The mark a snapshot holds while it has a machine frozen (`freezeMark`): a process killed between
 * its freeze and its thaw leaves it, and the machine frozen while its record says running (its
 * `exec` hangs, nothing is declared). `thawOrphans` thaws such a machine once the mark's process is
 * gone: the evidence is the mark, never the frozen state alone (a pause is frozen too).
 */
const FREEZE = 'freeze ';

/** freeze marks this process holds now: one of this pid not among them was left by a failed thaw */
const heldFreezes = new Set<string>();

/**
 * Mark `sandbox` frozen by this process (under its state lock, before the freeze) until the
 * returned release: `thawed` false (the thaw failed) leaves the mark, as a killed process's is, for
 * thawOrphans to try again, in this process too.
 */
export function freezeMark(ctx: LabContext, sandbox: string): (thawed: boolean) => void {
  const id = randomBytes(6).toString('hex');
  ctx.store.beginInflight(id, `${FREEZE}${sandbox}`);
  heldFreezes.add(id);
  return (thawed) => {
    heldFreezes.delete(id);
    if (thawed) ctx.store.endInflight(id);
  };
}

/**
 * Thaw the machines (all, or `only` one) frozen by a snapshot that ended before its thaw: every
 * freeze mark of the machine is a dead process's (or a failed thaw's), none live (a snapshot
 * freezing it now thaws it itself). Under the machine's state lock, as a pause or a snapshot is
 * (a short wait: one under way, it is the next look's), and only if its record still says running
 * (a pause is the user's); `only.locked`: the caller holds that lock (resume). Each mark is dropped
 * once dealt with. The names of those thawed.
 */
export async function thawOrphans(ctx: LabContext, only?: { id: string; locked?: boolean }): Promise<string[]> {
  const thawed: string[] = [];
  const bySandbox = new Map<string, ReturnType<LabContext['store']['listInflight']>>();
  for (const op of ctx.store.listInflight()) {
    if (!op.kind.startsWith(FREEZE)) continue;
    const id = op.kind.slice(FREEZE.length);
    if (only !== undefined && id !== only.id) continue;
    bySandbox.set(id, [...(bySandbox.get(id) ?? []), op]);
  }
  for (const [id, marks] of bySandbox) {
    if ((await Promise.all(marks.map(markLive))).some(Boolean)) continue;
    const drop = (): void => {
      for (const op of marks) ctx.store.endInflight(op.id);
    };
    const s = ctx.store.getSandbox(id);
    if (!s || s.id !== id) {
      drop();
      continue;
    }
    const thaw = async (): Promise<void> => {
      if (s.state === 'running') {
        await ctx.driver(s.driver).resume(handleOf(s));
        thawed.push(s.name);
      }
      drop();
    };
    try {
      if (only?.locked) await thaw();
      else await underStateLock(ctx, s, thaw, 200);
    } catch (e) {
      // its lock busy (a pause, a snapshot under way): the next look's; the machine gone meanwhile:
      // nothing to thaw; else the marks stay for the next look
      if (isSnaplabError(e, 'SANDBOX_NOT_FOUND')) drop();
      else if (!isSnaplabError(e, 'TIMEOUT'))
        recordFailure(`thaw ${s.name}, frozen by a snapshot that ended before its thaw`, e);
    }
  }
  return thawed;
}
