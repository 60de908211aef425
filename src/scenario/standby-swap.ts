/**
 * Swapping a scenario's standby in (scenario/standby.ts): its network namespaces take the live
 * ones' names, its user namespace ranges and machine records the live ones' labels and names; the
 * live copy is set aside (`-x-` names, records `SCENARIO.MACHINE~ID`) and removed off the reset's
 * critical path. Every step can be repeated: a swap interrupted anywhere is finished by the next
 * operation on the scenario (or gc), never undone.
 */
import { noted } from '../cleanup.js';
import { SnaplabError } from '../errors.js';
import { listSnaplabNetns } from '../host/net/netns.js';
import { isNamespace, renameNetns, sameNamespace } from '../host/net/ns.js';
import { netnsPath } from '../host/net/names.js';
import { HostOps } from '../host/hostops.js';
import { liveness, signal } from '../host/procs.js';
import { allScenarioRanges, machineHolder, relabelRange } from '../host/userns/registry.js';
import type { LabContext } from '../lab/context.js';
import { handleOf } from '../lab/lifecycle/handle.js';
import { reconcile } from '../lab/lifecycle/reconcile.js';
import { destroyRecord } from '../lab/lifecycle/teardown.js';
import type { ScenarioRecord } from '../store/records.js';
import type { Trace } from '../timing/trace.js';
import { getScenario } from './down.js';
import { machineNetns, machineSandbox, networkNetns, standbySandbox } from './names.js';
import type { ScenarioSpec } from './spec.js';
import { removeStandbyCopy } from './standby.js';
import { unwireNetworks } from './wiring.js';

/** Why a reset could not swap a standby in (it raises the machines again, and says this). */
export type NoStandby = string;

/**
 * Swap the ready standby of snapshot `snapshot` in: thaw it, then switch the copies. Returns the
 * reason when there is none to swap (none, another snapshot's, still raising, failed, or one of its
 * machines dead or not thawing: that standby is removed).
 */
export async function swapStandby(
  ctx: LabContext,
  name: string,
  snapshot: string,
  trace: Trace,
): Promise<NoStandby | null> {
  const scn = getScenario(ctx, name);
  const st = scn.standby;
  if (!st) return 'no standby';
  if (st.state === 'failed') return `its standby failed: ${st.reason ?? 'unknown'}`;
  if (st.state !== 'ready') return `its standby is ${st.state}`;
  if (st.snapshot !== snapshot) return `its standby is of snapshot ${st.snapshot}`;
  const spec = scn.spec as ScenarioSpec;
  HostOps.get(); // the swap's mounts go through the helper: started now, it is up by then
  try {
    await trace.phase('thaw standby', () => Promise.all(spec.machines.map((m) => wake(ctx, name, m.name))));
  } catch (e) {
    await removeStandby(ctx, scn);
    return `its standby could not be woken: ${(e as Error).message}`;
  }
  const aside = spec.machines.flatMap((m) => ctx.store.getSandbox(machineSandbox(name, m.name))?.id ?? []);
  ctx.store.setScenarioStandby(name, { ...st, state: 'swapping', aside });
  await trace.phase('swap', () => switchCopies(ctx, scn, trace));
  // the old copy is removed off the reset's path, but stopped on it: a connection held to one of
  // its machines (ssh's ControlPersist, a port-forward) must not reach it after the reset returns
  await trace.phase('stop the old copy', () => stopMachines(ctx, aside));
  ctx.store.setScenarioStandby(name, null);
  ctx.store.setScenarioState(name, 'up');
  return null;
}

/**
 * SIGKILL each machine's init (the PID 1 of its pid namespace, which takes every process of it
 * along; a VM's QEMU), not waited for: its agent's socket closes with it. Its cgroup, run
 * directory, volume and record are removed later (removeSetAside). Only a pid known to be the
 * machine's is signalled.
 */
async function stopMachines(ctx: LabContext, ids: string[]): Promise<void> {
  await Promise.all(
    ids.map(async (id) => {
      const rec = ctx.store.getSandbox(id);
      if (!rec?.pid || (await liveness(rec.pid, rec.pidStart)).state !== 'alive') return;
      signal(rec.pid, 'SIGKILL');
    }),
  );
}

/** One standby machine running and answering: thawed if it was frozen (a VM's clock set). */
async function wake(ctx: LabContext, scenario: string, machine: string): Promise<void> {
  const found = ctx.store.getSandbox(standbySandbox(scenario, machine));
  const rec = found && (await reconcile(ctx, found));
  if (!rec || (rec.state !== 'running' && rec.state !== 'paused'))
    throw new SnaplabError(
      'SANDBOX_DEAD',
      `standby machine ${machine} is ${rec?.state ?? 'missing'}`,
      'a reset raises the machines again',
    );
  const driver = ctx.driver(rec.driver);
  if (rec.state === 'paused') {
    await driver.resume(handleOf(rec));
    ctx.store.updateSandbox(rec.id, { state: 'running' });
  }
  // it answers (a machine whose agent died while it waited is no standby); a VM's clock stood still
  const agent = await driver.connect(handleOf(rec));
  try {
    if (driver.capabilities.clockStopsWhilePaused) await agent.setClock(BigInt(Date.now()) * 1_000_000n);
    else await agent.ping();
  } finally {
    void agent.close();
  }
}

