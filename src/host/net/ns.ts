import { readdir, stat, statfs, unlink, writeFile } from 'node:fs/promises';
import { bindMount, unmount } from '../mounts.js';
import { SnaplabError } from '../../errors.js';
import { run, type RunResult } from '../run.js';
import { NET_GROUP, NETNS_DIR, NETNS_PREFIX, checkNetnsName, netnsPath } from './names.js';
import { handledElsewhere, noted, orElse } from '../../cleanup.js';

/**
 * Run several `ip` commands in one process inside a namespace (`ip -n NS -batch -`): a spawn costs
 * milliseconds, a line in a batch microseconds. Stops at the first failing line unless `force`.
 * Never throws for a failing line: the caller reads `code` and `stderr` ("Command failed -:LINE").
 */
export async function ipBatch(netns: string, lines: string[], opts: { force?: boolean } = {}): Promise<RunResult> {
  const args = ['-n', netns, ...(opts.force ? ['-force'] : []), '-batch', '-'];
  return run('ip', args, { input: `${lines.join('\n')}\n`, allowFail: true });
}

/**
 * The first `ip netns add` on a host turns /run/netns into a shared bind mount of itself; two doing
 * that at once can stack two mounts and hide namespaces under the upper one. So the first creation
 * in this process runs alone and the rest, once it is done, in parallel.
 */
let firstCreate: Promise<unknown> | undefined;

export async function createNetns(name: string): Promise<string> {
  checkNetnsName(name);
  if (firstCreate) await firstCreate.catch(handledElsewhere);
  const adding = run('ip', ['netns', 'add', name], { allowFail: true });
  firstCreate ??= adding;
  const res = await adding;
  if (res.code !== 0) {
    const exists = /File exists/i.test(res.stderr);
    throw new SnaplabError(
      'HOST_COMMAND_FAILED',
      `cannot create network namespace ${name}: ${res.stderr.trim()}`,
      exists
        ? `a namespace of that name is left over: remove it with \`ip netns del ${name}\` (or \`snaplab gc\`), or pick another name`
        : 'snaplab needs root and iproute2 (`apt-get install iproute2`); `snaplab doctor` checks networking',
    );
  }
  try {
    await run('ip', ['-n', name, 'link', 'set', 'lo', 'up']);
  } catch (e) {
    await deleteNetns(name).catch(noted(`delete network namespace ${name}`));
    throw e;
  }
  return netnsPath(name);
}

/**
 * Remove a namespace and every link snaplab made in it. The links go first, explicitly: a namespace
 * is only torn down (asynchronously) once nothing holds it, and until then its veths would keep
 * their names taken in the bridge's namespace. Idempotent.
 */
export async function deleteNetns(name: string): Promise<void> {
  checkNetnsName(name);
  if (!(await listSnaplabNetns()).includes(name)) return;
  // Fails harmlessly when no link of ours is left ("No such device").
  await run('ip', ['-n', name, 'link', 'del', 'group', String(NET_GROUP)], { allowFail: true });
  const res = await run('ip', ['netns', 'del', name], { allowFail: true });
  if (res.code !== 0 && !/No such file/i.test(res.stderr)) {
    throw new SnaplabError(
      'HOST_COMMAND_FAILED',
      `cannot delete network namespace ${name}: ${res.stderr.trim()}`,
      `see what still uses it with \`ip netns pids ${name}\`; \`ip netns del ${name}\` removes it`,
    );
  }
}

/**
 * Create several namespaces with one spawn (`ip -batch -`), loopback left down: for `wire`, which
 * brings it up in the batch it runs in each namespace anyway. All or nothing.
 */
