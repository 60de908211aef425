import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import type { Availability } from '../../host/probe-types.js';
import { run } from '../../host/run.js';
import { toolsVerdict } from '../../host/tools.js';
import type { StorageBackend, Usage, Volume } from '../backend.js';
import { withLock } from '../../host/lock.js';
import { checkVolume, readMeta, writeMeta } from '../meta.js';
import { isMountPoint, unmountAll } from '../mounts.js';
import { copyTree, diskBytes, exists, listIds, newId, removeTree } from '../tree.js';

interface DirMeta {
  readOnly: boolean;
  name?: string;
}

/**
 * The baseline: every clone and snapshot is a full copy (`cp -a --reflink=auto`, so near free on
 * a filesystem with reflinks, a real copy on ext4). Layout: `${home}/storage/dir/<id>/tree` is the
 * volume, `<id>/meta.json` says what it is. Read-only volumes are the tree bind-mounted read-only
 * onto itself: we are root, so file modes alone would not stop a write.
 */
export class DirBackend implements StorageBackend {
  readonly kind = 'dir' as const;
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

  snapshot(volume: Volume): Promise<Volume> {
    checkVolume(volume, 'dir');
    return this.create(volume.path, true);
  }

  async delete(volume: Volume): Promise<void> {
    checkVolume(volume, 'dir');
    await unmountAll(this.dir(volume.id));
    await removeTree(this.dir(volume.id));
  }

  /** exclusive = `du` of the tree (all of it: copies share nothing we can see); shared = 0. */
  /** A full copy has no cheap change record: null, so nothing on dir storage is recycled. */
  async changeMarker(volume: Volume): Promise<string | null> {
    void volume;
    return null;
  }

  async usage(volume: Volume): Promise<Usage> {
    checkVolume(volume, 'dir');
    return { exclusiveBytes: await diskBytes(join(this.dir(volume.id), 'tree')), sharedBytes: 0 };
  }

  async gc(liveIds: Set<string>): Promise<string[]> {
    const removed: string[] = [];
    for (const id of await listIds(this.root)) {
      if (liveIds.has(id)) continue;
      for (const m of await unmountAll(this.dir(id))) removed.push(`dir: unmounted ${m}`);
      await removeTree(this.dir(id));
      removed.push(`dir: removed volume ${id} (${this.dir(id)})`);
    }
    return removed;
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
      await unmountAll(this.dir(id)).then(() => removeTree(this.dir(id))).catch(() => undefined);
      throw e;
    }
    return { kind: 'dir', id, path: tree, readOnly, ref: name === undefined ? {} : { name } };
  }

  private async makeReadOnly(tree: string): Promise<void> {
    // The lock keeps init() in one process and create() in another from mounting twice.
    await withLock(join(this.root, '.mount.lock'), async () => {
      if (!(await exists(tree)) || (await isMountPoint(tree))) return;
      // util-linux applies "-o ro" to a bind mount with a second (remount) mount(2) call.
      await run('mount', ['--bind', '-o', 'ro', tree, tree]);
    });
  }
}
