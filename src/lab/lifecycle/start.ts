/**
 * `start`: a stopped machine (stopped.ts) raised again on its own volume, under the same id and
 * name, with the same limits, init, user namespace range and egress address: a fresh boot (new
 * processes, a new PID 1) on the files it had. Labels, metadata and its timeout are its id's, kept.
 */
import type { AgentClient } from '../../agent/client.js';
import type { Driver, MachineSpec, RaisedMachine } from '../../drivers/driver.js';
import { SnaplabError } from '../../errors.js';
import { machineEgressNetnsPath } from '../../host/net/egress.js';
import { isNamespace } from '../../host/net/ns.js';
import { USERNS_SIZE } from '../../host/userns/id-ranges.js';
import { holdRange } from '../../host/userns/registry.js';
import type { SandboxRecord } from '../../store/records.js';
import type { Trace } from '../../timing/trace.js';
import type { LabContext } from '../context.js';
import { handleOf } from './handle.js';
import { me } from './owner.js';
import { egressNetns, firstAnswer, guestNic } from './raise.js';
import { STOPPED, checkStartable, underStateLock } from './stopped.js';
import { noted } from '../../cleanup.js';

/**
 * Raise the stopped machine `s` again; resolves with a connection to its agent once a first
 * command ran in it (as a create does). The record is `creating`, its owner's step 'start', while
 * it runs: one interrupted is reconciled to stopped again (reconcile.ts). A start that fails
 * removes what it made (processes, cgroup, run directory) and leaves the machine stopped as it
 * was: volume, range and egress namespace kept.
 */
export async function startSandbox(ctx: LabContext, s: SandboxRecord, trace: Trace): Promise<AgentClient> {
  return underStateLock(ctx, s, async () => {
    checkStartable(s);
    if (!s.volume)
      throw new SnaplabError(
        'INTERNAL',
        `sandbox ${s.name} has no volume recorded`,
        `remove it with \`snaplab rm ${s.name}\` and create it again`,
      );
    const driver = ctx.driver(s.driver);
    const starting = { state: 'creating' as const, reason: `being started by pid ${process.pid}`, owner: me('start') };
    ctx.store.updateSandbox(s.id, starting);
    Object.assign(s, starting);
    let raised: RaisedMachine | undefined;
    try {
      raised = await startMachine(ctx, s, driver, trace);
      const note = await firstAnswer({ init: s.init ?? undefined, egress: s.egress ?? undefined }, raised.agent, trace);
      const running = {
        state: 'running' as const,
        reason: note,
        owner: null,
        pid: raised.handle.pid,
        pidStart: raised.handle.pidStart,
      };
      await trace.phase('record running', async () => ctx.store.updateSandbox(s.id, running));
      Object.assign(s, running);
      return raised.agent;
    } catch (e) {
      void raised?.agent.close();
      await undoStart(ctx, s, driver, raised);
      throw e;
    }
  });
}

/** The machine on its volume: its cgroup, its egress namespace (joined again, or made after a reboot), then the driver's raise. */
async function startMachine(ctx: LabContext, s: SandboxRecord, driver: Driver, trace: Trace): Promise<RaisedMachine> {
  const backend = await trace.phase('storage ready', () => ctx.readyBackend(s.storage));
  const volume = s.volume!;
  if (s.uidBase !== null && s.scenario === null) {
    // its range is its own still, but the registry is on tmpfs: after a reboot it is claimed again
    const other = await holdRange(s.uidBase, ctx.home, s.id, s.ids ?? null);
    if (other !== undefined)
      throw new SnaplabError(
        'NO_USERNS_SLOT',
        `the user namespace range of ${s.name} (host ids ${s.uidBase}…) is held by ${other}, claimed since it stopped (a reboot frees every claim)`,
        `two machines on one range would share host ids: remove the other, or this one (\`snaplab rm ${s.name}\`)`,
      );
  }
  const machine = {
    id: s.id,
    hostname: s.name,
    limits: s.limits,
    ...(s.uidBase !== null ? { userns: { base: s.uidBase, count: s.ids ?? USERNS_SIZE } } : {}),
    ...(s.init === 'systemd' ? { init: 'systemd' as const } : {}),
  };
  await driver.prepare(machine, trace);
  let netns: string | undefined;
  if (s.egress) {
    const kept = machineEgressNetnsPath(ctx.home, s.egress.slot);
    // kept by stop; a reboot takes namespaces away: then linked to the router again
    netns = (await isNamespace(kept)) ? kept : await trace.phase('egress', () => egressNetns(ctx, s, driver));
  }
  const spec: MachineSpec = {
    ...machine,
    ...(netns ? { netns, ...guestNic(undefined, driver) } : {}),
    rootfs: volume.path,
    // its own volume: a VM's disk is in it already, as in a clone of a VM's snapshot
    source: { id: volume.id, path: volume.path, image: false },
    ...(s.uidBase !== null && backend.stack ? { stack: backend.stack(volume) } : {}),
  };
  return driver.raise(spec, trace);
}

/**
 * What a failed start made goes (its processes, cgroup and run directory: the driver's destroy);
 * the record is stopped again. A destroy that fails leaves the machine dead with why, for gc and rm.
 */
async function undoStart(
  ctx: LabContext,
  s: SandboxRecord,
  driver: Driver,
  raised: RaisedMachine | undefined,
): Promise<void> {
  const handle = raised ? raised.handle : { ...handleOf(s), pid: 0, pidStart: 0 };
  try {
    await driver.destroy(handle);
  } catch (e) {
    noted(`remove what the start of ${s.name} made`)(e);
    const reason = `its start failed and what it made could not all be removed (${(e as Error).message}): run \`snaplab gc\``;
    ctx.store.updateSandbox(s.id, { state: 'dead', reason, owner: null });
    Object.assign(s, { state: 'dead', reason, owner: null });
    return;
  }
  ctx.store.updateSandbox(s.id, { state: 'dead', reason: STOPPED, owner: null });
  Object.assign(s, { state: 'dead', reason: STOPPED, owner: null });
}
