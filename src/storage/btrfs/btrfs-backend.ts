import { existsSync } from 'node:fs';
import { readdir, unlink, writeFile } from 'node:fs/promises';
import { constants } from 'node:os';
import { join } from 'node:path';
import { SnaplabError } from '../../errors.js';
import type { Availability } from '../../host/probe-types.js';
import { HostOpError, HostOps } from '../../host/hostops.js';
import { run } from '../../host/run.js';
import { toolsVerdict } from '../../host/tools.js';
import type { StorageBackend, Usage, Volume } from '../backend.js';
import { checkVolume } from '../meta.js';
import { unmountAll } from '../mounts.js';
import { copyTree, exists, isVolumeId, kernelHasFs, listIds, newId, removeTree } from '../tree.js';
import { ensurePool, poolLayout, poolMounted, type PoolLayout } from './pool.js';
import { noted, orElse } from '../../cleanup.js';

/** In the pool's root: no subvolume was deleted since a sweep found no stale qgroup (dropStaleQgroups). */
const QGROUPS_CLEAN = '.qgroups-clean';

/**
 * Writable snapshots are made in one of these directories of `<volumes>` and renamed into place:
 * btrfs makes a snapshot under its parent directory's lock and commits the transaction before it
 * lets go, so concurrent creates made side by side each committed alone; from directories of their
 * own they share commits (docs/architecture.md "Density"). Names start with a dot: never a volume id.
 */
const STAGE_PREFIX = '.stage-';
const STAGES = 16;
/** stages this process has a snapshot in now; its first choice differs from another process's */
const staging = new Set<number>();
const stageOffset = process.pid % STAGES;
/** false once the host helper answered that it has no btrfs-clone (one built before it) */
let stagedClones = true;
/** the errno of a helper's answer to an op it does not know */
const { ENOSYS } = constants.errno;

