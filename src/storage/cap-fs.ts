import { existsSync } from 'node:fs';
import { mkdir, open, readdir, readFile, rename, rm, rmdir, stat, statfs, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SnaplabError } from '../errors.js';
import { detachLoop, listLoopDevices } from '../host/loops.js';
import { isMountPoint } from '../host/mounts.js';
import type { Availability } from '../host/probe-types.js';
import { run } from '../host/run.js';
import { toolsVerdict } from '../host/tools.js';
import { unmountAll } from './mounts.js';
import { noted, orElse } from '../cleanup.js';

/**
 * A disk cap for storage without quotas of its own (overlay): the volume's directory becomes the
 * root of an ext4 filesystem of the cap's size, a sparse file loop-mounted over it, so everything
 * the volume writes (an overlay's upper and work dirs) lands there and a write past the cap fails
 * with ENOSPC inside, while the machine and every other volume go on. Why this and not project
 * quotas: the host's ext4 here is mounted without `prjquota`, and remounting a user's filesystem
 * is not snaplab's to do; a loop file works on any filesystem that holds the home
 * (docs/architecture.md).
 *
 * It costs a mkfs and a loop mount at each create (~50-60 ms here), so the default cap is not
 * applied where this is the mechanism: only an explicit --disk, or one carried from a snapshot.
 *
 * The image is `<root>/.disks/<id>.img`: its existence says the volume is capped (init mounts it
 * again after a reboot, before the overlay), its size is the cap. A removal first renames it to
 * `.img.rm`, so that no other process mounts it again meanwhile. The mounting and unmounting run
 * under the backend's mount lock (the caller's), as its overlay mounts do: another process's
 * init() must never mount a half-made cap, nor an overlay that a cap is about to cover.
 */
export const capImage = (root: string, id: string): string => join(root, '.disks', `${id}.img`);

// nosuid: a setuid file a machine's root wrote is host root's through the idmap, and not to be
// honoured here (a system machine's own clone clears it, native/userns.c; a snapshot's layer,
// on the host's filesystem, is as any overlay layer); discard: what the machine deletes goes
// back to the host's filesystem (the loop device punches holes in the sparse file)
const MOUNT_OPTIONS = 'loop,noatime,nosuid,discard,errors=remount-ro';

/**
 * The cap's filesystem, made on `<image>.tmp` (slow: outside the lock); its path. `from`: a
 * directory whose contents it starts with (mke2fs -d: owners, modes, links, xattrs kept).
 */
export async function prepareCapImage(image: string, bytes: number, from?: string): Promise<string> {
  if (!Number.isSafeInteger(bytes) || bytes < 1024 ** 2)
    throw new SnaplabError(
      'BAD_SIZE',
      `a disk cap on this storage must be at least 1 MiB, not ${bytes} bytes`,
      'give --disk 1M or more',
    );
  const tmp = `${image}.tmp`;
  try {
    await mkdir(join(image, '..'), { recursive: true });
    const f = await open(tmp, 'w', 0o600);
    await f.truncate(bytes).finally(() => f.close()); // sparse: the host's disk holds only what is written
    // no journal (a sandbox's scratch), no reserved blocks (the cap is the machine's to use), one
    // inode per 8 KiB (a 64 MiB cap holds 8192 files; inode tables take ~3 %), inode tables made
    // lazily by the kernel: mkfs writes a few hundred KB whatever the size
    await run('mkfs.ext4', [
      '-q',
      '-F',
      '-T',
      'default',
      '-i',
      '8192',
      '-m',
      '0',
      '-O',
      '^has_journal',
      '-E',
      'lazy_itable_init=1,nodiscard',
      ...(from ? ['-d', from] : []),
      tmp,
    ]);
    return tmp;
  } catch (e) {
    await rm(tmp, { force: true });
    throw new SnaplabError(
      'STORAGE_FAILED',
      `cannot make the filesystem of a disk cap: ${(e as Error).message}`,
      'see `snaplab doctor` (mkfs.ext4 and loop devices)',
      { cause: e },
    );
  }
}

/**
 * The cap's filesystem for a volume directory, born holding what the directory must keep (its
 * `files`, e.g. meta.json, and empty `dirs`): made from a seed directory with mke2fs -d, so that
 * from the moment it is mounted over the directory nothing the directory said is hidden (a
 * clone's meta.json says which layers it stacks: a layer's delete looks there).
 */
