import { join } from 'node:path';
import { SnaplabError } from '../../errors.js';
import type { Availability } from '../../host/probe-types.js';
import { HostOpError, HostOps } from '../../host/hostops.js';
import { run } from '../../host/run.js';
import { toolsVerdict } from '../../host/tools.js';
import type { StorageBackend, Usage, Volume } from '../backend.js';
import { checkVolume } from '../meta.js';
import { unmountAll } from '../mounts.js';
import { copyTree, exists, kernelHasFs, listIds, newId, removeTree } from '../tree.js';
import { ensurePool, poolLayout, poolMounted, type PoolLayout } from './pool.js';

/**
 * Images and snapshots are read-only subvolumes, clones writable subvolume snapshots: a clone or a
 * snapshot costs one `btrfs subvolume snapshot` whatever the tree's size, and a volume can be
 * deleted whatever was made from it (extents are reference-counted). Volumes live in
 * `<volumes>/<id>` (see pool.ts) and Volume.ref is empty: the id and home are enough.
 */
export class BtrfsBackend implements StorageBackend {
  readonly kind = 'btrfs' as const;
  private layout: PoolLayout | undefined;

  constructor(readonly home: string) {}

  async probe(): Promise<Availability> {
    try {
      const missing = await toolsVerdict('btrfs', 'btrfs storage');
      if (missing) return missing;
      if (!(await kernelHasFs('btrfs'))) return { ok: false, reason: 'btrfs not in /proc/filesystems', fix: 'modprobe btrfs' };
      const layout = await this.where();
      if (!layout.image) return { ok: true, reason: `${this.home} is on btrfs: subvolumes in ${layout.volumes}` };
      if (layout.mountPoint && (await poolMounted(layout.mountPoint))) {
        return { ok: true, reason: `pool ${layout.image} mounted at ${layout.mountPoint}` };
      }
      if (!(await exists('/dev/loop-control'))) {
        return { ok: false, reason: '/dev/loop-control missing: no loop devices for the pool file', fix: 'modprobe loop' };
      }
      return { ok: true, reason: `${this.home} is not on btrfs: init() makes or remounts a pool on loop file ${layout.image}` };
    } catch (e) {
      return { ok: false, reason: `probe failed: ${(e as Error).message}` };
    }
  }

  /** Makes or remounts the pool when ${home} is not on btrfs. */
  async init(): Promise<void> {
    this.layout = undefined;
    await ensurePool(this.home, await this.where());
  }

  async importImage(srcDir: string, name: string): Promise<Volume> {
    void name; // the lab keeps names; a subvolume needs none
    const path = await this.pathOf(newId());
    await this.btrfs(['subvolume', 'create', path]);
    try {
      await copyTree(srcDir, path);
      await this.btrfs(['property', 'set', '-ts', path, 'ro', 'true']);
    } catch (e) {
      await this.remove(path).catch(() => undefined);
      throw e;
    }
    return this.volume(path, true);
  }

  async clone(base: Volume): Promise<Volume> {
    checkVolume(base, 'btrfs');
    const path = await this.pathOf(newId());
    await this.snap(await this.pathOf(base.id), path, false);
    return this.volume(path, false);
  }

  async snapshot(volume: Volume): Promise<Volume> {
    checkVolume(volume, 'btrfs');
    const path = await this.pathOf(newId());
    await this.snap(await this.pathOf(volume.id), path, true);
    return this.volume(path, true);
  }

  async delete(volume: Volume): Promise<void> {
    checkVolume(volume, 'btrfs');
    await this.remove(await this.pathOf(volume.id));
  }

  /**
   * `btrfs filesystem du -s --raw` after a sync (delayed allocation: unwritten data has no
   * extents yet): exclusive = extents only this subvolume references, shared = "set shared",
   * extents it shares with other subvolumes (its base, its snapshots). No quota groups needed.
   * Files small enough to be inlined in metadata (< ~2 KiB) count as 0: du counts data extents.
   */
  async usage(volume: Volume): Promise<Usage> {
    checkVolume(volume, 'btrfs');
    const path = await this.pathOf(volume.id);
    await run('sync', ['-f', path]);
    const r = await this.btrfs(['filesystem', 'du', '-s', '--raw', path]);
    const last = r.stdout.trim().split('\n').pop() ?? '';
    const [, exclusive, shared] = last.trim().split(/\s+/);
    return { exclusiveBytes: Number(exclusive) || 0, sharedBytes: Number(shared) || 0 };
  }

