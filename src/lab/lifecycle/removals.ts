import { rm } from 'node:fs/promises';
import { SnaplabError } from '../../errors.js';
import type { LabContext } from '../context.js';
import type { Trace } from '../../timing/trace.js';
import { destroyRecord } from './teardown.js';
import type { ScenarioManifest } from '../../scenario/snapshot.js';

export async function removeSnapshot(ctx: LabContext, name: string, trace: Trace): Promise<void> {
  const snap = ctx.store.getSnapshot(name);
  if (!snap) throw snapshotNotFound(ctx, name);
  // a machine's part of a scenario snapshot: a reset to it needs every machine's
  for (const scn of ctx.store.listScenarios()) {
    const whole = ctx.store
      .listScenarioSnapshots(scn.name)
      .find((x) => (x.manifest as ScenarioManifest).machines.some((m) => m.snapshot === name));
    if (whole)
      throw new SnaplabError(
        'BAD_INPUT',
        `snapshot ${name} is a machine's part of scenario ${scn.name}'s snapshot ${whole.name}`,
        `it goes with the scenario (\`snaplab down ${scn.name}\`)`,
      );
  }
  const backend = await ctx.readyBackend(snap.storage);
  await trace.phase('delete storage', () => backend.delete(snap.volume));
  if (snap.memory) await trace.phase('delete memory', () => rm(snap.memory!.dir, { recursive: true, force: true }));
  ctx.store.deleteSnapshot(snap.name);
}

/** What an image cannot be removed under at all (pools and scenarios name it for machines to come). */
export function imageBlockers(ctx: LabContext, name: string): string[] {
  const pools = ctx.store
    .listPools()
    .filter((p) => p.image === name)
    .map((p) => `pool ${p.name}`);
  const scenarios = [
    ...new Set(
      ctx.store
        .listSandboxes()
        .filter((s) => s.image === name && s.scenario)
        .map((s) => `scenario ${s.scenario}`),
    ),
  ];
  return [...pools, ...scenarios];
}

/** The sandboxes and snapshots that use an image, as `sandbox NAME` / `snapshot NAME`. */
export function imageUsers(ctx: LabContext, name: string): string[] {
  return [
    ...ctx.store
      .listSandboxes()
      .filter((s) => s.image === name)
      .map((s) => `sandbox ${s.name}`),
    ...ctx.store
      .listSnapshots()
      .filter((s) => s.image === name)
      .map((s) => `snapshot ${s.name}`),
  ];
}

/**
 * Remove an image, its volumes and its tree. Refused while a sandbox or snapshot uses it, unless
 * `force`: then those go first. Pools and scenarios are never removed for it: they name the
 * image for machines they will raise later, so they are removed with their own commands.
 */
export async function removeImage(ctx: LabContext, name: string, trace: Trace, force = false): Promise<string[]> {
  const img = ctx.store.getImage(name);
  if (!img)
    throw new SnaplabError(
      'IMAGE_NOT_FOUND',
      `no image named ${JSON.stringify(name)}`,
      'list images with `snaplab image ls`',
    );
  const sandboxes = ctx.store.listSandboxes().filter((s) => s.image === name);
  const snapshots = ctx.store.listSnapshots().filter((s) => s.image === name);
  const blockers = imageBlockers(ctx, name);
  const users = imageUsers(ctx, name);
  if (blockers.length) {
    throw new SnaplabError(
      'IMAGE_IN_USE',
      `image ${name} is used by ${blockers.join(', ')}`,
      'remove those first (`snaplab pool rm`, `snaplab down`)',
    );
  }
  if (users.length && !force) {
    throw new SnaplabError(
      'IMAGE_IN_USE',
      `image ${name} is used by ${users.join(', ')}`,
      'remove those first (`snaplab rm`, `snaplab snapshot rm`), or pass --force to remove them with it',
    );
  }
  for (const s of sandboxes) await trace.phase(`remove sandbox ${s.name}`, () => destroyRecord(ctx, s));
  for (const s of snapshots) await removeSnapshot(ctx, s.name, trace);
  for (const iv of ctx.store.listImageVolumes(name)) {
    const backend = await ctx.readyBackend(iv.storage);
    await trace.phase(`delete ${iv.storage} volume`, () => backend.delete(iv.volume));
    // what a driver made from it (a VM's base disk): nothing uses it any more, no sandbox, no snapshot
    for (const driver of ctx.drivers.values()) await driver.forgetImage(iv.volume.id);
  }
  ctx.store.deleteImage(name);
  await trace.phase('delete tree', () => ctx.images.removeTree(name));
  return users;
}

/** How many names a not-found error's hint gives (read alone: a lab of 10 000 is not listed for it). */
const HINTED = 10;

export function snapshotNotFound(ctx: LabContext, name: string): SnaplabError {
  const known = ctx.store.snapshotNames(HINTED);
  return new SnaplabError(
    'SNAPSHOT_NOT_FOUND',
    `no snapshot named ${JSON.stringify(name)}`,
    known.length ? `known snapshots: ${known.join(', ')}` : 'take one with `snaplab snapshot <sandbox> --name NAME`',
  );
}

export function sandboxNotFound(ctx: LabContext, name: string): SnaplabError {
  const known = ctx.store.sandboxNames(HINTED);
  return new SnaplabError(
    'SANDBOX_NOT_FOUND',
    `no sandbox with id or name ${JSON.stringify(name)}`,
    known.length
      ? `known sandboxes: ${known.join(', ')} (see \`snaplab ls\`)`
      : 'create one with `snaplab create --image busybox`',
  );
}
