import { SnaplabError } from '../errors.js';
import { block, setImpairment, unblock } from '../host/net/netns.js';
import { blackholes } from '../host/net/links.js';
import type { LabContext } from '../lab/context.js';
import { getScenario } from './down.js';
import { machineIndex } from './machines.js';
import { isVm, machineNetns } from './names.js';
import type { ScenarioSpec } from './spec.js';

function machineOf(spec: ScenarioSpec, scenario: string, name: string): { index: number; addresses: string[] } {
  const index = machineIndex(spec, name);
  if (index < 0) {
    throw new SnaplabError(
      'BAD_INPUT',
      `scenario ${scenario} has no machine ${JSON.stringify(name)}`,
      `its machines: ${spec.machines.map((m) => m.name).join(', ')}`,
    );
  }
  return { index, addresses: spec.machines[index]!.networks.map((n) => n.address) };
}

/**
 * A block is a blackhole route in the machine's network namespace; a VM's traffic is bridged
 * through its namespace, never routed there: refused before anything changes.
 */
function refuseVms(spec: ScenarioSpec, names: string[]): void {
  const vm = names.find((x) => isVm(spec.machines[machineIndex(spec, x)]!));
  if (vm !== undefined)
    throw new SnaplabError(
      'BAD_INPUT',
      `machine ${vm} is a VM: blocks and partitions hold between namespace machines only, for now`,
      'impair it instead (`snaplab net impair`), or make it a namespace machine',
    );
}

/** Drop (or restore) traffic between machines a and b, both ways. */
export async function setBlocked(
  ctx: LabContext,
  scenario: string,
  a: string,
  b: string,
  blocked: boolean,
): Promise<void> {
  const scn = getScenario(ctx, scenario);
  const spec = scn.spec as ScenarioSpec;
  const ma = machineOf(spec, scenario, a);
  const mb = machineOf(spec, scenario, b);
  if (a === b)
    throw new SnaplabError(
      'BAD_INPUT',
      `cannot ${blocked ? 'block' : 'unblock'} ${a} from itself`,
      'name two different machines',
    );
  refuseVms(spec, [a, b]);
  const op = blocked ? block : unblock;
  await Promise.all([
    op(machineNetns(scn.id, ma.index), mb.addresses),
    op(machineNetns(scn.id, mb.index), ma.addresses),
  ]);
}

/** Split the machines into groups that cannot reach each other; machines not named are untouched. */
export async function partition(ctx: LabContext, scenario: string, groups: string[][]): Promise<void> {
  // every name checked before anything is blocked: a bad request changes nothing
  const spec = getScenario(ctx, scenario).spec as ScenarioSpec;
  if (groups.filter((g) => g.length).length < 2)
    throw new SnaplabError(
      'BAD_INPUT',
      'a partition needs at least two groups of machines',
      'e.g. snaplab net partition lab web,db cache',
    );
  const seen = new Set<string>();
  for (const name of groups.flat()) {
    machineOf(spec, scenario, name);
    if (seen.has(name))
      throw new SnaplabError(
        'BAD_INPUT',
        `machine ${name} is in two groups of the partition`,
        'give each machine to one group',
      );
    seen.add(name);
  }
  refuseVms(spec, [...seen]);
  const jobs: Promise<void>[] = [];
  for (const [gi, g] of groups.entries()) {
    for (const other of groups.slice(gi + 1))
      for (const a of g) for (const b of other) jobs.push(setBlocked(ctx, scenario, a, b, true));
  }
  await Promise.all(jobs);
}

/** Unblock every pair of machines of the scenario. */
export async function heal(ctx: LabContext, scenario: string): Promise<void> {
  const spec = getScenario(ctx, scenario).spec as ScenarioSpec;
  const names = spec.machines.filter((m) => !isVm(m)).map((m) => m.name);
  const jobs: Promise<void>[] = [];
  for (const [i, a] of names.entries())
    for (const b of names.slice(i + 1)) jobs.push(setBlocked(ctx, scenario, a, b, false));
  await Promise.all(jobs);
}

/** Every block and impairment of the scenario's live machines lifted (a reset that kept their namespaces). */
export async function clearFaults(ctx: LabContext, scenario: string): Promise<void> {
  const spec = getScenario(ctx, scenario).spec as ScenarioSpec;
  await Promise.all([
    heal(ctx, scenario),
    ...spec.machines.filter((m) => !isVm(m)).map((m) => impair(ctx, scenario, m.name, null)),
  ]);
}

/** Delay and loss on every interface of a machine (tc netem), or none (`null`). */
export async function impair(
  ctx: LabContext,
  scenario: string,
  machine: string,
  opts: { delayMs?: number; jitterMs?: number; lossPct?: number } | null,
): Promise<void> {
  const scn = getScenario(ctx, scenario);
  const spec = scn.spec as ScenarioSpec;
  const m = machineOf(spec, scenario, machine);
  await Promise.all(
    spec.machines[m.index]!.networks.map((_, k) => setImpairment(machineNetns(scn.id, m.index), `eth${k}`, opts)),
  );
}

/**
 * The pairs of machines whose traffic is dropped now, read from the kernel (each machine's blackhole
 * routes), not from what was asked: a pair counts when either side drops the other's addresses.
 */
export async function blockedPairs(ctx: LabContext, scenario: string): Promise<[string, string][]> {
  const scn = getScenario(ctx, scenario);
  const spec = scn.spec as ScenarioSpec;
  const owner = new Map<string, string>();
  for (const m of spec.machines) for (const n of m.networks) owner.set(n.address, m.name);
  const pairs = new Set<string>();
  await Promise.all(
    spec.machines.map(async (m, i) => {
      for (const addr of await blackholes(machineNetns(scn.id, i))) {
        const other = owner.get(addr);
        if (other && other !== m.name) pairs.add([m.name, other].sort().join('\0'));
      }
    }),
  );
  return [...pairs].sort().map((p) => p.split('\0') as [string, string]);
}