/**
 * The standby copy becomes the live one, the live one is set aside: namespaces renamed (live to
 * aside, standby to live), ranges relabelled the same way, then the records renamed in one
 * transaction. Each step is skipped where it was done: repeatable after an interruption.
 */
export async function switchCopies(ctx: LabContext, scn: ScenarioRecord, trace?: Trace): Promise<void> {
  const phase = <T>(n: string, fn: () => Promise<T>): Promise<T> => (trace ? trace.phase(n, fn) : fn());
  const spec = scn.spec as ScenarioSpec;
  // bound namespaces, not names: a rename killed mid-way leaves an empty file under the old name
  const listed = await listSnaplabNetns();
  const bound = await Promise.all(listed.map((n) => isNamespace(netnsPath(n))));
  const present = new Set(listed.filter((_, i) => bound[i]));
  const names = (copy: 'live' | 'standby' | 'aside'): string[] => [
    ...spec.networks.map((_, i) => networkNetns(scn.id, i, copy)),
    ...spec.machines.map((_, j) => machineNetns(scn.id, j, copy)),
  ];
  const [live, standby, aside] = [names('live'), names('standby'), names('aside')];
  await phase('rename namespaces', () =>
    Promise.all(
      standby.map(async (s, k) => {
        if (!present.has(s)) return;
        // a rename of the standby killed between its bind and its unbind left the live name bound
        // to the standby's namespace: the live copy was set aside already
        const liveToSetAside = present.has(live[k]!) && !(await sameNamespace(netnsPath(s), netnsPath(live[k]!)));
        if (liveToSetAside) await renameNetns(live[k]!, aside[k]!);
        await renameNetns(s, live[k]!);
      }),
    ),
  );
  await phase('relabel ranges', () => relabel(ctx, scn));
  renameRecords(ctx, scn);
}

/** The standby's user namespace ranges labelled live, the live ones aside. */
async function relabel(ctx: LabContext, scn: ScenarioRecord): Promise<void> {
  const spec = scn.spec as ScenarioSpec;
  // each copy's range is on its machine's record; the registry is read (every claim on the host)
  // only when a record does not say (a live machine that is gone)
  const bases = spec.machines.map((m) => ({
    s: ctx.store.getSandbox(standbySandbox(scn.name, m.name))?.uidBase ?? undefined,
    l: ctx.store.getSandbox(machineSandbox(scn.name, m.name))?.uidBase ?? undefined,
  }));
  if (bases.some((b) => b.s !== undefined && b.l === undefined)) {
    const held = new Map([...(await allScenarioRanges(ctx.home, scn.id))].map(([base, holder]) => [holder, base]));
    bases.forEach((b, j) => {
      b.s = held.get(machineHolder(scn.id, j, 'standby'));
      b.l = held.get(machineHolder(scn.id, j));
    });
  }
  await Promise.all(
    bases.map(async ({ s, l }, j) => {
      if (s === undefined) return;
      if (l !== undefined) await relabelRange(l, ctx.home, machineHolder(scn.id, j), machineHolder(scn.id, j, 'aside'));
      await relabelRange(s, ctx.home, machineHolder(scn.id, j, 'standby'), machineHolder(scn.id, j));
    }),
  );
}

/** The standby's records named as the live machines, the live ones `NAME~ID`, in one transaction. */
function renameRecords(ctx: LabContext, scn: ScenarioRecord): void {
  const spec = scn.spec as ScenarioSpec;
  const pairs: [string, string][] = [];
  for (const m of spec.machines) {
    const s = ctx.store.getSandbox(standbySandbox(scn.name, m.name));
    if (!s) continue;
    const l = ctx.store.getSandbox(machineSandbox(scn.name, m.name));
    if (l) pairs.push([l.id, `${l.name}~${l.id}`]);
    pairs.push([s.id, machineSandbox(scn.name, m.name)]);
  }
  ctx.store.renameSandboxes(pairs);
}

/** A swap a process began and did not end (killed mid-way), finished. */
export async function finishSwap(ctx: LabContext, name: string): Promise<void> {
  const scn = getScenario(ctx, name);
  if (scn.standby?.state !== 'swapping') return;
  await switchCopies(ctx, scn);
  ctx.store.setScenarioStandby(name, null);
}

/**
 * Machines a swap (or a reset's raise) set aside, `SCENARIO.MACHINE~ID`, and the aside copy's
 * networks and ranges: removed. Nothing when there are none.
 */
export async function removeSetAside(ctx: LabContext, scn: ScenarioRecord, trace?: Trace): Promise<void> {
  const aside = ctx.store.scenarioMachines(scn.name).filter((r) => /~[0-9a-f]+$/.test(r.name));
  await Promise.all(aside.map((r) => destroyRecord(ctx, r, trace)));
  await unwireNetworks(ctx.home, scn.id, 'aside');
}

/** The standby removed, whatever its state, and the scenario told it has none. */
export async function removeStandby(ctx: LabContext, scn: ScenarioRecord): Promise<void> {
  await removeStandbyCopy(ctx, scn).catch(noted(`remove the standby of ${scn.name}`));
  ctx.store.setScenarioStandby(scn.name, null);
}
