import { mkdir, readdir, rename, rm, statfs } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { SnaplabError } from '../../errors.js';
import { pidAlive } from '../../host/procs.js';
import {
  capHostBytes,
  capImage,
  capSupport,
  checkCapMounted,
  mountCapImage,
  prepareCapImage,
  remountCapFs,
  removeCapFs,
  sweepCaps,
} from '../cap-fs.js';
import type { Availability } from '../../host/probe-types.js';
import { run } from '../../host/run.js';
import { toolsVerdict } from '../../host/tools.js';
import type { StorageBackend, Usage, Volume } from '../backend.js';
import { withLock } from '../../host/lock.js';
import { checkVolume, readMeta, writeMeta } from '../meta.js';
import { isMountPoint, unmountAll } from '../mounts.js';
import { copyTree, diskBytes, exists, listIds, newId, removeTree } from '../tree.js';
import { noted, orElse } from '../../cleanup.js';

interface DirMeta {
  readOnly: boolean;
  name?: string;
  /** a capped clone: the cap asked for, and what its filesystem held when the cap was made */
  cap?: number;
  capBase?: number;
}

const MiB = 1024 ** 2;

/**
 * The baseline: every clone and snapshot is a full copy (`cp -a --reflink=auto`, so near free on
 * a filesystem with reflinks, a real copy on ext4). Layout: `${home}/storage/dir/<id>/tree` is the
 * volume, `<id>/meta.json` says what it is. Read-only volumes are the tree bind-mounted read-only
 * onto itself: we are root, so file modes alone would not stop a write.
 */
export class DirBackend implements StorageBackend {
  readonly kind = 'dir' as const;
  /** a cap is a filesystem per machine with its copy of the image (cap-fs.ts): made when asked for */
  readonly capsByDefault = false;
  private readonly root: string;

  constructor(readonly home: string) {
    this.root = join(home, 'storage', 'dir');
  }

  async probe(): Promise<Availability> {
    try {
      const missing = await toolsVerdict('dir', 'dir storage');
      if (missing) return missing;
      return { ok: true, reason: 'full copies with cp -a --reflink=auto (no sharing on ext4)' };
    } catch (e) {
      return { ok: false, reason: `probe failed: ${(e as Error).message}` };
    }
  }

  /** Also re-applies read-only bind mounts lost in a reboot. */
  async init(): Promise<void> {
    await mkdir(this.root, { recursive: true });
    for (const id of await listIds(this.root)) {
      // a capped clone's filesystem holds its tree: mounted again (after a check) before anything reads it
      if (existsSync(capImage(this.root, id)))
        await this.locked(() => remountCapFs(this.dir(id), capImage(this.root, id))).catch(
          noted(`mount the disk cap of volume ${id} again`),
        );
      const meta = await readMeta<DirMeta>(this.dir(id));
      if (meta?.readOnly) await this.makeReadOnly(join(this.dir(id), 'tree'));
    }
  }

  importImage(srcDir: string, name: string): Promise<Volume> {
    return this.create(srcDir, true, name);
  }

  clone(base: Volume): Promise<Volume> {
    checkVolume(base, 'dir');
    return this.create(base.path, false);
  }

  async snapshot(volume: Volume): Promise<Volume> {
    checkVolume(volume, 'dir');
    await checkCapMounted(this.dir(volume.id), capImage(this.root, volume.id));
    return this.create(volume.path, true);
  }

  async delete(volume: Volume): Promise<void> {
    checkVolume(volume, 'dir');
    await this.locked(() => removeCapFs(this.dir(volume.id), capImage(this.root, volume.id)));
    await unmountAll(this.dir(volume.id));
    await removeTree(this.dir(volume.id));
  }

  /**
   * A clone is a full copy made before its cap is known: the cap's filesystem (cap-fs.ts) is made
   * with that copy in it (mke2fs -d, sized for the copy, its metadata and the cap), mounted over
   * the volume's directory, and the first copy removed. So a capped create on dir copies its
   * image twice; the cap is about what it writes beyond its image.
   */
  async limitDisk(volume: Volume, bytes: number): Promise<string | null> {
    checkVolume(volume, 'dir');
    if (volume.readOnly)
      throw new SnaplabError('BAD_INPUT', `dir volume ${volume.id} is read-only: only a clone takes a disk cap`);
    if (bytes === 0) return null;
    const dir = this.dir(volume.id);
    const meta = (await readMeta<DirMeta>(dir)) ?? { readOnly: false };
    const base = await diskBytes(join(dir, 'tree'));
    const image = capImage(this.root, volume.id);
    const tmp = await prepareCapImage(image, Math.ceil(((bytes + base) * 1.06 + 8 * MiB) / MiB) * MiB, dir);
    const first = join(this.root, '.trash', `${volume.id}-${process.pid}`);
    await this.locked(async () => {
      await mkdir(join(this.root, '.trash'), { recursive: true });
      await rename(join(dir, 'tree'), first); // out from under the mount: nothing hidden stays
      try {
        await rename(tmp, image);
        await mountCapImage(image, dir);
        const s = await statfs(dir);
        await writeMeta(dir, { ...meta, cap: bytes, capBase: (s.blocks - s.bfree) * s.bsize });
      } catch (e) {
        await removeCapFs(dir, image).catch(noted(`remove the disk cap of ${dir}`));
        await rm(tmp, { force: true });
        await rename(first, join(dir, 'tree')).catch(noted(`put back ${join(dir, 'tree')}`, 'ENOENT'));
        throw new SnaplabError(
          'STORAGE_FAILED',
          `cannot mount the disk cap of ${dir}: ${(e as Error).message}`,
          'see `snaplab doctor` (mkfs.ext4 and loop devices)',
          { cause: e },
        );
      }
    });
    await rm(first, { recursive: true, force: true });
    return null;
  }

