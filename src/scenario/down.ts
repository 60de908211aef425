import { rm } from 'node:fs/promises';
import { SnaplabError } from '../errors.js';
import type { LabContext } from '../lab/context.js';
import { destroyRecord } from '../lab/lifecycle/teardown.js';
import { me } from '../lab/lifecycle/owner.js';
import type { ScenarioRecord } from '../store/records.js';
import { ownerDir } from './names.js';
import { unwireNetworks } from './wiring.js';

export function getScenario(ctx: LabContext, name: string): ScenarioRecord {
  const s = ctx.store.getScenario(name);
  if (!s) {
    const known = ctx.store.listScenarios().map((x) => x.name);
    throw new SnaplabError(
      'SCENARIO_NOT_FOUND',
      `no scenario named ${JSON.stringify(name)}`,
      known.length ? `scenarios up: ${known.join(', ')}` : 'raise one with `snaplab up FILE`',
    );
  }
  return s;
}

/** Machines, their snapshots, the network namespaces and the record: everything of the scenario. */
export async function teardownScenario(ctx: LabContext, name: string): Promise<void> {
  const s = getScenario(ctx, name);
  ctx.store.setScenarioState(name, 'removing', `being removed by pid ${process.pid}`, me('remove'));
  await Promise.all(ctx.store.scenarioMachines(name).map((m) => destroyRecord(ctx, m)));
  for (const snap of ctx.store.listSnapshots().filter((x) => x.name.startsWith(`${name}@`))) {
    await (await ctx.readyBackend(snap.storage)).delete(snap.volume);
    if (snap.memory) await rm(snap.memory.dir, { recursive: true, force: true }); // a VM machine's
    ctx.store.deleteSnapshot(snap.name);
  }
  await removeNetworks(ctx.home, s.id);
  ctx.store.deleteScenario(name);
}

/** Remove the namespaces of a scenario id (every copy's networks and machines): what `down` and gc share. */
export async function removeNetworks(home: string, sid: string): Promise<void> {
  await unwireNetworks(home, sid);
  await rm(ownerDir(home, sid), { recursive: true, force: true });
}
