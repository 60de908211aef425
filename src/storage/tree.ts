import { randomBytes } from 'node:crypto';
import { readdir, readFile, rm, stat } from 'node:fs/promises';
import { SnaplabError } from '../errors.js';
import { run } from '../host/run.js';
import { mountsUnder } from './mounts.js';
import { orElse } from '../cleanup.js';

/** Volume ids: 12 hex digits, safe as file names and short enough for overlay's option string. */
export const newId = (): string => randomBytes(6).toString('hex');
export const isVolumeId = (name: string): boolean => /^[0-9a-f]{12}$/.test(name);

/**
 * Copy a tree keeping owners, modes, links, device nodes (overlay whiteouts) and xattrs (overlay's
 * opaque-dir marks). Reflinks make it near free on btrfs/xfs; elsewhere it is a real copy.
 */
export async function copyTree(src: string, dst: string): Promise<void> {
  await run('cp', ['-a', '--reflink=auto', '-T', src, dst]);
}

/** Bytes allocated on disk for a tree, each hard-linked inode once, not crossing mounts. */
export async function diskBytes(path: string): Promise<number> {
  const r = await run('du', ['-s', '-x', '-B1', path], { allowFail: true });
  if (r.code !== 0) return 0;
  return Number(r.stdout.split(/\s/)[0] ?? 0) || 0;
}

export async function exists(path: string): Promise<boolean> {
  return stat(path).then(
    () => true,
    () => false,
  );
}

/** Volume ids found as entries of `dir` (a backend's volume directory). */
export async function listIds(dir: string): Promise<string[]> {
  const names = await readdir(dir).catch(orElse([] as string[], 'readdir', 'ENOENT'));
  return names.filter(isVolumeId).sort();
}

/**
 * rm -rf, refusing to run while anything is still mounted below: deleting through a leftover
 * mount would destroy the data of whatever is mounted there (an image's layer, the pool).
 */
export async function removeTree(path: string): Promise<void> {
  const left = await mountsUnder(path);
  if (left.length > 0) {
    throw new SnaplabError(
      'STORAGE_FAILED',
      `cannot remove ${path}: ${left.map((m) => m.target).join(', ')} still mounted`,
      `unmount it (umount -l ${left[0]!.target}) and retry`,
    );
  }
  await rm(path, { recursive: true, force: true });
}

async function listedFs(name: string): Promise<boolean> {
  const text = await readFile('/proc/filesystems', 'utf8').catch(orElse('', 'readFile', 'ENOENT', 'ESRCH'));
  return text.split('\n').some((l) => l.split('\t').pop()?.trim() === name);
}

/**
 * Can the kernel mount `name` now? Listed in /proc/filesystems, or loaded first: Debian's kernels
 * have btrfs and overlay as modules, which a host fresh from boot has not loaded yet (a stock
 * Debian 12 guest said "btrfs not in /proc/filesystems" to every create until `modprobe btrfs`).
 * A mount would load it on demand; the probe asks before any mount, so it loads it itself, as
 * Docker does for overlay.
 */
export async function kernelHasFs(name: string): Promise<boolean> {
  if (await listedFs(name)) return true;
  try {
    const r = await run('modprobe', ['-q', name], { allowFail: true });
    return r.code === 0 && (await listedFs(name));
  } catch (e) {
    // modprobe itself is missing (no kmod): the answer is no, and the probe's fix names kmod
    if (e instanceof SnaplabError && (e.code === 'MISSING_TOOL' || e.code === 'HOST_COMMAND_FAILED')) return false;
    throw e;
  }
}
