import { spawnSync } from 'node:child_process';
import { join } from 'node:path';

/**
 * The `snaplab` command as a user runs it: native/build/snaplab, which set-up links from
 * /usr/local/bin (exec's fast path in C, every other command the Node CLI in dist/bin).
 */
export const SNAPLAB = join(import.meta.dirname, '..', 'native', 'build', 'snaplab');

/**
 * Run `snaplab ARGS` in a private mount namespace after the shell command `setup` (its mounts are
 * that namespace's alone: the host's stay as they are).
 */
export function snaplabInPrivateMounts(
  setup: string,
  args: string[],
  env: NodeJS.ProcessEnv,
): { status: number | null; stdout: string; stderr: string } {
  const quoted = args.map((a) => `'${a.replace(/'/g, `'\\''`)}'`).join(' ');
  const r = spawnSync(
    'unshare',
    ['-m', '--propagation', 'private', 'sh', '-c', `${setup} && exec ${SNAPLAB} ${quoted}`],
    {
      env,
      encoding: 'utf8',
      timeout: 120_000,
    },
  );
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/**
 * Run `snaplab ARGS` as on a stock Debian or Ubuntu host, whose /dev is mounted nosuid (this
 * project's machines mount it without): in a private mount namespace where /dev is remounted so.
 * A flag locked that way inside a user namespace must be kept by every remount there.
 */
export const snaplabWithNosuidDev = (
  args: string[],
  env: NodeJS.ProcessEnv,
): ReturnType<typeof snaplabInPrivateMounts> =>
  snaplabInPrivateMounts(
    "mount -o remount,bind,nosuid /dev && grep -q ' /dev .*nosuid' /proc/self/mountinfo",
    args,
    env,
  );
