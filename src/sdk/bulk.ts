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
const DEFAULT_PARALLEL = 8;

/** Runs `work` on 0..total-1, `parallel` at a time, telling progress; `stop` ends the starting of more. */
async function each(
  total: number,
  o: BulkOptions,
  work: (i: number) => Promise<boolean>,
  stop: () => boolean,
): Promise<void> {
  const t0 = performance.now();
  let next = 0;
  let done = 0;
  let failed = 0;
  let shown = t0;
  const tell = (): void =>
    o.onProgress?.({
      done,
      failed,
      total,
      perSecond: Math.round((done / Math.max(1, performance.now() - t0)) * 10_000) / 10,
    });
  const worker = async (): Promise<void> => {
    while (next < total && !stop() && !o.signal?.aborted) {
      if (await work(next++)) done++;
      else failed++;
      if (performance.now() - shown >= (o.everyMs ?? 1000)) {
        shown = performance.now();
        tell();
      }
    }
  };
  const parallel = Math.max(1, Math.min(o.parallel ?? DEFAULT_PARALLEL, total));
  await Promise.all(Array.from({ length: parallel }, worker));
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
 * Make `count` sandboxes with the same options (a name, if given, is a prefix: NAME-1 … NAME-count).
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
  // by index, so that a caller gets them in order (NAME-1 first), however they finished
  const made: SandboxApi[] = [];
  let first: unknown;
  await each(
    count,
    o,
    async (i) => {
      try {
        const box = await lab.create(opts.name && count > 1 ? { ...opts, name: `${opts.name}-${i + 1}` } : opts);
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
  const boxes = made.filter(Boolean);
  if (first === undefined && !o.signal?.aborted) return boxes;
  const left = await removeMany(lab, boxes, { parallel: o.parallel }).then(
    () => 0,
    (e: unknown) => (e instanceof BulkError ? e.failed.length : boxes.length),
  );
  const cause =
    first ??
    (o.signal?.reason instanceof SnaplabError
      ? o.signal.reason
      : new SnaplabError('ABORTED', 'the create was interrupted', 'run it again'));
  const undone = left
    ? `${boxes.length} made, ${left} of them not removed (\`snaplab gc\` or \`snaplab rm\` them)`
    : `the ${boxes.length} made were removed`;
  throw new SnaplabError(
    isSnaplabError(cause) ? cause.code : 'INTERNAL',
    `${boxes.length === 0 ? 'no sandbox made' : undone}: ${cause instanceof Error ? cause.message : String(cause)}`,
    isSnaplabError(cause) ? cause.hint : 'run it again',
    { cause },
  );
}

/** A bulk removal that left some: which, and why (the error is its first's code and hint). */
export class BulkError extends SnaplabError {
  constructor(
    readonly removed: string[],
    readonly failed: { name: string; error: unknown }[],
    total: number,
  ) {
    const first = failed[0]?.error;
    super(
      isSnaplabError(first) ? first.code : 'INTERNAL',
      `${failed.length} of ${total} sandboxes not removed (${removed.length} removed): ${failed
        .slice(0, 5)
        .map((f) => `${f.name}: ${f.error instanceof Error ? f.error.message : String(f.error)}`)
        .join('; ')}`,
      isSnaplabError(first) ? first.hint : 'run the command again; `snaplab gc` removes what a failed removal left',
      { cause: first },
    );
  }
}

/**
 * Destroy these sandboxes, reading each again first (the list may be minutes old: a stale record
 * is not removed twice). One removed by someone else meanwhile is skipped (it is gone, as asked);
 * other failures do not stop the rest and are thrown at the end (BulkError). Returns the names
 * removed; `onTrace` gets each destroy's trace.
 */
export async function removeMany(
  lab: Pick<LabApi, 'get'>,
  boxes: Pick<SandboxApi, 'id' | 'name'>[],
  o: BulkOptions & { onTrace?: (t: TraceSummary | undefined) => void } = {},
): Promise<string[]> {
  const removed: string[] = [];
  const failed: { name: string; error: unknown }[] = [];
  await each(
    boxes.length,
    o,
    async (i) => {
      const b = boxes[i]!;
      try {
        const t = await (await lab.get(b.id, { check: false })).destroy();
        o.onTrace?.(t);
        removed.push(b.name);
      } catch (e) {
        if (!isSnaplabError(e, 'SANDBOX_NOT_FOUND')) {
          failed.push({ name: b.name, error: e });
          return false;
        }
      }
      return true;
    },
    () => false,
  );
  if (failed.length) throw new BulkError(removed, failed, boxes.length);
  return removed;
}
