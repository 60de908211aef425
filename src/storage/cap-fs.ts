import { existsSync } from 'node:fs';
import { mkdir, open, readFile, rename, rm, statfs, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SnaplabError } from '../errors.js';
import { detachLoop, listLoopDevices } from '../host/loops.js';
import { isMountPoint } from '../host/mounts.js';
import { run } from '../host/run.js';
import { unmountAll } from './mounts.js';

/**
 * A disk cap for storage without quotas of its own (overlay): the volume's directory becomes the
 * root of an ext4 filesystem of the cap's size, a sparse file loop-mounted over it, so everything
 * the volume writes (an overlay's upper and work dirs) lands there and a write past the cap fails
 * with ENOSPC inside, while the machine and every other volume go on. Why this and not project
 * quotas: the host's ext4 here is mounted without `prjquota` and its superblock cannot be changed
 * by a tool; a loop file works on any filesystem that holds the home (docs/architecture.md).
 *
 * It costs a mkfs and a loop mount at each create (~50-60 ms here), so the default cap is not applied
 * where this is the mechanism: only an explicit --disk.
 *
 * The image is `<root>/.disks/<id>.img`: its existence says the volume is capped (init mounts it
 * again after a reboot, before the overlay), its size is the cap.
 */
export const capImage = (root: string, id: string): string => join(root, '.disks', `${id}.img`);

/**
 * Make `dir` the root of a filesystem of `bytes`, with what it held recreated in it: `files` are
 * copied (meta.json), `dirs` made empty (upper, work, merged: they must be empty when this runs).
 * On any failure nothing of the cap is left and `dir` is as it was.
 */
export async function makeCapFs(dir: string, image: string, bytes: number, keep: { files: string[]; dirs: string[] }): Promise<void> {
  if (!Number.isSafeInteger(bytes) || bytes < 1024 ** 2) throw new SnaplabError('BAD_SIZE', `a disk cap on this storage must be at least 1 MiB, not ${bytes} bytes`, 'give --disk 1M or more');
  const saved = await Promise.all(keep.files.map(async (f) => [f, await readFile(join(dir, f))] as const));
  const tmp = `${image}.tmp`;
  try {
    await mkdir(join(image, '..'), { recursive: true });
    const f = await open(tmp, 'w', 0o600);
    await f.truncate(bytes).finally(() => f.close()); // sparse: the host's disk holds only what is written
    // no journal (a sandbox's scratch), no reserved blocks (the cap is the machine's to use),
    // inode tables made lazily by the kernel: mkfs writes a few hundred KB whatever the size
    await run('mkfs.ext4', ['-q', '-F', '-T', 'default', '-m', '0', '-O', '^has_journal', '-E', 'lazy_itable_init=1,nodiscard', tmp]);
    await rename(tmp, image);
    await run('mount', ['-o', 'loop,noatime', image, dir]);
    await rm(join(dir, 'lost+found'), { recursive: true, force: true });
    for (const [name, data] of saved) await writeFile(join(dir, name), data);
    for (const d of keep.dirs) await mkdir(join(dir, d));
  } catch (e) {
    await removeCapFs(dir, image).catch(() => undefined);
    await rm(tmp, { force: true });
    throw new SnaplabError('STORAGE_FAILED', `cannot make the disk cap of ${dir}: ${(e as Error).message}`, 'see `snaplab doctor` (mkfs.ext4 and loop devices)', { cause: e });
  }
}

/** Mount a capped volume's filesystem again (after a reboot); nothing when it is or was never capped. */
export async function remountCapFs(dir: string, image: string): Promise<void> {
  if (!existsSync(image) || (await isMountPoint(dir))) return;
  await run('mount', ['-o', 'loop,noatime', image, dir]);
}

/**
 * Unmount `dir` (and what is mounted in it), detach the image's loop device and remove the image.
 * Idempotent. The loop device goes with the unmount (mount -o loop sets autoclear), asynchronously:
 * detached here too, and waited for, so that nothing is left when this returns.
 */
export async function removeCapFs(dir: string, image: string): Promise<string[]> {
  const done = (await unmountAll(dir)).map((m) => `unmounted ${m}`);
  for (let i = 0; i < 100; i++) {
    const loops = (await listLoopDevices()).filter((l) => l.backingFile === image);
    if (!loops.length) break;
    for (const l of loops) {
      await detachLoop(l.device).catch(() => undefined);
      if (i === 0) done.push(`detached ${l.device}`);
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  if (existsSync(image)) {
    await rm(image, { force: true });
    done.push(`removed ${image}`);
  }
  return done;
}

/** What a capped volume holds against its cap (the filesystem's own metadata included); null if not capped. */
export async function capUsage(dir: string, image: string): Promise<{ usedBytes: number; limitBytes: number } | null> {
  if (!existsSync(image) || !(await isMountPoint(dir))) return null;
  const [s, img] = await Promise.all([statfs(dir), stat(image)]);
  return { usedBytes: (s.blocks - s.bfree) * s.bsize, limitBytes: img.size };
}
