import { close as fsClose, constants, open as fsOpen, read as fsRead, readFileSync, write as fsWrite } from 'node:fs';
import { SnaplabError } from '../../errors.js';

/** Small helpers for cgroupfs files: tolerant reads, errno-aware errors, short polls. */

export function errno(e: unknown): string | undefined {
  return (e as NodeJS.ErrnoException | undefined)?.code;
}

/**
 * readText at once, for a counter read on a command's path (the OOM kills before a command in a
 * sandbox with a memory limit, and after one that ended in SIGKILL): ~13 µs here, where the thread pool's round trips took ~120 µs on an idle daemon and
 * milliseconds behind a busy event loop. A cgroupfs file never waits on a disk, so the event loop
 * is held no longer than the read.
 */
export function readTextNow(path: string): string | undefined {
  try {
    return readFileSync(path, 'utf8');
  } catch (e) {
    const code = errno(e);
    if (code === 'ENOENT' || code === 'ENODEV') return undefined;
    throw cgError(`cannot read ${path}`, e);
  }
}

/**
 * File contents, or undefined when the file (or its cgroup) does not exist. Open, read, close
 * by hand: fs.promises.readFile also fstats and reads again to find EOF, and every call is a
 * thread-pool round trip (~0.05-0.1 ms) while the pseudo-file itself answers in microseconds.
 * A short read ends a seq_file, so one read is enough for every cgroup file but a huge procs.
 */
export function readText(path: string): Promise<string | undefined> {
  return new Promise((resolve, reject) => {
    fsOpen(path, 'r', (e, fd) => {
      if (e) {
        if (e.code === 'ENOENT' || e.code === 'ENODEV') return resolve(undefined);
        return reject(cgError(`cannot read ${path}`, e));
      }
      const chunks: Buffer[] = [];
      const step = (): void => {
        const buf = Buffer.allocUnsafe(CHUNK);
        fsRead(fd, buf, 0, CHUNK, null, (e2, n) => {
          if (e2) {
            fsClose(fd, () => undefined);
            return e2.code === 'ENODEV' ? resolve(undefined) : reject(cgError(`cannot read ${path}`, e2));
          }
          chunks.push(buf.subarray(0, n));
          if (n === CHUNK) return step();
          fsClose(fd, () => undefined); // nothing to learn from closing a pseudo-file
          resolve(Buffer.concat(chunks).toString('utf8'));
        });
      };
      step();
    });
  });
}
const CHUNK = 64 * 1024;

/** Write a cgroupfs file: the kernel takes (or refuses) the value in write(2) itself. */
export function writeText(path: string, text: string): Promise<void> {
  return new Promise((resolve, reject) => {
    fsOpen(path, constants.O_WRONLY, (e, fd) => {
      if (e) return reject(e);
      fsWrite(fd, text, (e2) => {
        fsClose(fd, () => undefined);
        if (e2) reject(e2);
        else resolve();
      });
    });
  });
}

/** The number after `key` in "key value" lines (memory.events, cpu.stat, memory.oom_control). */
export function keyed(text: string | undefined, key: string): number | undefined {
  if (text === undefined) return undefined;
  const m = new RegExp(`^${key} (\\d+)$`, 'm').exec(text);
  return m ? Number(m[1]) : undefined;
}

export function parseNumber(text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  const n = Number(text.trim());
  return Number.isFinite(n) ? n : undefined;
}

export function cgError(message: string, e?: unknown): SnaplabError {
  const code = errno(e);
  const hint =
    code === 'EACCES' || code === 'EPERM' || code === 'EROFS'
      ? 'cgroups need root and a writable cgroup filesystem: run snaplab as root'
      : code === 'EBUSY'
        ? 'processes are still in it; run snaplab gc'
        : undefined;
  const detail = e instanceof Error ? `: ${e.message}` : '';
  return new SnaplabError('CGROUP_FAILED', message + detail, hint, { cause: e });
}

/**
 * Call `check` until it is true or `timeoutMs` passes. For the first 3 ms it re-checks on the
 * next turn of the event loop (a check is a cgroupfs read, ~0.1 ms through the thread pool; a
 * freeze or a killed process's exit settles in about a millisecond), then backs off to 20 ms.
 */
export async function poll(check: () => Promise<boolean>, timeoutMs: number): Promise<boolean> {
  const start = performance.now();
  for (let backoff = 1; ; ) {
    if (await check()) return true;
    const elapsed = performance.now() - start;
    if (elapsed >= timeoutMs) return false;
    await (elapsed < 3
      ? new Promise((r) => setImmediate(r))
      : new Promise((r) => setTimeout(r, (backoff = Math.min(backoff * 2, 20)))));
  }
}