export async function prepareSeededCapImage(
  dir: string,
  image: string,
  bytes: number,
  keep: { files: string[]; dirs: string[] },
): Promise<string> {
  const seed = `${image}.seed`;
  await rm(seed, { recursive: true, force: true });
  try {
    await mkdir(seed, { recursive: true, mode: 0o755 });
    for (const f of keep.files) await writeFile(join(seed, f), await readFile(join(dir, f)));
    for (const d of keep.dirs) await mkdir(join(seed, d));
    return await prepareCapImage(image, bytes, seed);
  } finally {
    await rm(seed, { recursive: true, force: true });
  }
}

/**
 * Under the caller's mount lock: put the prepared filesystem in place and mount it over `dir`.
 * `dirs` (which must hold nothing but empty directories: an overlay's work dir has one) are
 * removed below it first, so that nothing reads an empty stand-in if the cap is ever not
 * mounted. On any failure nothing of the cap is left and `dir` is as it was.
 */
export async function mountCapFs(dir: string, tmp: string, image: string, dirs: string[]): Promise<void> {
  const removed: string[] = [];
  try {
    for (const d of dirs) {
      await removeDirsOnly(join(dir, d));
      removed.push(d);
    }
    await rename(tmp, image);
    await mountCapImage(image, dir);
  } catch (e) {
    await removeCapFs(dir, image).catch(noted(`remove the disk cap of ${dir}`));
    await rm(tmp, { force: true });
    for (const d of removed)
      await mkdir(join(dir, d), { recursive: true }).catch(noted(`put back ${join(dir, d)}`, 'EEXIST'));
    throw new SnaplabError(
      'STORAGE_FAILED',
      `cannot mount the disk cap of ${dir}: ${(e as Error).message}`,
      'see `snaplab doctor` (mkfs.ext4 and loop devices)',
      { cause: e },
    );
  }
}

/** Remove a tree of empty directories (an overlay's work dir holds one of its own); ENOTEMPTY if it holds anything else. */
async function removeDirsOnly(path: string): Promise<void> {
  for (const e of await readdir(path, { withFileTypes: true })) {
    if (!e.isDirectory()) throw Object.assign(new Error(`${path} is not empty (${e.name})`), { code: 'ENOTEMPTY' });
    await removeDirsOnly(join(path, e.name));
  }
  await rmdir(path);
}

/**
 * Under the caller's mount lock: mount a capped volume's filesystem again (after a reboot), checked
 * first (no journal: an unclean stop leaves it for e2fsck, which fixes what it safely can); nothing
 * when it is mounted or was never capped. Throws when the check finds what it cannot fix.
 */
export async function remountCapFs(dir: string, image: string): Promise<void> {
  if (!existsSync(image) || (await isMountPoint(dir))) return;
  // a loop device on it: mounted still, in a machine's own mount namespace (its idmapped clone),
  // though not on the host; e2fsck must not touch a filesystem in use, nor a second mount share it
  if ((await listLoopDevices()).some((l) => l.backingFile === image)) {
    throw new SnaplabError(
      'STORAGE_FAILED',
      `the disk cap of ${dir} is not mounted on the host but still in use (a loop device holds ${image})`,
      'stop or remove the machine that uses it (snaplab rm), then its cap is mounted again by the next command',
    );
  }
  const fsck = await run('e2fsck', ['-p', image], { allowFail: true });
  if (fsck.code >= 4)
    throw new SnaplabError(
      'STORAGE_FAILED',
      `the disk cap of ${dir} is damaged (e2fsck: ${(fsck.stderr || fsck.stdout).trim()})`,
      `remove the machine (snaplab rm), or repair ${image} with e2fsck`,
    );
  await mountCapImage(image, dir);
}

/** Mount a cap's file over `dir` (under the caller's mount lock). */
export async function mountCapImage(image: string, dir: string): Promise<void> {
  await run('mount', ['-o', MOUNT_OPTIONS, image, dir]);
}

/**
 * What crashes left in `<root>/.disks` (a backend's gc): removals cut short (.rm), caps whose
 * volume directory is gone, filesystems half-made (.tmp) and their seed directories (.seed: what
 * mke2fs -d was filling one from), once no create can be making them (a minute old).
 */
