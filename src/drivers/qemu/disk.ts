/**
 * A VM's root disk: a qcow2 overlay per VM on a read-only base disk (raw ext4) made once from the
 * snaplab image's tree. The overlay lives inside the sandbox's storage volume, so the lab's
 * copy-on-write snapshots and clones of that volume carry the VM's disk along: a snapshot of a VM
 * is a snapshot of the volume taken while QEMU is stopped (its writes flushed).
 */
import { existsSync } from 'node:fs';
import { chmod, link, mkdir, readdir, rm, stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { SnaplabError } from '../../errors.js';
import { run } from '../../host/run.js';

/** Where a VM's overlay lives inside its volume (the volume's tree is otherwise not used). */
export const DISK_IN_VOLUME = '.snaplab-vm/disk.qcow2';
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
  if (!/^[A-Za-z0-9._-]+$/.test(source.id)) throw new SnaplabError('INTERNAL', `bad volume id ${source.id}`);
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
  const du = await run('du', ['-s', '-B1', '-x', tree]);
  const used = Number(du.stdout.split(/\s/)[0]) || 0;
  const bytes = Math.max(VM_DISK_BYTES, Math.ceil((used * 2 + 256 * 2 ** 20) / 2 ** 20) * 2 ** 20);
  const tmp = `${out}.tmp-${process.pid}-${Date.now()}`;
  try {
    const r = await run(
      'mkfs.ext4',
      ['-q', '-F', '-L', 'snaplab-root', '-J', 'size=8', '-E', 'lazy_itable_init=1,lazy_journal_init=1', '-d', tree, tmp, `${bytes / 1024}k`],
      { allowFail: true },
    );
    if (r.code !== 0) {
      throw new SnaplabError('HOST_COMMAND_FAILED', `mkfs.ext4 could not make a root disk from ${tree}: ${(r.stderr || r.stdout).trim()}`, 'is e2fsprogs 1.43 or newer installed (mkfs.ext4 -d)? is there space under the snaplab home?');
    }
    await chmod(tmp, 0o444); // a base is never written: every VM writes its own overlay
    await link(tmp, out).catch((e: NodeJS.ErrnoException) => {
      if (e.code !== 'EEXIST') throw e; // another process made it first: use theirs
    });
    return out;
  } finally {
    await rm(tmp, { force: true });
  }
}

/** A new qcow2 overlay at `overlay` whose backing file is `base` (read only). */
export async function createOverlay(base: string, overlay: string): Promise<void> {
  await mkdir(dirname(overlay), { recursive: true });
  const r = await run('qemu-img', ['create', '-q', '-f', 'qcow2', '-F', 'raw', '-b', base, overlay], { allowFail: true });
  if (r.code !== 0) {
    throw new SnaplabError('HOST_COMMAND_FAILED', `qemu-img could not make the VM's disk: ${(r.stderr || r.stdout).trim()}`, 'apt-get install qemu-utils');
  }
}

/** The overlay's size on the host (what this VM wrote), or 0. */
export async function diskBytes(volumePath: string): Promise<number> {
  return (await stat(volumeDisk(volumePath)).catch(() => null))?.size ?? 0;
}

/**
 * Base disks whose source volume is gone (the image was removed), and half-built ones left by a
 * crash. `keep` holds the ids of image volumes that still exist.
 */
export async function gcBaseDisks(home: string, keep: Set<string>): Promise<string[]> {
  const dir = baseDisksDir(home);
  const names = await readdir(dir).catch(() => [] as string[]);
  const removed: string[] = [];
  for (const n of names) {
    const m = /^(.+)\.img(\.tmp-(\d+)-\d+)?$/.exec(n);
    if (!m) continue;
    const builder = m[3] ? Number(m[3]) : undefined;
    if (builder !== undefined ? isAlive(builder) : keep.has(m[1]!)) continue;
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
