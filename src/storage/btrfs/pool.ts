import { access, mkdir, rename, rm, statfs } from 'node:fs/promises';
import { join } from 'node:path';
import { SnaplabError } from '../../errors.js';
import { run } from '../../host/run.js';
import { withLock } from '../../host/lock.js';
import { readMounts, unmountAll } from '../mounts.js';
import { exists } from '../tree.js';

const BTRFS_SUPER_MAGIC = 0x9123683e;
export const DEFAULT_POOL_SIZE = '20G';

export interface PoolLayout {
  /** where subvolumes live */
  volumes: string;
  /** the sparse image file and its mount point, when ${home} is not on btrfs */
  image?: string;
  mountPoint?: string;
}

/**
 * Subvolumes need btrfs under them. If ${home} is on btrfs they live in ${home}/storage/btrfs;
 * otherwise in a pool: a sparse file ${home}/btrfs.img loop-mounted at ${home}/btrfs. An existing
 * image file means the pool is in use, whatever ${home} is on now.
 */
export async function poolLayout(home: string): Promise<PoolLayout> {
  const image = join(home, 'btrfs.img');
  const pooled = { volumes: join(home, 'btrfs', 'volumes'), image, mountPoint: join(home, 'btrfs') };
  if (await exists(image)) return pooled;
  const onBtrfs = await statfs(home).then(
    (s) => s.type === BTRFS_SUPER_MAGIC,
    () => false,
  );
  return onBtrfs ? { volumes: join(home, 'storage', 'btrfs') } : pooled;
}

export async function poolMounted(mountPoint: string): Promise<boolean> {
  return (await readMounts()).some((m) => m.target === mountPoint && m.fstype === 'btrfs');
}

/** Loop devices backed by `image` (`losetup -j`), e.g. ["/dev/loop3"]. */
export async function loopsOf(image: string): Promise<string[]> {
  const r = await run('losetup', ['-j', image], { allowFail: true });
  return r.stdout
    .split('\n')
    .map((l) => l.split(':')[0]?.trim() ?? '')
    .filter((d) => d.startsWith('/dev/'));
}

export function poolSize(env: NodeJS.ProcessEnv = process.env): string {
  const size = env.SNAPLAB_BTRFS_SIZE?.trim() || DEFAULT_POOL_SIZE;
  if (!/^\d+[KMGT]?$/i.test(size)) {
    throw new SnaplabError(
      'BAD_SIZE',
      `SNAPLAB_BTRFS_SIZE=${size} is not a size`,
      'use a number with K, M, G or T, e.g. 4G',
    );
  }
  return size;
}

/**
 * Create (first time) and mount the pool. Idempotent, and safe across processes: everything runs
 * under ${home}/btrfs.lock. The image is formatted under a temporary name and renamed, so a crash
 * never leaves a file that looks like a pool but is not one.
 */
export async function ensurePool(home: string, layout: PoolLayout): Promise<void> {
  const { image, mountPoint } = layout;
  if (!image || !mountPoint) return void (await mkdir(layout.volumes, { recursive: true }));
  if (await poolMounted(mountPoint)) return void (await mkdir(layout.volumes, { recursive: true }));
  await withLock(join(home, 'btrfs.lock'), async () => {
    if (await poolMounted(mountPoint)) return;
    if (!(await exists(image))) {
      const tmp = `${image}.tmp`;
      await rm(tmp, { force: true });
      await run('truncate', ['-s', poolSize(), tmp]);
      await run('mkfs.btrfs', ['-q', tmp]);
      await rename(tmp, image);
    }
    await mkdir(mountPoint, { recursive: true });
    // A loop device left attached (a crash, an unmount elsewhere) is reused: attaching the same
    // file twice would give btrfs two devices with one fsid.
    const [dev] = await loopsOf(image);
    if (dev) await run('mount', ['-o', 'noatime,nosuid,nodev', dev, mountPoint]);
    else await run('mount', ['-o', 'loop,noatime,nosuid,nodev', image, mountPoint]);
  });
  await mkdir(layout.volumes, { recursive: true });
}

/**
 * Unmount the pool and detach its loop device(s); the image file stays, so init() mounts it
 * again. For gc once no volume uses the pool. Returns what it did.
 */
export async function unmountPool(home: string): Promise<string[]> {
  const layout = await poolLayout(home);
  const { image, mountPoint } = layout;
  if (!image || !mountPoint) return [];
  return withLock(join(home, 'btrfs.lock'), async () => {
    const done = (await unmountAll(mountPoint)).map((m) => `btrfs: unmounted ${m}`);
    if (
      !(await access(image).then(
        () => true,
        () => false,
      ))
    )
      return done;
    // mount -o loop sets autoclear, but the kernel detaches asynchronously: detach and wait.
    let loops = await loopsOf(image);
    done.push(...loops.map((d) => `btrfs: detached ${d}`));
    for (let i = 0; loops.length > 0 && i < 100; i++) {
      for (const d of loops) await run('losetup', ['-d', d], { allowFail: true });
      await new Promise((r) => setTimeout(r, 20));
      loops = await loopsOf(image);
    }
    if (loops.length > 0) {
      throw new SnaplabError(
        'STORAGE_FAILED',
        `loop device ${loops.join(', ')} of ${image} stays attached`,
        `losetup -d ${loops.join(' ')}`,
      );
    }
    return done;
  });
}
