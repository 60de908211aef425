/**
 * A scenario's standby: a complete second copy of the scenario raised from a snapshot in the
 * background (its own networks with the same addresses, its machines booted, their start steps
 * run and ready checks passed), then frozen where that is safe. A reset swaps it in
 * (standby-swap.ts) instead of raising the machines again. docs/architecture.md, "Standbys".
 */
import { readFile } from 'node:fs/promises';
import { SnaplabError } from '../errors.js';
import { noted } from '../cleanup.js';
import type { LabContext } from '../lab/context.js';
import { handleOf } from '../lab/lifecycle/handle.js';
import { withDefaults } from '../lab/lifecycle/limits.js';
import { me } from '../lab/lifecycle/owner.js';
import { destroyRecord } from '../lab/lifecycle/teardown.js';
import { DEFAULT_DRIVER } from '../defaults.js';
import type { ScenarioRecord, ScenarioStandby } from '../store/records.js';
import type { Trace } from '../timing/trace.js';
import { getScenario } from './down.js';
import { raiseMachine } from './machines.js';
import { standbySandbox } from './names.js';
import { driverInfo } from '../drivers/registry.js';
import type { ScenarioManifest } from './snapshot.js';
import type { MachineFileSpec, ScenarioSpec } from './spec.js';
import { runSteps, waitReady, type Machine } from './steps.js';
import { unwireNetworks, wireNetworks } from './wiring.js';

/** Does this scenario keep a standby? `override` (an operation's `--standby`) first, then its own setting, then its file's key (default 1). */
export function standbyWanted(scn: ScenarioRecord, override?: 0 | 1): boolean {
  if (override !== undefined) return override === 1;
  return scn.standbyWanted ?? ((scn.spec as ScenarioSpec).standby ?? 1) === 1;
}

/**
 * Is the machine frozen while it stands by? Where its driver freezes pools' standbys
 * (pauseStandbys: a VM, whose idle guest kernel would still cost CPU; its clock is set on thaw).
 * A namespace machine waits running: idle, its processes blocked, it costs nothing, and a system
 * machine's systemd, frozen for minutes, would find its services' watchdogs unpinged on thaw.
 */
export const freezes = (m: MachineFileSpec): boolean => driverInfo(m.driver).capabilities.pauseStandbys;

/** The scenario snapshot a standby or a reset is of: `to`, else the latest. */
export function targetSnapshot(ctx: LabContext, name: string, to?: string): string {
  const snaps = ctx.store.listScenarioSnapshots(name);
  const snap = to === undefined ? snaps.at(-1) : ctx.store.getScenarioSnapshot(name, to);
  if (!snap)
    throw new SnaplabError(
      'SNAPSHOT_NOT_FOUND',
      to === undefined ? `scenario ${name} has no snapshot` : `scenario ${name} has no snapshot named ${to}`,
      snaps.length
        ? `its snapshots: ${snaps.map((s) => s.name).join(', ')}`
        : `take one with \`snaplab snapshot --scenario ${name} --name base\``,
    );
  return snap.name;
}

/** Bytes the kernel says it could give without swapping (MemAvailable), and its total. */
async function hostMemory(): Promise<{ available: number; total: number }> {
  const text = await readFile('/proc/meminfo', 'utf8');
  const kib = (k: string): number => Number(new RegExp(`^${k}:\\s+(\\d+)`, 'm').exec(text)?.[1] ?? 0) * 1024;
  return { available: kib('MemAvailable'), total: kib('MemTotal') };
}

/**
 * A standby is raised only where the host keeps a margin after it: its machines' memory limits
 * (what they may take; a VM's is its RAM) set aside, at least a tenth of the host's memory, and
 * 512 MiB, must stay available.
 */
export async function checkStandbyMemory(spec: ScenarioSpec): Promise<void> {
  const need = spec.machines.reduce(
    (a, m) => a + (withDefaults(m.limits, m.driver ?? DEFAULT_DRIVER).memoryBytes ?? 0),
    0,
  );
  const { available, total } = await hostMemory();
  const margin = Math.max(total / 10, 512 * 2 ** 20);
  if (available - need >= margin) return;
  const mib = (b: number): string => `${Math.round(b / 2 ** 20)} MiB`;
  throw new SnaplabError(
    'HOST_SHORT_OF_MEMORY',
    `a standby's machines may take ${mib(need)}, and the host has ${mib(available)} available (${mib(margin)} is kept free)`,
    "resets raise the machines again meanwhile; free memory, lower the machines' memory limits, or turn standbys off (`snaplab standby NAME --off`)",
  );
}

/** Write the standby's state if it is still the one this process set (see Store.updateScenarioStandby). */
function mine(now: ScenarioStandby | null): boolean {
  return now !== null && (now.state === 'queued' || now.state === 'raising') && now.owner?.pid === process.pid;
}

/**
 * Raise the standby of scenario `name` from snapshot `snapshot` (this process: the worker's, or
 * `snaplab standby` in the foreground). Its state must be `queued` by this process, or absent or
 * failed; it is `ready` when this returns, or `failed` with the reason, everything it made removed.
 */
