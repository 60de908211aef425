import { sweepNspawnCgroups } from '../../host/cgroups/nspawn.js';
import { orphanTemplates } from '../pools/admin.js';
import { removeSnapshot } from './removals.js';
import { readdir, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { loopDevicesBackedUnder, detachLoop } from '../../host/loops.js';
import { listMounts, mountsUnder, unmount } from '../../host/mounts.js';
import { unmountPool } from '../../storage/index.js';
import type { Trace } from '../../timing/trace.js';
import type { LabContext } from '../context.js';
import type { SandboxRecord } from '../../store/records.js';
import { STORAGE_KINDS } from '../context.js';
import { collectScenarios } from '../../scenario/gc.js';
import { collecting, liveInflight, thawOrphans } from './inflight.js';
import { reconcile } from './reconcile.js';
import {
  machineOf,
  registryNames,
  releaseRange,
  removeDeadClaimWrites,
  staleClaims,
} from '../../host/userns/registry.js';
import { USERNS_SIZE } from '../../host/userns/id-ranges.js';
import { machineNetns } from '../../scenario/names.js';
import { snaplabCgroupsOf, snaplabParents, sweepProbeCgroups } from '../../host/cgroups/host.js';
import { listSnaplabNetns } from '../../host/net/netns.js';
import { collectEgress } from '../../host/net/egress.js';
import { destroyRecord } from './teardown.js';
import { noted, orElse } from '../../cleanup.js';

/** a range claimed this recently may belong to a create that has not written its record yet */
const CLAIM_GRACE_MS = 60_000;

/**
 * Remove every snaplab host object that no live record owns: cgroups (and the processes in
 * them), run directories, volumes and their mounts, and — when it holds nothing recorded — the
 * btrfs pool's mount and loop device. Returns what it removed.
 */
export async function collectGarbage(ctx: LabContext, trace: Trace): Promise<{ removed: string[]; notes: string[] }> {
  const removed: string[] = [];
  const notes: string[] = [];
  removed.push(...(await trace.phase('scenarios', () => collectScenarios(ctx))));
  // every record, read once (a daemon's start: once, not once per step); what is asked later is
  // asked of the store again at that time, a column at a time (see each)
  const records = await trace.phase('read records', async () => ctx.store.listSandboxes());
  const sandboxes = await trace.phase('reconcile', () => discardAndReconcile(ctx, records, removed));
  for (const name of await trace.phase('thaw', () => thawOrphans(ctx)))
    removed.push(`the freeze of ${name} (the snapshot that froze it ended mid-way): thawed`);
  const liveSandboxes = sandboxes.filter((s) => s.state !== 'dead');
  // run directories and cgroups are named by sandbox id whatever the driver: every driver sees every live id
  const live = new Set(liveSandboxes.map((s) => s.id));
  // asked of the store again before anything goes: a create that began after the list above was
  // read has written its record (its first step) before it makes a cgroup or a run directory, and
  // gc must not kill it (the daemon's start-up gc met fresh creates this way in the soak)
  const isLive = (id: string): boolean => {
    if (live.has(id)) return true;
    const rec = ctx.store.getSandbox(id);
    return rec !== undefined && rec.id === id && rec.state !== 'dead';
  };
  // an image volume's derived files (a VM's base disk) go with it: asked of the store at the time
  const imageVolume = (id: string): boolean => ctx.store.listImageVolumes().some((iv) => iv.volume.id === id);
  for (const [name, driver] of ctx.drivers)
    removed.push(...(await trace.phase(`driver ${name}`, () => driver.gc({ sandbox: isLive, imageVolume }))));
  // egress namespaces and rules of sandboxes it no longer records; its router when none has egress
  removed.push(...(await trace.phase('egress', () => collectEgress(ctx.home, () => ctx.store.egressSlots()))));
  // what each key's sandboxes hold, as its quota and ceilings read it: counted again from the rows
  // (a failure is told, and the rest of gc goes on: the triggers keep the totals meanwhile)
  const drifted = await trace
    .phase('key totals', async () => ctx.store.recountOwned())
    .catch((e: unknown) => {
      notes.push(`keys' held totals not counted again: ${(e as Error).message}`);
      return false;
    });
  if (drifted)
    notes.push(
      "keys' held totals had drifted from their sandboxes' records (a writer from an older snaplab): counted again",
    );
  // user namespace ranges this home claimed for sandboxes it no longer records (a crash between
  // claim and insert, a record deleted by hand): their cgroups went above, so no process holds them
  // held: asked of the store now, not of the list read at the start (a create may have finished
  // since): the holders read once here, and a claim none of them names asked of its own record
  // (one that lost its range since this read is only kept for the next pass)
  let holders: Set<string> | undefined;
  const isHeld = (id: string): boolean => {
    const machine = machineOf(id);
    if (machine) return ctx.store.listScenarios().some((x) => x.id === machine.sid);
    if ((holders ??= ctx.store.sandboxesWithRange()).has(id)) return true;
    const rec = ctx.store.getSandbox(id);
    return rec !== undefined && rec.id === id && rec.uidBase !== null;
  };
  // another home's, gone from disk: only once nothing of it runs (a sandbox's cgroup, a machine's
  // network namespace), looked up for those claims alone (the host's lists are every home's)
  let netns: Promise<Set<string>> | undefined;
  let parents: ReturnType<typeof snaplabParents> | undefined; // the mount table, read once a pass
  const running = async (id: string): Promise<boolean> => {
    const machine = machineOf(id);
    if (!machine) return (await snaplabCgroupsOf([id], await (parents ??= snaplabParents()))).length > 0;
    netns ??= listSnaplabNetns().then((l) => new Set(l));
    return (await netns).has(machineNetns(machine.sid, machine.index, machine.copy));
  };
  // the registry's names, read once (its claims' files are read below only where they must be)
  const names = await trace.phase('userns registry', () => registryNames());
  for (const f of await trace.phase('userns writes', () => removeDeadClaimWrites(names)))
    removed.push(
      /\/\.tmp-/.test(f)
        ? `unfinished user namespace claim ${f} (its process is gone)`
        : `empty split user namespace slot ${f}`,
    );
  // the ranges this home's sandboxes record are theirs: those claims are not read (a scenario's
  // machines' ranges are the scenario's, asked of its claim)
  const recorded = new Set(ctx.store.sandboxRanges().map(([base, ids]) => `${base}.${ids ?? USERNS_SIZE}`));
  const mine = (base: number, size: number): boolean => recorded.has(`${base}.${size}`);
  const stale = await trace.phase('userns claims', () =>
    staleClaims(ctx.home, names, mine, isHeld, running, CLAIM_GRACE_MS),
  );
  for (const c of stale) {
    await releaseRange(c.base, c.home, c.id, c.size);
    removed.push(
      `user namespace range ${c.base} (${machineOf(c.id) ? c.id : `sandbox ${c.id}`}${c.home === ctx.home ? '' : ` of ${c.home}, which is gone`})`,
    );
  }
  removed.push(...(await trace.phase('images', () => ctx.images.collect())));
  // what a killed bench's systemd-nspawn baseline left (host-wide, by the dead bench's pid)
  removed.push(...(await trace.phase('bench leftovers', () => sweepNspawnCgroups())));
  // doctor's probe cgroup, where a doctor was killed during its probe
  removed.push(...(await trace.phase('doctor leftovers', () => sweepProbeCgroups())));
  // volumes under gc's mark (inflight.ts): no clone, snapshot or import makes one meanwhile
  await trace.phase('volumes', () => collecting(ctx, (busy) => collectVolumes(ctx, trace, busy, removed, notes)));
  ctx.forgetReady();
  return { removed, notes };
}

/**
 * Every record checked against the host, in one pass, after what needs no check is removed:
 * standbys of a pool that no longer exists (removed while a refill was raising them), and
 * machines an interrupted reset had set aside (renamed NAME~ID) once they are dead. The records
 * left, reconciled (a record removed here is not among them).
 */
async function discardAndReconcile(
  ctx: LabContext,
  records: SandboxRecord[],
  removed: string[],
): Promise<SandboxRecord[]> {
  const pools = new Set(ctx.store.listPools().map((p) => p.name));
  const gone = new Set<string>();
  for (const s of records) {
    if (s.pool === null || pools.has(s.pool) || s.state !== 'paused') continue;
    await destroyRecord(ctx, s);
    gone.add(s.id);
    removed.push(`standby ${s.name} of removed pool ${s.pool}`);
  }
  const reconciled = await Promise.all(records.filter((s) => !gone.has(s.id)).map((s) => reconcile(ctx, s)));
  const aside = reconciled.filter((r) => r.name.includes('~') && r.state === 'dead');
  for (const r of aside) {
    await destroyRecord(ctx, r);
    removed.push(`discarded machine ${r.name}`);
  }
  return reconciled.filter((r) => !aside.includes(r));
}

/** Volumes, memory snapshots, the btrfs pool's mount and loop device that nothing records. */
async function collectVolumes(
  ctx: LabContext,
  trace: Trace,
  busy: string[],
  removed: string[],
  notes: string[],
): Promise<void> {
  if (busy.length) {
    // volumes being made are not recorded yet: leave all storage alone until they are
    notes.push(`volumes not collected: ${busy.length} operation(s) in flight (${busy.join(', ')}); run gc again later`);
    return;
  }
  // read again, after the in-flight check: a clone that finished since the list above was read
  // has recorded its volume before it lifted its mark (the soak met one deleted under its create)
  const volumeIds = new Set<string>(ctx.store.sandboxVolumeIds());
  for (const s of ctx.store.listSnapshots()) volumeIds.add(s.volume.id);
  for (const iv of ctx.store.listImageVolumes()) volumeIds.add(iv.volume.id);
  // VM pool templates whose pool is gone (kept by pool rm while a member still used them)
  for (const t of orphanTemplates(ctx)) {
    try {
      await removeSnapshot(ctx, t, trace);
      removed.push(`template ${t} of a removed pool`);
    } catch (e) {
      notes.push(`template ${t} of a removed pool not removed yet: ${(e as Error).message}`);
    }
  }
  // memory snapshots (VM driver) no record names any more
  const memoryDirs = new Set(
    ctx.store
      .listSnapshots()
      .map((x) => x.memory?.dir)
      .filter((d): d is string => !!d),
  );
  for (const d of await readdir(join(ctx.home, 'snapshots')).catch(orElse([] as string[], 'readdir', 'ENOENT'))) {
    const dir = join(ctx.home, 'snapshots', d);
    if (memoryDirs.has(dir)) continue;
    // one being written now (its snapshot began after the in-flight check above) is left alone;
    // a crash's leftover is removed once nothing in it has changed for a while
    if (Date.now() - (await newestChange(dir)) < MEMORY_DIR_GRACE_MS) {
      notes.push(
        `memory snapshot ${dir} not collected: written to in the last ${MEMORY_DIR_GRACE_MS / 1000} s; run gc again later`,
      );
      continue;
    }
    await rm(dir, { recursive: true, force: true });
    removed.push(`memory snapshot ${dir}`);
  }
  const poolWasMounted = (await mountsUnder(ctx.home)).some((m) => m.fstype === 'btrfs');
  for (const kind of STORAGE_KINDS) {
    const backend = ctx.backend(kind);
    if (!(await backend.probe()).ok) continue;
    removed.push(...(await trace.phase(`storage ${kind}`, () => backend.gc(volumeIds))));
  }
  // The btrfs pool is infrastructure while it holds anything recorded (an image, a snapshot, a
  // sandbox); an empty one is unmounted (and mounted again on demand).
  // (read now, not from the list gc began with: a create recorded since then is a user)
  const btrfsUsers =
    ctx.store.sandboxOn('btrfs') ||
    ctx.store.listSnapshots().some((s) => s.storage === 'btrfs') ||
    ctx.store.listImageVolumes().some((v) => v.storage === 'btrfs');
  if (!btrfsUsers && (await liveInflight(ctx)).length === 0) {
    await trace.phase('btrfs pool', async () => {
      await unmountPool(ctx.home).catch(noted('unmount the btrfs pool'));
      if (poolWasMounted) removed.push(`btrfs pool mount under ${ctx.home} (it holds nothing any more)`);
    });
  }
  // Last resort for anything a crashed backend left mounted below the volumes' directories.
  for (const m of await mountsUnder(`${ctx.home}/storage`)) {
    if ([...volumeIds].some((id) => m.target.includes(id))) continue;
    await unmount(m.target, { lazy: true }).catch(noted(`unmount ${m.target}`));
    removed.push(`mount ${m.target}`);
  }
  // a loop device that a mount stands on is in use (the btrfs pool; the disk cap of a live
  // overlay volume, whose backend keeps it): only those nothing is mounted from are leaks
  const inUse = new Set((await listMounts()).map((m) => m.source));
  for (const loop of await loopDevicesBackedUnder(ctx.home)) {
    if (inUse.has(loop.device)) continue;
    await detachLoop(loop.device).catch(noted(`detach ${loop.device}`));
    removed.push(`loop device ${loop.device} (${loop.backingFile})`);
  }
  ctx.forgetReady(); // before the mark is lifted: a create waiting on it mounts the pool again
}

const MEMORY_DIR_GRACE_MS = 120_000;

/** When `dir` or a file in it last changed (ms since the epoch). */
async function newestChange(dir: string): Promise<number> {
  let newest = (await stat(dir).catch(orElse(null, 'stat', 'ENOENT')))?.mtimeMs ?? 0;
  for (const f of await readdir(dir).catch(orElse([] as string[], 'readdir', 'ENOENT')))
    newest = Math.max(newest, (await stat(join(dir, f)).catch(orElse(null, 'stat', 'ENOENT')))?.mtimeMs ?? 0);
  return newest;
}
