/**
 * Many sandboxes at once, made or removed through any LabApi (the embedded lab, a daemon's client,
 * a keyed lab): the CLI's `create --count` and `rm --all/--label`, the density bench's fill and a
 * library's caller share these. Each runs `parallel` calls at a time (a create or a destroy waits on
 * the kernel, mounts and cgroups, more than on a core) and tells its progress at most once every
 * `everyMs`. Through a daemon each is one request of the API's own (POST or DELETE /sandboxes):
 * its quotas, scopes and events apply to every one.
 */
import { SnaplabError, isSnaplabError } from '../errors.js';
import type { LabApi, LabCreateOptions, SandboxApi } from './api.js';
import type { TraceSummary } from '../timing/trace.js';
import { mapLimit } from '../concurrency.js';
import { NAME } from '../lab/names.js';

/** what a bulk call has done so far */
export interface BulkProgress {
  done: number;
  failed: number;
  total: number;
  /** done per second since it began */
  perSecond: number;
}

export interface BulkOptions {
  /** calls in flight (default 8) */
  parallel?: number;
  onProgress?: (p: BulkProgress) => void;
  /** at most one progress call this often (default 1000 ms): a bulk call shorter than that tells none */
  everyMs?: number;
  /** stop starting more; what was begun ends, and a create removes what it made */
  signal?: AbortSignal;
}

/** the most one bulk create makes: ten times this host's 10 000 (docs/benchmarks.md "Density"); more is a typo */
export const BULK_MAX = 100_000;
/** calls in flight unless asked (the CLI's `create --count`, `rm --all`; the density bench's fill) */
export const DEFAULT_PARALLEL = 8;
/** calls in flight at most: past a few per core they only queue on the kernel's locks */
export const PARALLEL_MAX = 64;

/** `parallel` checked: a whole number from 1 to PARALLEL_MAX (default DEFAULT_PARALLEL) */
function parallelOf(o: BulkOptions): number {
  const p = o.parallel ?? DEFAULT_PARALLEL;
  if (!Number.isInteger(p) || p < 1 || p > PARALLEL_MAX)
    throw new SnaplabError(
      'BAD_INPUT',
      `${String(p)} calls in flight`,
      `parallel: a whole number from 1 to ${PARALLEL_MAX}`,
    );
  return p;
}

/**
 * Runs `work` on 0..total-1, `parallel` at a time (mapLimit), telling progress; `stop` ends the
 * starting of more (those not begun are skipped). `work` never throws: it says whether it did.
 * A progress callback that throws stops it too: its error is returned (never thrown from a
 * worker, which would leave the others running and their work undone).
 */
async function each(
  total: number,
  o: BulkOptions,
  work: (i: number) => Promise<boolean>,
  stop: () => boolean,
): Promise<unknown> {
  const parallel = parallelOf(o);
  let told: unknown;
  const t0 = performance.now();
  let done = 0;
  let failed = 0;
  let shown = t0;
  const tell = (): void => {
    try {
      o.onProgress?.({
        done,
        failed,
        total,
        perSecond: Math.round((done / Math.max(1, performance.now() - t0)) * 10_000) / 10,
      });
    } catch (e) {
      told ??= e;
    }
  };
  const indices = Array.from({ length: total }, (_, i) => i);
  await mapLimit(indices, parallel, async (i) => {
    if (stop() || o.signal?.aborted || told !== undefined) return;
    if (await work(i)) done++;
    else failed++;
    if (performance.now() - shown >= (o.everyMs ?? 1000)) {
      shown = performance.now();
      tell();
    }
  });
  return told;
}

/** `count` checked: a whole number from 1 to BULK_MAX */
export function checkCount(count: number): void {
  if (!Number.isInteger(count) || count < 1 || count > BULK_MAX)
    throw new SnaplabError(
      'BAD_INPUT',
      `a count of ${JSON.stringify(count)} sandboxes`,
      `a whole number from 1 to ${BULK_MAX}`,
    );
}

/**
 * Make `count` sandboxes with the same options (a name, if given, is a prefix: NAME-1 … NAME-count,
 * also for a count of 1, so that a script's names do not depend on its count).
 * Each connection is closed as it is made (a library holds nothing of an idle sandbox; a call
 * opens one again). On the first failure, or an abort, no more are started; those begun finish,
 * and every one made is removed: it throws the first error, saying how many were made and removed.
 */