export async function raiseStandby(
  ctx: LabContext,
  name: string,
  snapshot: string,
  trace: Trace,
  worker = false,
): Promise<void> {
  const scn = getScenario(ctx, name);
  // a worker raises only what was queued for it (one cancelled meanwhile is gone: it stops), and
  // may start before its parent has written its pid: a queued standby with none is its
  const claimed = ctx.store.updateScenarioStandby(
    name,
    (now) =>
      worker
        ? now?.state === 'queued' && (now.owner === null || now.owner.pid === process.pid)
        : now === null || now.state === 'failed',
    { state: 'raising', snapshot, owner: me('create'), worker, at: Date.now() },
  );
  if (!claimed)
    throw new SnaplabError(
      'SCENARIO_FAILED',
      `scenario ${name} has a standby already, or one being raised`,
      `see \`snaplab status ${name}\`; \`snaplab standby ${name} --off\` removes it`,
    );
  const t0 = Date.now();
  try {
    // what a failed raise could not remove would be taken for this one's (its ranges' labels)
    await trace.phase('leftovers', () => removeStandbyCopy(ctx, scn));
    await raiseCopy(ctx, scn, snapshot, trace);
  } catch (e) {
    await trace.phase('clean up', () => removeStandbyCopy(ctx, scn)).catch(noted(`remove the standby of ${name}`));
    ctx.store.updateScenarioStandby(name, mine, {
      state: 'failed',
      snapshot,
      owner: null,
      reason: (e as Error).message,
      at: Date.now(),
    });
    throw e;
  }
  if (
    !ctx.store.updateScenarioStandby(name, mine, {
      state: 'ready',
      snapshot,
      owner: null,
      raiseMs: Date.now() - t0,
      at: Date.now(),
    })
  )
    throw new SnaplabError('ABORTED', `the standby of ${name} was cancelled while it was raised`, 'nothing to do');
}

/** Wire the standby's networks, raise every machine from the snapshot, start, check and freeze it. */
async function raiseCopy(ctx: LabContext, scn: ScenarioRecord, snapshot: string, trace: Trace): Promise<void> {
  const spec = scn.spec as ScenarioSpec;
  await trace.phase('memory', () => checkStandbyMemory(spec));
  const manifest = ctx.store.getScenarioSnapshot(scn.name, snapshot)?.manifest as ScenarioManifest | undefined;
  if (!manifest)
    throw new SnaplabError('SNAPSHOT_NOT_FOUND', `scenario ${scn.name} has no snapshot named ${snapshot}`, 'take one');
  const snaps = spec.machines.map((m) => {
    const entry = manifest.machines.find((x) => x.machine === m.name);
    const rec = entry && ctx.store.getSnapshot(entry.snapshot);
    if (!rec)
      throw new SnaplabError(
        'SNAPSHOT_NOT_FOUND',
        `snapshot ${snapshot} of ${scn.name} lacks machine ${m.name}`,
        'take a new scenario snapshot',
      );
    return rec;
  });
  const storage = snaps[0]!.volume.kind;
  await wireNetworks(ctx, scn.id, spec, storage, trace, 'standby');
  const raised: Machine[] = [];
  try {
    await settleAll(
      spec.machines.map(async (m, j) => {
        const s = snaps[j]!;
        const memory = s.memory ?? undefined;
        const machine = await trace.phase(`raise ${m.name}`, () =>
          raiseMachine(ctx, { name: scn.name, id: scn.id, spec }, j, trace, {
            from: { volume: s.volume, origin: s.name, ...(memory ? { memory } : {}) },
            copy: 'standby',
          }),
        );
        raised.push(machine);
        if (m.start.length && !memory)
          await trace.phase(`start ${m.name}`, () => runSteps(ctx, machine, m.start, 'start'));
        await trace.phase(`ready ${m.name}`, () => waitReady(ctx, machine));
        if (!freezes(m)) return;
        await trace.phase(`freeze ${m.name}`, () => ctx.driver(machine.record.driver).pause(handleOf(machine.record)));
        ctx.store.updateSandbox(machine.record.id, { state: 'paused' });
      }),
    );
  } finally {
    for (const m of raised) void m.agent.close();
  }
}

/** Every job ends, then the first failure is thrown (nothing half-raised is left running on its own). */
async function settleAll(jobs: Promise<unknown>[]): Promise<void> {
  const bad = (await Promise.allSettled(jobs)).find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (bad) throw bad.reason;
}

/** The standby copy's machines, networks and ranges, removed (its state is left to the caller). */
export async function removeStandbyCopy(ctx: LabContext, scn: ScenarioRecord): Promise<void> {
  const spec = scn.spec as ScenarioSpec;
  await Promise.all(
    spec.machines.map(async (m) => {
      const rec = ctx.store.getSandbox(standbySandbox(scn.name, m.name));
      if (rec) await destroyRecord(ctx, rec);
    }),
  );
  await unwireNetworks(ctx.home, scn.id, 'standby');
}
