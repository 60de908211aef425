/**
 * `fn` over `xs`, at most `n` at once, the results in the order of `xs`. For work that opens files
 * per item (a cgroup's stats, a /proc read): Promise.all over 10 000 machines opened ~30 000 files
 * at once and met EMFILE (docs/benchmarks.md, "Density: the machine list and the node at 10 000").
 * The first failure is thrown once those begun have ended; no more are begun after it.
 */
export async function mapLimit<T, R>(xs: readonly T[], n: number, fn: (x: T) => Promise<R>): Promise<R[]> {
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`mapLimit: ${n} at once`);
  const out = new Array<R>(xs.length);
  let next = 0;
  let failed = false;
  let first: unknown;
  const worker = async (): Promise<void> => {
    while (next < xs.length && !failed) {
      const i = next++;
      try {
        out[i] = await fn(xs[i]!);
      } catch (e) {
        if (!failed) first = e;
        failed = true;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(n, xs.length)) }, worker));
  if (failed) throw first;
  return out;
}

/**
 * One run of `fn` at a time per key (a caller that comes while one runs joins it), each caller
 * waiting for it at most `waitMs`: a run that hangs delays its key's callers only, and they go on.
 */
export class OneAtATime {
  private readonly running = new Map<string, Promise<void>>();

  constructor(private readonly waitMs: number) {}

  async run(key: string, fn: () => Promise<void>): Promise<void> {
    let going = this.running.get(key);
    if (!going) {
      going = fn().finally(() => this.running.delete(key));
      this.running.set(key, going);
    }
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([going, new Promise<void>((r) => (timer = setTimeout(r, this.waitMs)))]);
    clearTimeout(timer);
  }
}