export async function createMany(
  lab: Pick<LabApi, 'create' | 'get'>,
  count: number,
  opts: LabCreateOptions = {},
  o: BulkOptions = {},
): Promise<SandboxApi[]> {
  checkCount(count);
  parallelOf(o);
  // the longest name, before any is made (a long prefix made 99 sandboxes, failed at NAME-100, and removed them)
  if (opts.name !== undefined) {
    const longest = `${opts.name}-${count}`;
    if (!NAME.test(longest))
      throw new SnaplabError(
        'BAD_NAME',
        `invalid sandbox names ${JSON.stringify(`${opts.name}-1`)} to ${JSON.stringify(longest)}`,
        'a prefix of letters, digits, ".", "_" or "-" (starting with a letter or digit) short enough that NAME-COUNT has at most 63',
      );
  }
  // by index, so that a caller gets them in order (NAME-1 first), however they finished
  const made: SandboxApi[] = [];
  let first: unknown;
  const told = await each(
    count,
    o,
    async (i) => {
      try {
        const box = await lab.create(opts.name ? { ...opts, name: `${opts.name}-${i + 1}` } : opts);
        box.close();
        made[i] = box;
        return true;
      } catch (e) {
        first ??= e;
        return false;
      }
    },
    () => first !== undefined,
  );
  first ??= told;
  const boxes = made.filter(Boolean);
  if (first === undefined && !o.signal?.aborted) return boxes;
  // (not given the signal: an abort's cleanup is not itself aborted; one skipped as busy is left)
  const busy: string[] = [];
  const left = await removeMany(lab, boxes, { parallel: o.parallel, onSkipped: (name) => busy.push(name) }).then(
    () => busy,
    (e: unknown) => [...busy, ...(e instanceof BulkError ? e.failed.map((f) => f.name) : boxes.map((b) => b.name))],
  );
  const cause =
    first ??
    (o.signal?.reason instanceof SnaplabError
      ? o.signal.reason
      : new SnaplabError('ABORTED', 'the create was interrupted', 'run it again'));
  const why = cause instanceof Error ? cause.message : String(cause);
  if (left.length)
    throw new LeftError(
      isSnaplabError(cause) ? cause.code : 'INTERNAL',
      `${boxes.length} made, ${left.length} of them not removed (${left.slice(0, 5).join(', ')}${left.length > 5 ? ', …' : ''}): ${why}`,
      `remove them: \`snaplab rm ${left.slice(0, 5).join(' ')}${left.length > 5 ? ' …' : ''}\` (or \`snaplab gc\`)`,
      left,
      cause,
    );
  throw new SnaplabError(
    isSnaplabError(cause) ? cause.code : 'INTERNAL',
    `${boxes.length === 0 ? 'no sandbox made' : `the ${boxes.length} made were removed`}: ${why}`,
    isSnaplabError(cause) ? cause.hint : 'run it again',
    { cause },
  );
}

/**
 * A bulk create that failed and could not remove all it made: every one left by name (`left`; the
 * message names five), so that a script finds thousands (`create --count` prints them on stdout).
 */
export class LeftError extends SnaplabError {
  constructor(
    code: SnaplabError['code'],
    message: string,
    hint: string,
    readonly left: string[],
    cause: unknown,
  ) {
    super(code, message, hint, { cause });
  }

  override toJSON(): ReturnType<SnaplabError['toJSON']> & { left: string[] } {
    return { ...super.toJSON(), left: this.left };
  }
}

/** A bulk removal that left some: which, and why (the error is its first's code and hint). */
export class BulkError extends SnaplabError {
  constructor(
    readonly removed: string[],
    readonly failed: { name: string; error: unknown }[],
    total: number,
    /** not begun: the removal was interrupted (an abort, a progress callback that threw) */
    readonly notBegun = 0,
    /** why, when none failed (ABORTED: interrupted) */
    reason?: SnaplabError,
  ) {
    const first = failed[0]?.error ?? reason;
    super(
      isSnaplabError(first) ? first.code : 'INTERNAL',
      `${failed.length + notBegun} of ${total} sandboxes not removed (${removed.length} removed${notBegun ? `; ${notBegun} not begun: interrupted` : ''}): ${
        failed.length
          ? failed
              .slice(0, 5)
              .map((f) => `${f.name}: ${f.error instanceof Error ? f.error.message : String(f.error)}`)
              .join('; ')
          : (reason?.message ?? 'interrupted')
      }`,
      isSnaplabError(first) ? first.hint : 'run the command again; `snaplab gc` removes what a failed removal left',
      { cause: first },
    );
  }
}

/**
 * Destroy these sandboxes, reading each again first (the list may be minutes old: a stale record
 * is not removed twice). One removed by someone else meanwhile is skipped (it is gone, as asked),
 * and one still being made by a process that runs (SANDBOX_BUSY: `onSkipped` is told);
 * other failures do not stop the rest and are thrown at the end (BulkError). An abort stops the
 * starting of more and throws ABORTED, saying how many are left. Returns the names removed;
 * `onTrace` gets each destroy's trace.
 */
export async function removeMany(
  lab: Pick<LabApi, 'get'>,
  boxes: Pick<SandboxApi, 'id' | 'name'>[],
  o: BulkOptions & {
    onTrace?: (t: TraceSummary | undefined) => void;
    /** one skipped: still being created or started by a process that runs (SANDBOX_BUSY) */
    onSkipped?: (name: string, why: SnaplabError) => void;
  } = {},
): Promise<string[]> {
  const removed: string[] = [];
  const failed: { name: string; error: unknown }[] = [];
  let done = 0;
  const told = await each(
    boxes.length,
    o,
    async (i) => {
      const b = boxes[i]!;
      done++;
      let trace: TraceSummary | undefined;
      try {
        trace = await (await lab.get(b.id, { check: false })).destroy();
        removed.push(b.name);
      } catch (e) {
        // one being made is not removed under its maker (a pool's refill, another's create): skipped
        if (isSnaplabError(e, 'SANDBOX_BUSY')) {
          o.onSkipped?.(b.name, e);
          return true;
        }
        if (!isSnaplabError(e, 'SANDBOX_NOT_FOUND')) {
          failed.push({ name: b.name, error: e });
          return false;
        }
      }
      o.onTrace?.(trace);
      return true;
    },
    () => false,
  );
  if (failed.length) throw new BulkError(removed, failed, boxes.length, boxes.length - done);
  if (told !== undefined) throw told;
  // interrupted: what was removed by name (a caller says it), as when some failed
  if (done < boxes.length)
    throw new BulkError(
      removed,
      [],
      boxes.length,
      boxes.length - done,
      new SnaplabError('ABORTED', 'the removal was interrupted', 'run it again: one gone already is skipped'),
    );
  return removed;
}
