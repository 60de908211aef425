import { handleOf } from '../lab/lifecycle/handle.js';
import { inflight } from '../lab/lifecycle/inflight.js';
import { SnaplabError } from '../errors.js';
import type { LabContext } from '../lab/context.js';
import type { SandboxRecord, ScenarioRecord, ScenarioSnapshotRecord, SnapshotRecord } from '../store/records.js';
import type { Driver, MemoryImage } from '../drivers/driver.js';
import { checkName, newId } from '../lab/names.js';
import { join } from 'node:path';
import { rm } from 'node:fs/promises';
import type { Trace } from '../timing/trace.js';
import { getScenario } from './down.js';
import type { ScenarioSpec } from './spec.js';
import { noted } from '../cleanup.js';

export interface ScenarioManifest {
  /** sha256 of the scenario file the scenario was raised from */
  fileHash: string;
  machines: { machine: string; snapshot: string; addresses: { network: string; address: string }[] }[];
}

export const machineSnapshotName = (scenario: string, snap: string, machine: string): string =>
  `${scenario}@${snap}.${machine}`;

/**
 * One consistent point for the whole scenario: every machine frozen, every filesystem (and every
 * VM's memory) snapshotted, one manifest written, every machine thawed (thawed even when a
 * snapshot fails).
 */
export async function snapshotScenario(
  ctx: LabContext,
  name: string,
  snap: string,
  trace: Trace,
): Promise<ScenarioSnapshotRecord> {
  checkName('snapshot', snap);
  const scn = getScenario(ctx, name);
  const spec = scn.spec as ScenarioSpec;
  // the live copy's machines: not a standby's, nor those a swap set aside
  const live = new Set(spec.machines.map((m) => `${name}.${m.name}`));
  const machines = ctx.store.scenarioMachines(name).filter((m) => live.has(m.name));
  const machineOf = (m: SandboxRecord): string => m.name.slice(name.length + 1);
  checkSnapshottable(ctx, name, scn, snap, machines.map(machineOf));
  const frozen: SandboxRecord[] = [];
  const taken: SnapshotRecord[] = [];
  let failure: unknown;
  try {
    await trace.phase('freeze all', () =>
      settle(
        machines.map(async (m) => {
          await ctx.driver(m.driver).pause(handleOf(m));
          frozen.push(m);
        }),
      ),
    );
    await trace.phase('snapshot all', () =>
      // each under a volume-making mark: gc collects no volume between its making and its record
      settle(
        machines.map((m) =>
          inflight(ctx, 'snapshot', async () => {
            const rec = await snapshotMachine(ctx, m, machineSnapshotName(name, snap, machineOf(m)), trace);
            if (!ctx.store.insertSnapshot(rec))
              throw new SnaplabError('SNAPSHOT_EXISTS', `a snapshot named ${rec.name} already exists`);
            taken.push(rec);
          }),
        ),
      ),
    );
  } catch (e) {
    failure = e;
  }
  // every machine frozen is thawed, whatever failed; a thaw's failure does not hide an earlier one
  try {
    await trace.phase('thaw all', () => settle(frozen.map((m) => ctx.driver(m.driver).resume(handleOf(m)))));
  } catch (e) {
    failure ??= e;
  }
  if (failure !== undefined) {
    await removeTaken(ctx, taken);
    throw failure;
  }
  const manifest: ScenarioManifest = {
    fileHash: scn.hash,
    machines: spec.machines.map((m) => ({
      machine: m.name,
      snapshot: machineSnapshotName(name, snap, m.name),
      addresses: m.networks.map((n) => ({ network: n.network, address: n.address })),
    })),
  };
  const rec: ScenarioSnapshotRecord = { scenario: name, name: snap, manifest, createdAt: Date.now() };
  ctx.store.putScenarioSnapshot(rec);
  return rec;
}

/** Refuses a scenario that is not up or lacks a machine, and a snapshot name already taken. */
function checkSnapshottable(ctx: LabContext, name: string, scn: ScenarioRecord, snap: string, present: string[]): void {
  if (scn.state !== 'up')
    throw new SnaplabError('SCENARIO_FAILED', `scenario ${name} is ${scn.state}`, 'snapshot a scenario that is up');
  if (ctx.store.getScenarioSnapshot(name, snap)) {
    throw new SnaplabError(
      'SNAPSHOT_EXISTS',
      `scenario ${name} already has a snapshot named ${snap}`,
      "pick another --name (a scenario's snapshots go with `snaplab down`)",
    );
  }
  const spec = scn.spec as ScenarioSpec;
  const missing = spec.machines.filter((x) => !present.includes(x.name)).map((x) => x.name);
  if (missing.length)
    throw new SnaplabError(
      'SCENARIO_FAILED',
      `scenario ${name} lacks machine ${missing.join(', ')}`,
      `take it down and up again (\`snaplab down ${name}\`)`,
    );
  for (const machine of present) {
    const taken = machineSnapshotName(name, snap, machine);
    if (ctx.store.getSnapshot(taken))
      throw new SnaplabError(
        'SNAPSHOT_EXISTS',
        `a snapshot named ${taken} already exists`,
        `pick another --name, or remove it with \`snaplab snapshot rm ${taken}\``,
      );
  }
}

/** Every job ends before the next step (a VM's migration must not meet its thaw); then the first failure is thrown. */
async function settle(jobs: Promise<unknown>[]): Promise<void> {
  const bad = (await Promise.allSettled(jobs)).find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (bad) throw bad.reason;
}

/** One frozen machine's volume, and a VM's memory too, as the record of snapshot `recName`. */
async function snapshotMachine(
  ctx: LabContext,
  m: SandboxRecord,
  recName: string,
  trace: Trace,
): Promise<SnapshotRecord> {
  const backend = await ctx.readyBackend(m.storage);
  const volume = await backend.snapshot(m.volume!);
  // a VM's memory too, taken while it stands still with the rest: a reset resumes it
  // running, its services and connections as they were
  const driver: Driver = ctx.driver(m.driver);
  let memory: MemoryImage | undefined;
  if (driver.snapshotMemory) {
    const dir = join(ctx.home, 'snapshots', newId());
    try {
      memory = await driver.snapshotMemory(handleOf(m), dir, trace);
    } catch (e) {
      await backend.delete(volume).catch(noted(`remove volume ${volume.id}`));
      await rm(dir, { recursive: true, force: true });
      throw e;
    }
  }
  return {
    name: recName,
    id: volume.id,
    sandbox: m.name,
    image: m.image,
    storage: m.storage,
    volume,
    limits: m.limits,
    createdAt: Date.now(),
    driver: m.driver,
    memory: memory ? { ...memory, driver: m.driver } : null,
    init: m.init ?? null,
  };
}

/** Nothing of a failed scenario snapshot stays: each machine's record, volume and memory go. */
async function removeTaken(ctx: LabContext, taken: SnapshotRecord[]): Promise<void> {
  await Promise.all(
    taken.map(async (rec) => {
      await (await ctx.readyBackend(rec.storage)).delete(rec.volume).catch(noted(`remove volume ${rec.volume.id}`)); // else gc's: no record owns it
      if (rec.memory) await rm(rec.memory.dir, { recursive: true, force: true });
      ctx.store.deleteSnapshot(rec.name);
    }),
  );
}