  /**
   * The subvolume's generation and ctransid after a syncfs (so that writes not yet committed
   * count): any write, create, delete or metadata change moves them. The pool is mounted noatime,
   * so reads do not. Without the helper: null (cannot tell cheaply).
   */
  async changeMarker(volume: Volume): Promise<string | null> {
    checkVolume(volume, 'btrfs');
    const ops = HostOps.get();
    if (!ops) return null;
    return (await ops.request('btrfs-changes', await this.pathOf(volume.id)))[0] ?? null;
  }

  /** Deletes subvolumes whose ids are not live; mounts the pool first if it exists but is not. */
  async gc(liveIds: Set<string>): Promise<string[]> {
    const layout = await this.where();
    if (layout.image && !(await exists(layout.image))) return [];
    if (layout.image) await this.init();
    const removed: string[] = [];
    for (const id of await listIds(layout.volumes)) {
      if (liveIds.has(id)) continue;
      await this.remove(join(layout.volumes, id));
      removed.push(`btrfs: deleted subvolume ${id} (${join(layout.volumes, id)})`);
    }
    return removed;
  }

  private async where(): Promise<PoolLayout> {
    this.layout ??= await poolLayout(this.home);
    return this.layout;
  }

  private async pathOf(id: string): Promise<string> {
    return join((await this.where()).volumes, id);
  }

  private volume(path: string, readOnly: boolean): Volume {
    return { kind: 'btrfs', id: path.slice(path.lastIndexOf('/') + 1), path, readOnly, ref: {} };
  }

  private async remove(path: string): Promise<void> {
    if (!(await exists(path))) return;
    await unmountAll(path);
    const ops = HostOps.get();
    if (ops) {
      try {
        await ops.request('btrfs-delete', path);
        return;
      } catch (e) {
        if (!(e instanceof HostOpError)) throw e;
        // anything unexpected: let the btrfs tool try, and report in its words
      }
    }
    const r = await run('btrfs', ['subvolume', 'delete', path], { allowFail: true });
    // not a subvolume: a crash between mkdir and subvolume create cannot happen, but be thorough
    if (r.code !== 0 && (await exists(path))) {
      if (/not a (btrfs )?subvolume/i.test(r.stderr)) await removeTree(path);
      else throw new SnaplabError('STORAGE_FAILED', `btrfs subvolume delete ${path}: ${r.stderr.trim()}`, 'a subvolume made inside it must be deleted first (btrfs subvolume list -o)');
    }
  }

  /**
   * A subvolume snapshot by ioctl through the resident helper (about 1-2 ms), or by the btrfs tool
   * (4-10 ms more: spawning it is most of the cost) where the helper is not built.
   */
  private async snap(src: string, dst: string, readOnly: boolean): Promise<void> {
    const ops = HostOps.get();
    if (!ops) {
      await this.btrfs(['subvolume', 'snapshot', ...(readOnly ? ['-r'] : []), src, dst]);
      return;
    }
    try {
      await ops.request('btrfs-snapshot', src, dst, readOnly ? '1' : '0');
    } catch (e) {
      await this.explainUnmounted(e);
      throw new SnaplabError('STORAGE_FAILED', `btrfs snapshot ${src} → ${dst}: ${(e as Error).message}`, undefined, { cause: e });
    }
  }

  private async explainUnmounted(e: unknown): Promise<void> {
    const { image, mountPoint } = await this.where();
    if (image && mountPoint && !(await poolMounted(mountPoint))) {
      throw new SnaplabError('STORAGE_UNAVAILABLE', `btrfs pool ${image} is not mounted at ${mountPoint}`, 'call init() (snaplab does on start)', { cause: e });
    }
  }

  /** Run btrfs; when it fails because the pool is not mounted, say so rather than ENOENT. */
  private async btrfs(args: string[]) {
    try {
      return await run('btrfs', args);
    } catch (e) {
      await this.explainUnmounted(e);
      throw new SnaplabError('STORAGE_FAILED', (e as Error).message, undefined, { cause: e });
    }
  }
}
