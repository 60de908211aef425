/**
 * Quick storage timings (not a test, not the benchmark ladder): median clone and snapshot time per
 * backend on a busybox-sized tree, and btrfs snapshot cost against tree size.
 * Run as root: npx vite-node src/storage/measure.ts [reps]
 */
import { randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, rm, symlink, writeFile, copyFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { run } from '../host/run.js';
import type { StorageBackend, StorageKind, Volume } from './backend.js';
import { unmountPool } from './btrfs/pool.js';
import { createBackend } from './index.js';
import { unmountAll } from './mounts.js';

const reps = Number(process.argv[2] ?? 20);
const ms = (t0: bigint) => Number(process.hrtime.bigint() - t0) / 1e6;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? NaN;
async function timed<T>(xs: number[], fn: () => Promise<T>): Promise<T> {
  const t0 = process.hrtime.bigint();
  const r = await fn();
  xs.push(ms(t0));
  return r;
}

/** ~2 MB: busybox, its applet symlinks, a few dirs and small files. */
async function busyboxTree(dir: string): Promise<void> {
  for (const d of ['bin', 'etc', 'tmp', 'root', 'proc', 'dev', 'sys']) await mkdir(join(dir, d), { recursive: true });
  await copyFile('/bin/busybox', join(dir, 'bin', 'busybox'));
  const applets = (await run('/bin/busybox', ['--list'])).stdout.split('\n').filter(Boolean);
  for (const a of applets) if (a !== 'busybox') await symlink('busybox', join(dir, 'bin', a));
  await writeFile(join(dir, 'etc', 'passwd'), 'root:x:0:0:root:/root:/bin/sh\n');
  await writeFile(join(dir, 'etc', 'hostname'), 'sandbox\n');
}

async function perBackend(kind: StorageKind, top: string, src: string): Promise<void> {
  const home = join(top, kind);
  await mkdir(home);
  const b: StorageBackend = createBackend(kind, home);
  await b.init();
  const image = await b.importImage(src, 'busybox');
  const clones: Volume[] = [], snaps: Volume[] = [];
  const tc: number[] = [], ts: number[] = [], td: number[] = [];
  for (let i = 0; i < reps; i++) clones.push(await timed(tc, () => b.clone(image)));
  for (const c of clones) await writeFile(join(c.path, 'etc', 'changed'), 'x'.repeat(4096));
  for (const c of clones) snaps.push(await timed(ts, () => b.snapshot(c)));
  for (const v of [...snaps, ...clones]) await timed(td, () => b.delete(v));
  console.log(`${kind.padEnd(8)} clone ${median(tc).toFixed(1)} ms  snapshot ${median(ts).toFixed(1)} ms  delete ${median(td).toFixed(1)} ms  (median of ${reps})`);
  await b.delete(image);
  if (kind === 'btrfs') {
    await btrfsScaling(b);
    await spawnCost(b);
    await unmountPool(home);
  }
}

async function btrfsScaling(b: StorageBackend): Promise<void> {
  const buf = randomBytes(1 << 20);
  for (const mib of [1, 1024]) {
    const src = await mkdtemp(join(tmpdir(), 'snaplab-measure-src-'));
    await writeFile(join(src, 'keep'), '');
    const img = await b.importImage(src, 'empty');
    await rm(src, { recursive: true });
    const c = await b.clone(img);
    for (let i = 0; i < mib; i++) await writeFile(join(c.path, `f${i}`), buf);
    await run('sync', ['-f', c.path]);
    const t: number[] = [], snaps: Volume[] = [];
    for (let i = 0; i < reps; i++) snaps.push(await timed(t, () => b.snapshot(c)));
    console.log(`btrfs    snapshot of a ${String(mib).padStart(4)} MiB tree (${mib} files): ${median(t).toFixed(1)} ms`);
    for (const v of [...snaps, c, img]) await b.delete(v);
  }
}

/** How much of a clone is the spawn of btrfs(8) rather than the ioctl? */
async function spawnCost(b: StorageBackend): Promise<void> {
  const t: number[] = [];
  for (let i = 0; i < reps; i++) await timed(t, () => run('/bin/true', []));
  const tv: number[] = [];
  for (let i = 0; i < reps; i++) await timed(tv, () => run('btrfs', ['--version']));
  const src = await mkdtemp(join(tmpdir(), 'snaplab-measure-src-'));
  const img = await b.importImage(src, 'empty');
  await rm(src, { recursive: true });
  const tc: number[] = [], vols: Volume[] = [];
  for (let i = 0; i < reps; i++) vols.push(await timed(tc, () => b.clone(img)));
  // the same ioctl without Node's spawn: one shell running N btrfs commands, timed inside
  const dir = join(img.path, '..');
  const script = `s=$(date +%s%N); for i in $(seq ${reps}); do btrfs subvolume snapshot ${img.path} ${dir}/sh$i >/dev/null; done; e=$(date +%s%N); echo $(( (e-s)/${reps}000 )); for i in $(seq ${reps}); do btrfs subvolume delete ${dir}/sh$i >/dev/null; done`;
  const perShell = Number((await run('sh', ['-c', script])).stdout.trim()) / 1000;
  console.log(`btrfs    spawn /bin/true ${median(t).toFixed(2)} ms, btrfs --version ${median(tv).toFixed(2)} ms, clone() of empty ${median(tc).toFixed(2)} ms, btrfs snapshot from sh ${perShell.toFixed(2)} ms`);
  for (const v of [...vols, img]) await b.delete(v);
}

const top = await mkdtemp(join(tmpdir(), 'snaplab-measure-'));
process.env['SNAPLAB_BTRFS_SIZE'] ??= '4G';
try {
  const src = join(top, 'busybox');
  await busyboxTree(src);
  console.log(`tree: ${(await run('du', ['-sh', src])).stdout.split('\t')[0]} (busybox + applet links)`);
  for (const kind of ['dir', 'overlay', 'btrfs'] as StorageKind[]) await perBackend(kind, top, src);
} finally {
  await unmountPool(join(top, 'btrfs')).catch(() => undefined);
  await unmountAll(top);
  await rm(top, { recursive: true, force: true });
}