  async diskQuota(volume: Volume): Promise<{ usedBytes: number; limitBytes: number | null } | null> {
    checkVolume(volume, 'dir');
    const meta = await readMeta<DirMeta>(this.dir(volume.id));
    if (meta?.cap === undefined || meta.capBase === undefined) return null;
    const s = await statfs(this.dir(volume.id));
    return { usedBytes: Math.max(0, (s.blocks - s.bfree) * s.bsize - meta.capBase), limitBytes: meta.cap };
  }

  /** Does a disk cap hold here (for doctor; makes nothing)? */
  diskCapSupport(): ReturnType<typeof capSupport> {
    return capSupport('disk-cap');
  }

  /** exclusive = `du` of the tree (all of it: copies share nothing we can see); shared = 0. */
  /** A full copy has no cheap change record: null, so nothing on dir storage is recycled. */
  async changeMarker(volume: Volume): Promise<string | null> {
    void volume;
    return null;
  }

  async usage(volume: Volume): Promise<Usage> {
    checkVolume(volume, 'dir');
    // a capped clone costs the host its cap's file: the blocks it has
    const capped = volume.readOnly ? null : await capHostBytes(capImage(this.root, volume.id));
    return { exclusiveBytes: capped ?? (await diskBytes(join(this.dir(volume.id), 'tree'))), sharedBytes: 0 };
  }

  async gc(liveIds: Set<string>): Promise<string[]> {
    const removed: string[] = [];
    for (const id of await listIds(this.root)) {
      if (liveIds.has(id)) continue;
      for (const d of await this.locked(() => removeCapFs(this.dir(id), capImage(this.root, id))))
        removed.push(`dir: ${id}: ${d}`);
      for (const m of await unmountAll(this.dir(id))) removed.push(`dir: unmounted ${m}`);
      await removeTree(this.dir(id));
      removed.push(`dir: removed volume ${id} (${this.dir(id)})`);
    }
    for (const d of await sweepCaps(
      this.root,
      (id) => this.dir(id),
      (fn) => this.locked(fn),
    ))
      removed.push(`dir: ${d}`);
    // first copies of capped clones that a crash kept from being removed (none is in use: a
    // create renames its own, mounts, and removes it at once)
    for (const name of await readdir(join(this.root, '.trash')).catch(orElse([] as string[], 'readdir', 'ENOENT'))) {
      const pid = Number(name.split('-')[1]);
      if (pid && (await pidAlive(pid))) continue; // a create moving its copy out now
      await rm(join(this.root, '.trash', name), { recursive: true, force: true });
      removed.push(`dir: removed ${join(this.root, '.trash', name)}`);
    }
    return removed;
  }

  /** The mount lock: init() in one process and a create or removal in another never mount the same thing twice. */
  private locked<T>(fn: () => Promise<T>): Promise<T> {
    return withLock(join(this.root, '.mount.lock'), fn);
  }

  private dir(id: string): string {
    return join(this.root, id);
  }

  private async create(src: string, readOnly: boolean, name?: string): Promise<Volume> {
    const id = newId();
    const tree = join(this.dir(id), 'tree');
    try {
      await mkdir(this.dir(id), { recursive: true });
      await copyTree(src, tree);
      // meta.json after the copy: init() must not bind-mount read-only a tree still being copied
      await writeMeta(this.dir(id), name === undefined ? { readOnly } : { readOnly, name });
      if (readOnly) await this.makeReadOnly(tree);
    } catch (e) {
      await unmountAll(this.dir(id))
        .then(() => removeTree(this.dir(id)))
        .catch(noted(`remove half-made volume ${id}`, 'ENOENT'));
      throw e;
    }
    return { kind: 'dir', id, path: tree, readOnly, ref: name === undefined ? {} : { name } };
  }

  private async makeReadOnly(tree: string): Promise<void> {
    await this.locked(async () => {
      if (!(await exists(tree)) || (await isMountPoint(tree))) return;
      // util-linux applies "-o ro" to a bind mount with a second (remount) mount(2) call.
      await run('mount', ['--bind', '-o', 'ro', tree, tree]);
    });
  }
}
