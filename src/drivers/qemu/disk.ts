/**
 * A VM's root disk: a qcow2 overlay per VM on a read-only base disk (raw ext4) made once from the
 * snaplab image's tree. The overlay lives inside the sandbox's storage volume, so the lab's
 * copy-on-write snapshots and clones of that volume carry the VM's disk along: a snapshot of a VM
 * is a snapshot of the volume taken while QEMU is stopped (its writes flushed).
 */
import { existsSync } from 'node:fs';
import { chmod, link, lstat, mkdir, open, readdir, rm, stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { SnaplabError } from '../../errors.js';
import { run } from '../../host/run.js';
import { orElse } from '../../cleanup.js';

/** Where a VM's overlay lives inside its volume (the volume's tree is otherwise not used). */
export const DISK_DIR_IN_VOLUME = '.snaplab-vm';
export const DISK_IN_VOLUME = `${DISK_DIR_IN_VOLUME}/disk.qcow2`;
/** Smallest virtual size of a root disk; the base is sparse, so unused space costs nothing. */
export const VM_DISK_BYTES = 2 * 1024 ** 3;

export const baseDisksDir = (home: string): string => join(home, 'qemu', 'disks');
export const baseDiskPath = (home: string, sourceId: string): string => join(baseDisksDir(home), `${sourceId}.img`);
export const volumeDisk = (volumePath: string): string => join(volumePath, DISK_IN_VOLUME);

const inflight = new Map<string, Promise<string>>();

/**
 * The base disk of an image volume, built on first use: a sparse raw ext4 file filled from the
 * tree by mke2fs (no mount, no loop device). Built under a temporary name and linked into place,
 * so a crash leaves no half disk and two builders never swap a disk under an overlay.
 */
export async function ensureBaseDisk(home: string, source: { id: string; path: string }): Promise<string> {
  if (!/^[A-Za-z0-9._-]+$/.test(source.id))
    throw new SnaplabError('INTERNAL', `bad volume id ${source.id}`, 'this is a bug in snaplab; please report it');
  const out = baseDiskPath(home, source.id);
  if (existsSync(out)) return out;
  let p = inflight.get(out);
  if (!p) {
    p = buildBaseDisk(out, source.path).finally(() => inflight.delete(out));
    inflight.set(out, p);
  }
  return p;
}

async function buildBaseDisk(out: string, tree: string): Promise<string> {
  await mkdir(dirname(out), { recursive: true });
  const du = await run('du', ['-s', '-B1', '-x', tree], { allowFail: true });
  const used = Number(du.stdout.split(/\s/)[0]) || 0;
  const bytes = Math.max(VM_DISK_BYTES, Math.ceil((used * 2 + 256 * 2 ** 20) / 2 ** 20) * 2 ** 20);
  const tmp = `${out}.tmp-${process.pid}-${Date.now()}`;
  try {
    const r = await run(
      'mkfs.ext4',
      [
        '-q',
        '-F',
        '-L',
        'snaplab-root',
        '-J',
        'size=8',
        '-E',
        'lazy_itable_init=1,lazy_journal_init=1',
        '-d',
        tree,
        tmp,
        `${bytes / 1024}k`,
      ],
      { allowFail: true },
    );
    if (r.code !== 0) {
      throw new SnaplabError(
        'HOST_COMMAND_FAILED',
        `mkfs.ext4 could not make a root disk from ${tree}: ${(r.stderr || r.stdout).trim()}`,
        'is e2fsprogs 1.43 or newer installed (mkfs.ext4 -d)? is there space under the snaplab home?',
      );
    }
    await chmod(tmp, 0o444); // a base is never written: every VM writes its own overlay
    await link(tmp, out).catch((e: NodeJS.ErrnoException) => {
      if (e.code === 'EEXIST') return; // another process made it first: use theirs
      throw new SnaplabError(
        'STORAGE_FAILED',
        `cannot put the base disk in place at ${out}: ${e.message}`,
        'is the snaplab home on a filesystem with hard links, and writable?',
        { cause: e },
      );
    });
    return out;
  } finally {
    await rm(tmp, { force: true });
  }
}

/**
 * A fresh disk for a VM raised from an image: whatever the image's tree holds at DISK_DIR_IN_VOLUME
 * is thrown away first (an image is untrusted: a symlink there must not send the disk elsewhere,
 * a planted qcow2 must not name host files as its backing). Returns the disk's path.
 */
export async function freshVolumeDisk(volumePath: string, base: string): Promise<string> {
  const dir = join(volumePath, DISK_DIR_IN_VOLUME);
  await rm(dir, { recursive: true, force: true }); // a symlink is removed, not followed
  await mkdir(dir, { mode: 0o700 });
  const disk = join(dir, 'disk.qcow2');
  await createOverlay(base, disk);
  return disk;
}

/**
 * The disk in a clone of a VM snapshot's volume, checked before QEMU opens it: a real file in a
 * real directory, a qcow2 without an external data file, backed by one of this home's base
 * disks. Returns that base, which the driver pins as the backing (QEMU does not follow the
 * header's name). Throws SNAPSHOT_NOT_FOUND when it is not such a disk.
 */
export async function checkVolumeDisk(home: string, volumePath: string): Promise<{ disk: string; base: string }> {
  const dir = join(volumePath, DISK_DIR_IN_VOLUME);
  const disk = join(dir, 'disk.qcow2');
  const bad = (why: string): SnaplabError =>
    new SnaplabError(
      'SNAPSHOT_NOT_FOUND',
      `${disk} is not a VM disk snaplab made: ${why}`,
      'restore a snapshot taken of a VM (--driver qemu), or take a new one',
    );
  if (!(await lstat(dir).catch(orElse(null, 'lstat', 'ENOENT')))?.isDirectory()) throw bad('no disk directory');
  if (!(await lstat(disk).catch(orElse(null, 'lstat', 'ENOENT')))?.isFile()) throw bad('no disk file');
  const f = await open(disk, 'r');
  let h: Buffer;
  try {
    h = Buffer.alloc(1024);
    await f.read(h, 0, h.length, 0);
    if (h.readUInt32BE(0) !== 0x514649fb) throw bad('not qcow2');
    const version = h.readUInt32BE(4);
    if (version === 3 && (h.readBigUInt64BE(72) & 4n) !== 0n) throw bad('it has an external data file');
    const at = Number(h.readBigUInt64BE(8));
    const len = h.readUInt32BE(16);
    if (!at || !len || len > 1023) throw bad('no backing file');
    const name = Buffer.alloc(len);
    await f.read(name, 0, len, at);
    const base = name.toString('utf8');
    const m = /^(.+)\/([A-Za-z0-9._-]+)\.img$/.exec(base);
    if (!m || m[1] !== baseDisksDir(home) || !existsSync(base))
      throw bad(`its backing file ${JSON.stringify(base)} is not a base disk of this snaplab home`);
    return { disk, base };
  } finally {
    await f.close();
  }
}

/** A new qcow2 overlay at `overlay` whose backing file is `base` (read only). */
export async function createOverlay(base: string, overlay: string): Promise<void> {
  await mkdir(dirname(overlay), { recursive: true });
  const r = await run('qemu-img', ['create', '-q', '-f', 'qcow2', '-F', 'raw', '-b', base, overlay], {
    allowFail: true,
  });
  if (r.code !== 0) {
    throw new SnaplabError(
      'HOST_COMMAND_FAILED',
      `qemu-img could not make the VM's disk: ${(r.stderr || r.stdout).trim()}`,
      'apt-get install qemu-utils',
    );
  }
}

/** The overlay's size on the host (what this VM wrote), or 0. */
export async function diskBytes(volumePath: string): Promise<number> {
  return (await stat(volumeDisk(volumePath)).catch(orElse(null, 'stat', 'ENOENT')))?.size ?? 0;
}

/**
 * Base disks whose source volume is gone (the image was removed), and half-built ones left by a
 * crash. `keep` says whether an image volume still exists.
 */
export async function gcBaseDisks(home: string, keep: (volumeId: string) => boolean): Promise<string[]> {
  const dir = baseDisksDir(home);
  const names = await readdir(dir).catch(orElse([] as string[], 'readdir', 'ENOENT'));
  const removed: string[] = [];
  for (const n of names) {
    const m = /^(.+)\.img(\.tmp-(\d+)-\d+)?$/.exec(n);
    if (!m) continue;
    const builder = m[3] ? Number(m[3]) : undefined;
    if (builder !== undefined ? isAlive(builder) : keep(m[1]!)) continue;
    await rm(join(dir, n), { force: true });
    removed.push(`base disk ${join(dir, n)}`);
  }
  return removed;
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}