/** A stage no snapshot of this process is in, or undefined when all are (one made in place then). */
function takeStage(): number | undefined {
  for (let i = 0; i < STAGES; i++) {
    const n = (stageOffset + i) % STAGES;
    if (!staging.has(n)) {
      staging.add(n);
      return n;
    }
  }
  return undefined;
}

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
      if (!(await kernelHasFs('btrfs')))
        return {
          ok: false,
          reason: 'the kernel has no btrfs: not in /proc/filesystems, and `modprobe btrfs` could not load it',
          fix: 'apt-get install kmod, or a kernel with btrfs (CONFIG_BTRFS_FS)',
        };
      const layout = await this.where();
      if (!layout.image) return { ok: true, reason: `${this.home} is on btrfs: subvolumes in ${layout.volumes}` };
      if (layout.mountPoint && (await poolMounted(layout.mountPoint))) {
        return { ok: true, reason: `pool ${layout.image} mounted at ${layout.mountPoint}` };
      }
      if (!(await exists('/dev/loop-control'))) {
        return {
          ok: false,
          reason: '/dev/loop-control missing: no loop devices for the pool file',
          fix: 'modprobe loop',
        };
      }
      return {
        ok: true,
        reason: `${this.home} is not on btrfs: init() makes or remounts a pool on loop file ${layout.image}`,
      };
    } catch (e) {
      return { ok: false, reason: `probe failed: ${(e as Error).message}` };
    }
  }

  /**
   * Makes or remounts the pool when ${home} is not on btrfs, and turns on simple quotas in a pool
   * of snaplab's own (never on a btrfs of the user's: the feature flag it sets is for good, and
   * kernels before 6.7 cannot mount the filesystem after it; there a cap holds if the user turned
   * quotas on). Without simple quotas (an older kernel, no helper) a disk cap is not enforced.
   */
  async init(): Promise<void> {
    this.layout = undefined;
    const layout = await this.where();
    await ensurePool(this.home, layout);
    this.quotaOff = undefined;
    const ops = HostOps.get();
    if (!layout.mountPoint) return;
    // (to measure what quotas cost: a pool made with this set never has them turned on)
    if (process.env.SNAPLAB_DISK_QUOTAS === 'off') return void (this.quotaOff = 'SNAPLAB_DISK_QUOTAS=off');
    if (!ops) return void (this.quotaOff = 'the host helper (snaplab-hostops) is not built: run `npm run build`');
    await ops.request('btrfs-squota', layout.mountPoint).catch((e: unknown) => {
      this.quotaOff = `simple quotas cannot be turned on in ${layout.mountPoint} (${(e as Error).message}): they need Linux 6.7 or newer`;
    });
  }

  /** Does a disk cap hold here (for doctor; makes nothing)? */
  async diskCapSupport(): Promise<Availability> {
    if (!existsSync('/sys/fs/btrfs/features/simple_quota'))
      return {
        ok: false,
        reason:
          "this kernel has no btrfs simple quotas (Linux 6.7 or newer has): --disk is refused, no default cap, and API keys' disk ceilings do not apply",
        fix: 'a newer kernel',
      };
    if (process.env.SNAPLAB_NO_HOSTOPS === '1' || !existsSync(HostOps.binaryPath()))
      return { ok: false, reason: 'the host helper (snaplab-hostops) is not built', fix: 'npm run build' };
    const layout = await this.where();
    if (!layout.image)
      return {
        ok: true,
        reason: `${this.home} is on a btrfs of yours: a cap holds where you turned quotas on (btrfs quota enable --simple); snaplab does not turn them on there`,
      };
    return {
      ok: true,
      reason:
        "simple quotas in snaplab's pool: each machine's writes counted against its --disk (default 4 GiB); writes past it fail with EDQUOT",
    };
  }

  /** why a disk cap is not enforced here, when init() found out */
  private quotaOff: string | undefined;

  diskCapOff(): string | null {
    return this.quotaOff ?? null;
  }

  async limitDisk(volume: Volume, bytes: number): Promise<string | null> {
    checkVolume(volume, 'btrfs');
    if (this.quotaOff) return this.quotaOff;
    const ops = HostOps.get();
    if (!ops) return 'the host helper (snaplab-hostops) is not built: run `npm run build`';
    try {
      if (!Number.isSafeInteger(bytes) || bytes < 0)
        throw new SnaplabError('BAD_SIZE', `invalid disk cap ${bytes}`, 'give whole bytes');
      await ops.request('btrfs-limit', await this.pathOf(volume.id), String(bytes));
      return null;
    } catch (e) {
      if (e instanceof HostOpError && e.errno === 107 /* ENOTCONN: quotas off */)
        return `quotas are off on the btrfs under ${this.home} (snaplab turns them on only in a pool of its own)`;
      throw new SnaplabError(
        'STORAGE_FAILED',
        `cannot cap the disk of volume ${volume.id}: ${(e as Error).message}`,
        undefined,
        { cause: e },
      );
    }
  }

  async diskQuota(volume: Volume): Promise<{ usedBytes: number; limitBytes: number | null } | null> {
    checkVolume(volume, 'btrfs');
    const ops = HostOps.get();
    if (!ops) return null;
    try {
      const [used, limit] = await ops.request('btrfs-quota', await this.pathOf(volume.id));
      return { usedBytes: Number(used), limitBytes: Number(limit) || null };
    } catch {
      return null; // quotas off, or no qgroup for it
    }
  }

  async importImage(srcDir: string, name: string): Promise<Volume> {
    void name; // the lab keeps names; a subvolume needs none
    const path = await this.pathOf(newId());
    await this.btrfs(['subvolume', 'create', path]);
    try {
      await copyTree(srcDir, path);
      await this.btrfs(['property', 'set', '-ts', path, 'ro', 'true']);
    } catch (e) {
      await this.remove(path).catch(noted(`remove half-made subvolume ${path}`));
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
    const names = await readdir(layout.volumes).catch(orElse([] as string[], 'readdir', 'ENOENT'));
    for (const id of names.filter(isVolumeId).sort()) {
      if (liveIds.has(id)) continue;
      await this.remove(join(layout.volumes, id));
      removed.push(`btrfs: deleted subvolume ${id} (${join(layout.volumes, id)})`);
    }
    // a staged snapshot is there only while its clone runs (gc collects when none is in flight):
    // one found now was left by a process killed between the snapshot and its rename
    for (const stage of names) {
      if (!stage.startsWith(STAGE_PREFIX)) continue;
      for (const id of await listIds(join(layout.volumes, stage))) {
        await this.remove(join(layout.volumes, stage, id));
        removed.push(
          `btrfs: deleted subvolume ${id} left staged by an interrupted clone (${join(layout.volumes, stage, id)})`,
        );
      }
    }
    // not listed among what gc removed: these are the kernel's bookkeeping after ordinary deletes
    // (a qgroup waits for its extents to be freed), not something a failure left behind
    if (layout.mountPoint) await this.dropStaleQgroups(layout.mountPoint);
    return removed;
  }

  /**
   * The qgroups of deleted subvolumes that hold nothing any more. The kernel removes a deleted
   * machine's qgroup itself when nothing it wrote is left; when a snapshot still shared its
   * extents, the qgroup stays ("stale") after the snapshot goes too. Only in snaplab's own pool.
   * Only a delete makes one, so the pool keeps a mark (QGROUPS_CLEAN) that a sweep which found no
   * stale qgroup writes and every delete removes first: a gc after no delete does not ask (`qgroup
   * show` resolves every subvolume's path: ~70 ms at 1 000 here, and it grows with them).
   */
  private async dropStaleQgroups(mountPoint: string): Promise<string[]> {
    const clean = join(mountPoint, QGROUPS_CLEAN);
    if (await exists(clean)) return [];
    // marked before the look: a delete meanwhile (another process) removes the mark after this
    // writes it, so a sweep that found nothing never hides a qgroup made while it looked
    await writeFile(clean, '', { mode: 0o600 });
    const r = await run('btrfs', ['qgroup', 'show', '--raw', mountPoint], { allowFail: true });
    if (r.code !== 0) return []; // quotas off
    const done: string[] = [];
    let stale = 0;
    for (const line of r.stdout.split('\n')) {
      const [id, rfer, , path] = line.trim().split(/\s+/);
      // `<stale>`, and in newer btrfs-progs `<under deletion>` (not `<toplevel>`, the pool's own)
      if (!id || !/^0\/\d+$/.test(id) || (path !== '<stale>' && path !== '<under')) continue;
      stale++;
      // (one whose extents the kernel has not freed yet is left for a later sweep)
      if (rfer !== '0') continue;
      const d = await run('btrfs', ['qgroup', 'destroy', id, mountPoint], { allowFail: true });
      if (d.code === 0) done.push(`btrfs: removed the empty qgroup ${id} of a deleted volume`);
    }
    // one left for later keeps the next gc looking
    if (stale > done.length) await unlink(clean).catch(noted(`unmark ${clean}`, 'ENOENT'));
    return done;
  }

  /** Before a delete: a stale qgroup may follow it (dropStaleQgroups sweeps again). */
  private async qgroupsMayGoStale(): Promise<void> {
    const { mountPoint } = await this.where();
    // a mark that cannot be removed fails the delete (record first): gc would never sweep after it
    if (mountPoint)
      await unlink(join(mountPoint, QGROUPS_CLEAN)).catch((e: NodeJS.ErrnoException) => {
        if (e.code !== 'ENOENT') throw e;
      });
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
    await this.qgroupsMayGoStale();
    try {
      await this.deleteVolume(path);
    } finally {
      // and after: a gc that swept while this deleted may have marked the pool clean meanwhile
      await this.qgroupsMayGoStale();
    }
  }

  private async deleteVolume(path: string): Promise<void> {
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
      else
        throw new SnaplabError(
          'STORAGE_FAILED',
          `btrfs subvolume delete ${path}: ${r.stderr.trim()}`,
          'a subvolume made inside it must be deleted first (btrfs subvolume list -o)',
        );
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
    // a read-only subvolume cannot be moved: made in place; so is a clone where the helper is
    // older than its btrfs-clone
    const stage = readOnly || !stagedClones ? undefined : takeStage();
    try {
      if (stage !== undefined) {
        try {
          await ops.request('btrfs-clone', src, dst, join(dst, '..', `${STAGE_PREFIX}${stage}`));
          return;
        } catch (e) {
          if (!(e instanceof HostOpError && e.errno === ENOSYS)) {
            // the helper deletes a staged snapshot it could not move: a delete, which may leave a qgroup
            // (the helper's reason is what the caller hears, whatever the mark's removal says)
            await this.qgroupsMayGoStale().catch(noted('mark the pool for a stale-qgroup sweep'));
            throw e;
          }
          stagedClones = false;
        }
      }
      await ops.request('btrfs-snapshot', src, dst, readOnly ? '1' : '0');
    } catch (e) {
      await this.explainUnmounted(e);
      throw new SnaplabError('STORAGE_FAILED', `btrfs snapshot ${src} → ${dst}: ${(e as Error).message}`, undefined, {
        cause: e,
      });
    } finally {
      if (stage !== undefined) staging.delete(stage);
    }
  }

  private async explainUnmounted(e: unknown): Promise<void> {
    const { image, mountPoint } = await this.where();
    if (image && mountPoint && !(await poolMounted(mountPoint))) {
      throw new SnaplabError(
        'STORAGE_UNAVAILABLE',
        `btrfs pool ${image} is not mounted at ${mountPoint}`,
        'call init() (snaplab does on start)',
        { cause: e },
      );
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
