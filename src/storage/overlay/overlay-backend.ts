import { existsSync } from 'node:fs';
import { mkdir, readdir, rm, stat, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { SnaplabError } from '../../errors.js';
import type { Availability } from '../../host/probe-types.js';
import { mountFs } from '../../host/mounts.js';
import type { StorageBackend, Usage, Volume } from '../backend.js';
import { withLock } from '../../host/lock.js';
import { checkVolume, readMeta, writeMeta } from '../meta.js';
import { isMountPoint, readMounts, unmountAll } from '../mounts.js';
import { copyTree, diskBytes, isVolumeId, listIds, newId, removeTree } from '../tree.js';
import { layerDir, layerUsers, MAX_LAYERS, overlayOptions, type OverlayMeta } from './layers.js';
import { moveXattrs } from './xattrs.js';
import { probeOverlay } from './probe.js';
import {
  capHostBytes,
  capImage,
  capSupport,
  capUsage,
  checkCapMounted,
  mountCapFs,
  prepareSeededCapImage,
  remountCapFs,
  removeCapFs,
  sweepCaps,
} from '../cap-fs.js';
import { noted, orElse } from '../../cleanup.js';

/**
 * Copy-on-write with overlayfs on any filesystem. Layout under `${home}/storage/overlay/<id>/`:
 * `layer/` (images and snapshots of clones: a read-only layer they own), `upper/` + `work/`
 * (clones), `merged/` (every volume's path: the overlay mount), `meta.json`. Read-only volumes
 * are overlays without an upper dir, which the kernel mounts read-only. Ownership rules: layers.ts.
 */
export class OverlayBackend implements StorageBackend {
  readonly kind = 'overlay' as const;
  /** a cap is a filesystem per machine (cap-fs.ts): made when asked for, not by default */
  readonly capsByDefault = false;
  private readonly root: string;
  /** overlay wants two lower dirs when there is no upper: a one-layer view adds this empty one */
  private readonly empty: string;

  constructor(readonly home: string) {
    this.root = join(home, 'storage', 'overlay');
    this.empty = join(this.root, '.empty');
  }

  /** A real test mount: the only honest answer for overlay on whatever fs holds ${home}. */
  probe(): Promise<Availability> {
    return probeOverlay(this.home, this.root);
  }

  /** Also remounts volumes whose overlay mount a reboot took away. */
  async init(): Promise<void> {
    await mkdir(this.empty, { recursive: true });
    await this.moveToUserXattrs();
    // what is mounted, read once: the lock is taken only for a volume that has something to mount
    // (every snaplab process runs this; most find nothing to do)
    const mounted = new Set((await readMounts()).map((m) => m.target));
    for (const id of await listIds(this.root)) {
      const dir = this.dir(id);
      const capMissing = existsSync(capImage(this.root, id)) && !mounted.has(resolve(dir));
      const meta = capMissing ? undefined : await readMeta<OverlayMeta>(dir);
      if (!capMissing && !(meta && !meta.inNamespace && !mounted.has(resolve(dir, 'merged')))) continue;
      // one broken volume (a layer gone, a cap e2fsck cannot fix) must not stop the others; gc
      // removes it if not live, and what reads a capped one unmounted says so (checkCapMounted)
      await this.locked(async () => {
        // a capped volume's own filesystem first: its upper and work dirs are in it
        await remountCapFs(dir, capImage(this.root, id));
        const now = await readMeta<OverlayMeta>(dir);
        if (now && !now.inNamespace) await this.mountUnlocked(id, now);
      }).catch(noted(`mount volume ${id} again`));
    }
  }

  /**
   * Layers and upper dirs written before every mount was `userxattr` (OVERLAY_XATTRS) hold
   * trusted.overlay.* marks: moved to user.overlay.* once per home (the marker file says done).
   * A volume mounted the old way when this runs (a sandbox of an older snaplab still up)
   * keeps running; what it writes is moved when it is snapshotted (a new layer is always moved).
   */
  private async moveToUserXattrs(): Promise<void> {
    const marker = join(this.root, '.userxattr');
    if (existsSync(marker)) return;
    await withLock(join(this.root, '.mount.lock'), async () => {
      if (existsSync(marker)) return;
      for (const id of await listIds(this.root)) await moveXattrs(this.dir(id));
      await writeFile(marker, 'overlay marks are user.overlay.* xattrs (userxattr)\n');
    });
  }

  async importImage(srcDir: string, name: string): Promise<Volume> {
    const id = newId();
    return this.building(id, async () => {
      await mkdir(this.dir(id), { recursive: true });
      const meta: OverlayMeta = { role: 'image', layers: [id], readOnly: true, name };
      // meta.json last, here and in snapshot(): init() must not mount a half-copied layer
      await copyTree(srcDir, layerDir(this.root, id));
      await writeMeta(this.dir(id), meta);
      return this.finish(id, meta);
    });
  }

  /**
   * With `mountOnHost: false` the clone is not mounted on the host: a sandbox in a user namespace
   * mounts it inside (an overlay mount cannot be idmapped; one made by the namespace's root over
   * idmapped layers can, see native/userns.c). Two mounts may not share an upper dir, so the host
   * then reads it only through its layers (snapshot, usage, changeMarker already do).
   */
  async clone(base: Volume, opts: { mountOnHost?: boolean } = {}): Promise<Volume> {
    const layers = this.layersOf(base);
    if (!base.readOnly) {
      // its upper dir is not a layer: cloning it would silently drop the base's changes
      throw new SnaplabError(
        'BAD_INPUT',
        `overlay volume ${base.id} is writable: clone a snapshot of it`,
        'snapshot the volume, then clone the snapshot',
      );
    }
    const id = newId();
    return this.building(id, async () => {
      for (const d of ['upper', 'work', 'merged']) await mkdir(join(this.dir(id), d), { recursive: true });
      const meta: OverlayMeta = {
        role: 'clone',
        layers: [...layers],
        readOnly: false,
        ...(opts.mountOnHost === false ? { inNamespace: true } : {}),
      };
      // meta.json first: from here on a delete of a base layer sees this clone as its user
      await writeMeta(this.dir(id), meta);
      return this.finish(id, meta);
    });
  }

  async snapshot(volume: Volume): Promise<Volume> {
    const layers = this.layersOf(volume);
    await checkCapMounted(this.dir(volume.id), capImage(this.root, volume.id));
    const id = newId();
    return this.building(id, async () => {
      await mkdir(this.dir(id), { recursive: true });
      let meta: OverlayMeta;
      if (volume.readOnly) {
        // nothing can change under a read-only volume: share its layers, copy nothing
        meta = { role: 'snapshot', layers: [...layers], readOnly: true };
        await writeMeta(this.dir(id), meta);
      } else if (layers.length + 1 > MAX_LAYERS) {
        // overlay options must fit in a page and stacks slow lookups: flatten deep chains
        meta = { role: 'snapshot', layers: [id], readOnly: true };
        await this.withMergedView(volume, (merged) => copyTree(merged, layerDir(this.root, id)));
        await moveXattrs(layerDir(this.root, id));
        await writeMeta(this.dir(id), meta);
      } else {
        // the upper dir holds exactly the clone's changes, whiteouts and opaque marks included
        meta = { role: 'snapshot', layers: [id, ...layers], readOnly: true };
        await copyTree(join(this.dir(volume.id), 'upper'), layerDir(this.root, id));
        // an upper dir of a mount made before userxattr holds trusted.overlay.* marks
        await moveXattrs(layerDir(this.root, id));
        await writeMeta(this.dir(id), meta);
      }
      return this.finish(id, meta);
    });
  }

  async delete(volume: Volume): Promise<void> {
    checkVolume(volume, 'overlay');
    const owns = this.layersOf(volume)[0] === volume.id;
    // the users looked for under the mount lock, as a cap is made under it: a clone's meta.json
    // is never out of sight while its layer's delete looks
    await this.locked(async () => {
      const users = owns ? await layerUsers(this.root, volume.id, volume.id) : [];
      if (users.length > 0) {
        throw new SnaplabError(
          'STORAGE_FAILED',
          `overlay volume ${volume.id} cannot be deleted: its layer is still stacked by ${users.join(', ')}`,
          'delete the sandboxes and snapshots made from it first',
        );
      }
      await this.teardownUnlocked(volume.id);
    });
    await removeTree(this.dir(volume.id));
  }

  /**
   * The clone's directory becomes a filesystem of `bytes` of its own (cap-fs.ts), before anything
   * is written to its upper dir; an overlay already mounted on the host is mounted again over it.
   */
  async limitDisk(volume: Volume, bytes: number): Promise<string | null> {
    checkVolume(volume, 'overlay');
    if (volume.readOnly)
      throw new SnaplabError('BAD_INPUT', `overlay volume ${volume.id} is read-only: only a clone takes a disk cap`);
    if (bytes === 0) return null;
    const dir = this.dir(volume.id);
    const meta = await readMeta<OverlayMeta>(dir);
    if (!meta) throw new SnaplabError('STORAGE_FAILED', `overlay volume ${volume.id} has no meta.json`);
    const image = capImage(this.root, volume.id);
    // view: the flattening snapshot's read-only mount point, made while there is room
    const tmp = await prepareSeededCapImage(dir, image, bytes, {
      files: ['meta.json'],
      dirs: ['upper', 'work', 'merged', 'view'],
    });
    await this.locked(async () => {
      const merged = join(dir, 'merged');
      if (await isMountPoint(merged)) await unmountAll(merged); // mounted again on the cap, below
      try {
        await mountCapFs(dir, tmp, image, ['upper', 'work', 'merged']);
      } finally {
        // on the cap, or, when it failed, as it was
        if (!meta.inNamespace)
          await this.mountUnlocked(volume.id, meta).catch(noted(`mount volume ${volume.id} again`));
      }
      if (!meta.inNamespace && !(await isMountPoint(merged)))
        throw new SnaplabError('STORAGE_FAILED', `cannot mount overlay volume ${volume.id} on its disk cap`);
    });
    return null;
  }

  /** Does a disk cap hold here (for doctor; makes nothing)? */
  diskCapSupport(): Promise<Availability> {
    return capSupport('disk-cap');
  }

  async diskQuota(volume: Volume): Promise<{ usedBytes: number; limitBytes: number | null } | null> {
    checkVolume(volume, 'overlay');
    return capUsage(this.dir(volume.id), capImage(this.root, volume.id));
  }

  /**
   * exclusive = `du` of what only this volume holds: a clone's upper dir, or the layer an image
   * or snapshot owns (0 for a snapshot that only references layers); shared = `du` of the lower
   * layers it stacks, which other volumes may stack too.
   */
  /**
   * Every change through an overlay mount lands in its upper dir at once (copy-up, whiteouts,
   * new files). An empty upper dir means the volume is its base; a non-empty one gets a value
   * that never repeats, since a change below an entry already there would not show at the top.
   */
  async changeMarker(volume: Volume): Promise<string | null> {
    checkVolume(volume, 'overlay');
    if (volume.readOnly) return 'base';
    await checkCapMounted(this.dir(volume.id), capImage(this.root, volume.id));
    const upper = join(this.dir(volume.id), 'upper');
    const entries = await readdir(upper);
    if (entries.length) return `changed:${newId()}`;
    // a chmod, chown or xattr on / itself changes the upper dir, not what is in it
    const st = await stat(upper);
    return `base:${st.mode}:${st.uid}:${st.gid}:${st.ctimeMs}`;
  }

  async usage(volume: Volume): Promise<Usage> {
    const layers = this.layersOf(volume);
    const owns = layers[0] === volume.id;
    const own = volume.readOnly
      ? owns
        ? layerDir(this.root, volume.id)
        : undefined
      : join(this.dir(volume.id), 'upper');
    const lower = owns ? layers.slice(1) : layers;
    let sharedBytes = 0;
    for (const l of lower) sharedBytes += await diskBytes(layerDir(this.root, l));
    // a capped clone costs the host its cap's file: the blocks it has (discard gives freed ones back)
    const capped = volume.readOnly ? null : await capHostBytes(capImage(this.root, volume.id));
    return { exclusiveBytes: capped ?? (own ? await diskBytes(own) : 0), sharedBytes };
  }

  /**
   * Removes volumes not in `liveIds`, except owners of layers that a live volume still stacks
   * (those stay until their last live user is gone). Unmounts first, then removes, so that no
   * layer is removed under a mount that is about to go.
   */
  async gc(liveIds: Set<string>): Promise<string[]> {
    const removed: string[] = [];
    const ids = await listIds(this.root);
    const needed = new Set<string>();
    for (const id of ids.filter((i) => liveIds.has(i))) {
      for (const l of (await readMeta<OverlayMeta>(this.dir(id)))?.layers ?? []) needed.add(l);
    }
    const doomed = ids.filter((i) => !liveIds.has(i) && !needed.has(i));
    for (const id of doomed) for (const d of await this.teardown(id)) removed.push(`overlay: ${id}: ${d}`);
    for (const id of doomed) {
      await removeTree(this.dir(id));
      removed.push(`overlay: removed volume ${id} (${this.dir(id)})`);
    }
    for (const d of await sweepCaps(
      this.root,
      (id) => this.dir(id),
      (fn) => this.locked(fn),
    ))
      removed.push(`overlay: ${d}`);
    // test mounts of a probe that died half-way (not one running now: probes take milliseconds)
    for (const name of (await readdir(this.root).catch(orElse([] as string[], 'readdir', 'ENOENT'))).filter((n) =>
      n.startsWith('.probe-'),
    )) {
      const age = await stat(join(this.root, name)).then(
        (st) => Date.now() - st.mtimeMs,
        () => 0,
      );
      if (age < 60_000) continue;
      for (const m of await unmountAll(join(this.root, name))) removed.push(`overlay: unmounted ${m}`);
      await removeTree(join(this.root, name));
      removed.push(`overlay: removed probe leftover ${join(this.root, name)}`);
    }
    return removed;
  }

  /** Run the steps that make volume `id`; if one fails, leave nothing of it behind. */
  private async building(id: string, fn: () => Promise<Volume>): Promise<Volume> {
    try {
      return await fn();
    } catch (e) {
      await unmountAll(this.dir(id))
        .then(() => removeTree(this.dir(id)))
        .catch(noted(`remove half-made volume ${id}`, 'ENOENT'));
      throw e;
    }
  }

  private dir(id: string): string {
    return join(this.root, id);
  }

  private layersOf(v: Volume): string[] {
    checkVolume(v, 'overlay');
    const layers = v.ref.layers;
    if (!Array.isArray(layers) || !layers.every((l) => typeof l === 'string' && isVolumeId(l))) {
      throw new SnaplabError(
        'BAD_INPUT',
        `overlay volume ${v.id} has no valid ref.layers`,
        'pass the Volume record this backend returned, unchanged',
      );
    }
    return layers as string[];
  }

  stack(volume: Volume): { lowers: string[]; upper: string; work: string } {
    checkVolume(volume, 'overlay');
    return {
      lowers: this.layersOf(volume).map((l) => layerDir(this.root, l)),
      upper: join(this.dir(volume.id), 'upper'),
      work: join(this.dir(volume.id), 'work'),
    };
  }

  /**
   * The merged tree of a writable volume, to read: its own mount, or, for a clone mounted only
   * inside a sandbox, a read-only overlay of its upper dir over its layers, for as long as `fn` runs.
   */
  private async withMergedView<T>(volume: Volume, fn: (merged: string) => Promise<T>): Promise<T> {
    const meta = await readMeta<OverlayMeta>(this.dir(volume.id));
    if (!meta?.inNamespace) return fn(volume.path);
    const view = join(this.dir(volume.id), 'view');
    await mkdir(view, { recursive: true });
    const s = this.stack(volume);
    await mountFs('overlay', view, 'overlay', overlayOptions([s.upper, ...s.lowers]));
    try {
      return await fn(view);
    } finally {
      await unmountAll(view);
    }
  }

  private async finish(id: string, meta: OverlayMeta): Promise<Volume> {
    if (!meta.inNamespace) await this.mount(id, meta);
    const ref = meta.name === undefined ? { layers: meta.layers } : { layers: meta.layers, name: meta.name };
    return { kind: 'overlay', id, path: join(this.dir(id), 'merged'), readOnly: meta.readOnly, ref };
  }

  /**
   * The mount lock: keeps init() in one process and a create in another from mounting twice, and
   * any process from mounting an overlay or a cap that another is making or removing.
   */
  private locked<T>(fn: () => Promise<T>): Promise<T> {
    return withLock(join(this.root, '.mount.lock'), fn);
  }

  private mount(id: string, meta: OverlayMeta): Promise<void> {
    return this.locked(() => this.mountUnlocked(id, meta));
  }

  private async mountUnlocked(id: string, meta: OverlayMeta): Promise<void> {
    const merged = join(this.dir(id), 'merged');
    const lowers = meta.layers.map((l) => layerDir(this.root, l));
    let opts: string;
    if (meta.readOnly) {
      if (lowers.length === 1) lowers.push(this.empty);
      opts = overlayOptions(lowers);
    } else {
      opts = overlayOptions(lowers, { upper: join(this.dir(id), 'upper'), work: join(this.dir(id), 'work') });
    }
    if (await isMountPoint(merged)) return;
    await checkCapMounted(this.dir(id), capImage(this.root, id));
    await mkdir(merged, { recursive: true });
    await mkdir(this.empty, { recursive: true });
    await mountFs('overlay', merged, 'overlay', opts);
  }

  /**
   * Everything of volume `id` that is mounted, its cap included, gone, and its meta.json: from here
   * no init() mounts anything of it again; what is left is a tree to remove.
   */
  private teardown(id: string): Promise<string[]> {
    return this.locked(() => this.teardownUnlocked(id));
  }

  private async teardownUnlocked(id: string): Promise<string[]> {
    // (it unmounts everything under the directory, the cap last; under the lock nothing mounts
    // anew before meta.json, which init() would read, is gone)
    const done = await removeCapFs(this.dir(id), capImage(this.root, id));
    await rm(join(this.dir(id), 'meta.json'), { force: true });
    return done;
  }
}
