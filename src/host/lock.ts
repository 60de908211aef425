import { mkdir, open, readFile, stat, unlink } from 'node:fs/promises';
import { dirname } from 'node:path';
import { SnaplabError } from '../errors.js';
import { noted, orElse } from '../cleanup.js';

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
};

/**
 * Remove a stale lock (its holder `dead` is gone), under a second lock: two waiters that both saw
 * the dead holder must not both unlink, or the second would remove the first's fresh lock. The
 * second lock is held for a few syscalls; one older than 5 s is from a process that died there.
 */
async function takeOver(path: string, dead: number): Promise<void> {
  const guard = `${path}.takeover`;
  try {
    await (await open(guard, 'wx')).close();
  } catch {
    const age = await stat(guard).then(
      (st) => Date.now() - st.mtimeMs,
      () => 0,
    );
    if (age > 5000) await unlink(guard).catch(noted(`remove stale lock guard ${guard}`, 'ENOENT'));
    return; // someone else is taking it over: try the lock again
  }
  try {
    const now = Number(await readFile(path, 'utf8').catch(orElse('', 'readFile', 'ENOENT')));
    // still the stale one (an empty one must still be old: a new holder may be between open and write)
    const old =
      now > 0 ||
      (await stat(path).then(
        (st) => Date.now() - st.mtimeMs > 5000,
        () => false,
      ));
    if (now === dead && old) await unlink(path).catch(noted(`remove dead lock ${path}`, 'ENOENT'));
  } finally {
    await unlink(guard).catch(noted(`remove lock guard ${guard}`, 'ENOENT'));
  }
}

/**
 * Run `fn` holding an exclusive lock file (O_EXCL create, holder's pid inside). Serialises steps
 * that check-then-act on host state (is the pool mounted? mount it) across processes and across
 * concurrent calls in one process. A lock left by a dead process is taken over.
 */
export async function withLock<T>(path: string, fn: () => Promise<T>, timeoutMs = 60_000): Promise<T> {
  await mkdir(dirname(path), { recursive: true });
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const fh = await open(path, 'wx');
      await fh.writeFile(String(process.pid));
      await fh.close();
      break;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
      const pid = Number(await readFile(path, 'utf8').catch(orElse('', 'readFile', 'ENOENT')));
      // An empty file is a holder between open and write: give it a few seconds, then it is a
      // holder that died there.
      const age =
        pid > 0
          ? 0
          : await stat(path).then(
              (st) => Date.now() - st.mtimeMs,
              () => 0,
            );
      if ((pid > 0 && !alive(pid)) || age > 5000) {
        await takeOver(path, pid);
        continue;
      }
      if (Date.now() > deadline) {
        throw new SnaplabError(
          'TIMEOUT',
          `lock ${path} held by pid ${pid || '?'}`,
          `if no snaplab process runs, rm ${path}`,
          { cause: e },
        );
      }
      await new Promise((r) => setTimeout(r, 10 + Math.random() * 20));
    }
  }
  try {
    return await fn();
  } finally {
    await unlink(path).catch(noted(`release lock ${path}`, 'ENOENT'));
  }
}