export async function createNetnsBatch(names: string[]): Promise<void> {
  names.forEach(checkNetnsName);
  if (!names.length) return;
  if (firstCreate) await firstCreate.catch(handledElsewhere);
  const adding = run('ip', ['-batch', '-'], { input: names.map((n) => `netns add ${n}\n`).join(''), allowFail: true });
  firstCreate ??= adding;
  const res = await adding;
  if (res.code === 0) return;
  // The batch stopped at the failing line: the ones before it are ours to remove.
  const line = Number(/Command failed -:(\d+)/.exec(res.stderr)?.[1] ?? names.length + 1);
  const name = names[line - 1] ?? names.join(', ');
  for (const n of names.slice(0, line - 1)) await deleteNetns(n).catch(noted(`delete network namespace ${n}`));
  throw new SnaplabError(
    'HOST_COMMAND_FAILED',
    `cannot create network namespace ${name}: ${res.stderr.trim().split('\n')[0]}`,
    /File exists/i.test(res.stderr)
      ? `a namespace of that name is left over: remove it with \`ip netns del ${name}\` (or \`snaplab gc\`)`
      : 'snaplab needs root and iproute2 (`apt-get install iproute2`); `snaplab doctor` checks networking',
  );
}

/** Names under /run/netns that start with snaplab-: what is left after a crash is found here. */
export async function listSnaplabNetns(): Promise<string[]> {
  try {
    return (await readdir(NETNS_DIR)).filter((n) => n.startsWith(NETNS_PREFIX)).sort();
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw e;
  }
}

/** Run argv inside the namespace (`ip netns exec`), e.g. a ping in tests or a probe. */
export function runIn(
  netns: string,
  argv: string[],
  opts: { timeoutMs?: number; allowFail?: boolean } = {},
): Promise<RunResult> {
  checkNetnsName(netns);
  if (!argv.length)
    throw new SnaplabError('BAD_INPUT', 'runIn needs a command', 'pass argv, e.g. ["busybox", "ping", "-c1", ADDRESS]');
  return run('ip', ['netns', 'exec', netns, ...argv], { timeoutMs: opts.timeoutMs, allowFail: opts.allowFail });
}

/** statfs's type of a namespace file (`/proc/PID/ns/net`, or one bound under /run/netns). */
const NSFS_MAGIC = 0x6e736673;
export const isNamespace = async (path: string): Promise<boolean> =>
  (await statfs(path).then(
    (s) => s.type,
    () => undefined,
  )) === NSFS_MAGIC;

/** Are two namespace files (bound names, or /proc/PID/ns/net) the same namespace? */
export async function sameNamespace(a: string, b: string): Promise<boolean> {
  const [x, y] = await Promise.all([stat(a), stat(b)]);
  return x.ino === y.ino && x.dev === y.dev;
}

/**
 * Give network namespace `from` the name `to`: its file bound at /run/netns/TO, then unbound from
 * FROM. Nothing in the namespace notices (a process holds its namespace, not its name), so a
 * scenario's standby networks become its live ones in a few syscalls. Finishes a rename that was
 * interrupted (TO bound to the same namespace already, or an empty TO left); refuses to cover a
 * different namespace named TO.
 */
export async function renameNetns(from: string, to: string): Promise<void> {
  const src = netnsPath(from);
  const dst = netnsPath(to);
  if (!(await isNamespace(src))) {
    if (await isNamespace(dst)) {
      // renamed already; a rename killed between its unmount and its unlink left FROM empty
      await unlink(src).catch(orElse(undefined, `unlink ${src}`, 'ENOENT'));
      return;
    }
    throw new SnaplabError(
      'HOST_COMMAND_FAILED',
      `cannot rename network namespace ${from}: there is none`,
      '`snaplab gc` removes what a scenario left half made',
    );
  }
  if (await isNamespace(dst)) {
    if (!(await sameNamespace(src, dst)))
      throw new SnaplabError(
        'HOST_COMMAND_FAILED',
        `cannot rename network namespace ${from} to ${to}: ${to} exists`,
        `\`ip netns del ${to}\` if nothing of snaplab's uses it, or \`snaplab gc\``,
      );
  } else {
    await writeFile(dst, '', { flag: 'a', mode: 0o444 });
    await bindMount(src, dst);
  }
  await unmount(src, { lazy: true });
  await unlink(src).catch(orElse(undefined, `unlink ${src}`, 'ENOENT'));
}
