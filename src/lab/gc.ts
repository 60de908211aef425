import { loopDevicesBackedUnder, detachLoop } from '../host/loops.js';
import { mountsUnder, unmount } from '../host/mounts.js';
import { unmountPool } from '../storage/index.js';
import type { Trace } from '../timing/trace.js';
import type { LabContext } from './context.js';
import { STORAGE_KINDS } from './context.js';
import { reconcile } from './reconcile.js';

/**
 * Remove every snaplab host object that no live record owns: cgroups (and the processes in
 * them), run directories, volumes and their mounts, and — when no sandbox or snapshot uses it —
 * the btrfs pool's mount and loop device. Returns what it removed.
 */
export async function collectGarbage(ctx: LabContext, trace: Trace): Promise<string[]> {
  const removed: string[] = [];
  const sandboxes = await trace.phase('reconcile', async () => Promise.all(ctx.store.listSandboxes().map((s) => reconcile(ctx, s))));
  const liveSandboxes = sandboxes.filter((s) => s.state === 'running' || s.state === 'paused' || s.state === 'creating');
  for (const [name, driver] of ctx.drivers) {
    const live = new Set(liveSandboxes.filter((s) => s.driver === name).map((s) => s.id));
    removed.push(...(await trace.phase(`driver ${name}`, () => driver.gc(live))));
  }
  const volumeIds = new Set<string>();
  for (const s of sandboxes) if (s.volume) volumeIds.add(s.volume.id);
  for (const s of ctx.store.listSnapshots()) volumeIds.add(s.volume.id);
  for (const iv of ctx.store.listImageVolumes()) volumeIds.add(iv.volume.id);
  for (const kind of STORAGE_KINDS) {
    const backend = ctx.backend(kind);
    if (!(await backend.probe()).ok) continue;
    removed.push(...(await trace.phase(`storage ${kind}`, () => backend.gc(volumeIds))));
  }
  const btrfsUsers = sandboxes.some((s) => s.storage === 'btrfs') || ctx.store.listSnapshots().some((s) => s.storage === 'btrfs');
  if (!btrfsUsers) {
    await trace.phase('btrfs pool', async () => {
      const before = (await mountsUnder(ctx.home)).length;
      await unmountPool(ctx.home).catch(() => undefined);
      if ((await mountsUnder(ctx.home)).length < before) removed.push(`btrfs pool mount under ${ctx.home} (no sandbox or snapshot uses it; it is mounted again on demand)`);
    });
  }
  // Last resort for anything a crashed backend left mounted below the volumes' directories.
  for (const m of await mountsUnder(`${ctx.home}/storage`)) {
    if ([...volumeIds].some((id) => m.target.includes(id))) continue;
    await unmount(m.target, { lazy: true }).catch(() => undefined);
    removed.push(`mount ${m.target}`);
  }
  const poolMounted = (await mountsUnder(ctx.home)).some((m) => m.fstype === 'btrfs');
  for (const loop of await loopDevicesBackedUnder(ctx.home)) {
    if (poolMounted) continue;
    await detachLoop(loop.device).catch(() => undefined);
    removed.push(`loop device ${loop.device} (${loop.backingFile})`);
  }
  ctx.forgetReady();
  return removed;
}
