import { SnaplabError } from '../errors.js';
import { block, setImpairment, unblock } from '../host/netns.js';
import type { LabContext } from '../lab/context.js';
import { getScenario } from './down.js';
import { machineIndex } from './machines.js';
import { machineNetns } from './names.js';
import type { ScenarioSpec } from './spec.js';

function machineOf(spec: ScenarioSpec, scenario: string, name: string): { index: number; addresses: string[] } {
  const index = machineIndex(spec, name);
  if (index < 0) {
    throw new SnaplabError('BAD_INPUT', `scenario ${scenario} has no machine ${JSON.stringify(name)}`, `its machines: ${spec.machines.map((m) => m.name).join(', ')}`);
  }
  return { index, addresses: spec.machines[index]!.networks.map((n) => n.address) };
}

/** Drop (or restore) traffic between machines a and b, both ways. */
export async function setBlocked(ctx: LabContext, scenario: string, a: string, b: string, blocked: boolean): Promise<void> {
  const scn = getScenario(ctx, scenario);
  const spec = scn.spec as ScenarioSpec;
  const ma = machineOf(spec, scenario, a);
  const mb = machineOf(spec, scenario, b);
  const op = blocked ? block : unblock;
  await Promise.all([op(machineNetns(scn.id, ma.index), mb.addresses), op(machineNetns(scn.id, mb.index), ma.addresses)]);
}

/** Split the machines into groups that cannot reach each other; machines not named are untouched. */
export async function partition(ctx: LabContext, scenario: string, groups: string[][]): Promise<void> {
  const jobs: Promise<void>[] = [];
  for (const [gi, g] of groups.entries()) {
    for (const other of groups.slice(gi + 1)) for (const a of g) for (const b of other) jobs.push(setBlocked(ctx, scenario, a, b, true));
  }
  await Promise.all(jobs);
}

/** Unblock every pair of machines of the scenario. */
export async function heal(ctx: LabContext, scenario: string): Promise<void> {
  const spec = getScenario(ctx, scenario).spec as ScenarioSpec;
  const names = spec.machines.map((m) => m.name);
  const jobs: Promise<void>[] = [];
  for (const [i, a] of names.entries()) for (const b of names.slice(i + 1)) jobs.push(setBlocked(ctx, scenario, a, b, false));
  await Promise.all(jobs);
}

/** Delay and loss on every interface of a machine (tc netem), or none (`null`). */
export async function impair(ctx: LabContext, scenario: string, machine: string, opts: { delayMs?: number; jitterMs?: number; lossPct?: number } | null): Promise<void> {
  const scn = getScenario(ctx, scenario);
  const spec = scn.spec as ScenarioSpec;
  const m = machineOf(spec, scenario, machine);
  await Promise.all(spec.machines[m.index]!.networks.map((_, k) => setImpairment(machineNetns(scn.id, m.index), `eth${k}`, opts)));
}