export async function sweepCaps(
  root: string,
  dirOf: (id: string) => string,
  locked: <T>(fn: () => Promise<T>) => Promise<T>,
): Promise<string[]> {
  const removed: string[] = [];
  for (const name of await readdir(join(root, '.disks')).catch(orElse([] as string[], 'readdir', 'ENOENT'))) {
    const id = name.replace(/\.img(\.tmp|\.rm|\.seed)?$/, '');
    if (!/^[0-9a-f]{12}$/.test(id)) continue;
    const path = join(root, '.disks', name);
    if (name.endsWith('.tmp') || name.endsWith('.seed')) {
      const age = await stat(path).then(
        (st) => Date.now() - st.mtimeMs,
        () => 0,
      );
      if (age < 60_000) continue;
      await rm(path, { recursive: true, force: true });
      removed.push(`removed ${path}`);
    } else if (name.endsWith('.rm') || !existsSync(dirOf(id))) {
      for (const d of await locked(() => removeCapFs(dirOf(id), capImage(root, id)))) removed.push(`${id}: ${d}`);
    }
  }
  return removed;
}

/** Does a disk cap of this kind hold here (for doctor; makes nothing)? */
export async function capSupport(feature: 'disk-cap'): Promise<Availability> {
  const missing = await toolsVerdict(feature, 'a disk cap on this storage');
  if (missing) return missing;
  if (!existsSync('/dev/loop-control'))
    return { ok: false, reason: 'no loop devices here (/dev/loop-control): --disk is refused', fix: 'modprobe loop' };
  return {
    ok: true,
    reason:
      'an ext4 loop file of its own per machine that asks (--disk: ~50-60 ms more at its create); writes past it fail with ENOSPC; no default cap',
  };
}

/** A capped volume whose filesystem is not mounted: its dirs are not there, say so (nothing reads an empty stand-in). */
export async function checkCapMounted(dir: string, image: string): Promise<void> {
  if (existsSync(image) && !(await isMountPoint(dir))) {
    throw new SnaplabError(
      'STORAGE_FAILED',
      `the disk cap of ${dir} is not mounted`,
      `the next snaplab command mounts it again after checking it (e2fsck -p); if it stays unmounted, run e2fsck ${image} to see why, or remove the machine`,
    );
  }
}

/**
 * Unmount `dir` (and what is mounted in it), detach the image's loop device and remove the image
 * (and a `.tmp` of it). Idempotent, and safe beside another process's init(): the image is renamed
 * first, so nobody mounts it again. The loop device goes with the unmount (mount -o loop sets
 * autoclear), asynchronously: detached here too and waited for, briefly (a sandbox's mount
 * namespace may still hold the mount: then the kernel frees it when that goes).
 */
export async function removeCapFs(dir: string, image: string): Promise<string[]> {
  const doomed = `${image}.rm`;
  const renamed = await rename(image, doomed).then(
    () => true,
    (e: NodeJS.ErrnoException) => {
      if (e.code !== 'ENOENT') throw e;
      return false;
    },
  );
  const done = (await unmountAll(dir)).map((m) => `unmounted ${m}`);
  // never capped, or removed already: no loop device or file of it to look for (every delete
  // comes here; a loop device whose file is gone is gc's generic loop pass's)
  if (!renamed && !existsSync(doomed) && !existsSync(`${image}.tmp`) && !existsSync(`${image}.seed`)) return done;
  const ours = (f: string): boolean => f === image || f === doomed;
  for (const l of (await listLoopDevices()).filter((d) => ours(d.backingFile))) {
    await detachLoop(l.device).catch(noted(`detach ${l.device}`));
    done.push(`detached ${l.device}`);
  }
  for (let i = 0; i < 100 && (await listLoopDevices()).some((d) => ours(d.backingFile)); i++)
    await new Promise((r) => setTimeout(r, 20));
  for (const f of [doomed, `${image}.tmp`, `${image}.seed`]) {
    if (!existsSync(f)) continue;
    await rm(f, { recursive: true, force: true });
    done.push(`removed ${f}`);
  }
  return done;
}

/** What a capped volume holds against its cap (the filesystem's own metadata included); null if not capped. */
export async function capUsage(dir: string, image: string): Promise<{ usedBytes: number; limitBytes: number } | null> {
  if (!existsSync(image) || !(await isMountPoint(dir))) return null;
  const [s, img] = await Promise.all([statfs(dir), stat(image)]);
  return { usedBytes: (s.blocks - s.bfree) * s.bsize, limitBytes: img.size };
}

/** What a capped volume costs the host's filesystem: the image's allocated blocks; null if not capped. */
export async function capHostBytes(image: string): Promise<number | null> {
  return stat(image).then(
    (s) => s.blocks * 512,
    () => null,
  );
}
