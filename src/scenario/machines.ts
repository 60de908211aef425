import type { EgressLists } from '../host/net/egress-rules.js';
import type { LabContext } from '../lab/context.js';
import { imageVolume } from '../lab/images/volume.js';
import { DEFAULT_DRIVER } from '../defaults.js';
import { withDefaults } from '../lab/lifecycle/limits.js';
import { raiseSandbox, usernsFor } from '../lab/lifecycle/raise.js';
import { SnaplabError } from '../errors.js';
import type { StorageKind, Volume } from '../storage/backend.js';
import type { Trace } from '../timing/trace.js';
import { netnsPath } from '../host/net/netns.js';
import { scenarioRanges } from '../host/userns/registry.js';
import { type Copy, isVm, machineNetns, machineSandbox, standbySandbox, tapName } from './names.js';
import { macFor } from '../host/net/names.js';
import type { MemoryImage } from '../drivers/driver.js';
import type { MachineFileSpec, ScenarioSpec } from './spec.js';
import { hostsFile, type Machine } from './steps.js';

/** Where a scenario machine comes from and which copy it is of (scenario/names.ts Copy). */
export interface MachineSource {
  /** a snapshot volume (a VM's with its memory: it continues running); absent: the image */
  from?: { volume: Volume; origin: string; memory?: MemoryImage };
  /** the storage of a machine raised from its image (default: the best that works here) */
  storage?: StorageKind;
  /** default live; a standby copy's machine is named SCENARIO.MACHINE_standby */
  copy?: Copy;
}

/**
 * Raise one scenario machine into its (already wired) network namespace, from the image or from a
 * snapshot volume, and write its /etc/hosts. The namespace, and so its addresses, outlive the
 * sandbox: a reset raises a new sandbox into the same one.
 */
export async function raiseMachine(
  ctx: LabContext,
  scenario: { name: string; id: string; spec: ScenarioSpec },
  index: number,
  trace: Trace,
  src: MachineSource = {},
): Promise<Machine> {
  const { from, copy = 'live' } = src;
  const m = scenario.spec.machines[index]!;
  const driver = m.driver ?? DEFAULT_DRIVER;
  const storage = from ? from.volume.kind : (src.storage ?? (await ctx.defaultStorage()));
  const netns = netnsPath(machineNetns(scenario.id, index, copy));
  // the range of the user namespace that owns the machine's network namespace, if one was made
  const uidBase = (await scenarioRanges(ctx.home, scenario.id, copy)).get(index);
  // one that should have a range (wireNetworks claimed one) and has none in the registry is not
  // raised without: in its network namespace without a user namespace, root inside is host root
  if (uidBase === undefined && !isVm(m) && usernsFor(ctx, { driver, storage }))
    throw new SnaplabError(
      'SCENARIO_FAILED',
      `machine ${m.name} of ${scenario.name} has no user namespace range in the host's registry (${copy} copy)`,
      `bring the scenario down and up again (\`snaplab down ${scenario.name}\`, then \`snaplab up FILE\`): its networks and ranges are made afresh`,
    );
  const { record, agent } = await raiseSandbox(
    ctx,
    {
      name: (copy === 'standby' ? standbySandbox : machineSandbox)(scenario.name, m.name),
      image: m.image,
      storage,
      driver,
      limits: withDefaults(m.limits, driver),
      base: from
        ? async (): Promise<Volume> => from.volume
        : (): Promise<Volume> => imageVolume(ctx, m.image, storage, trace),
      origin: from?.origin ?? null,
      scenario: scenario.name,
      hostname: m.hostname,
      netns,
      ...(isVm(m)
        ? {
            nics: m.networks.map((n, k) => ({
              tap: tapName(k),
              mac: macFor(n.address),
              address: `${n.address}/${n.prefix}`,
            })),
          }
        : {}),
      ...(from?.memory ? { memory: from.memory } : {}),
      ...(uidBase !== undefined ? { uidBase } : {}),
      ...(m.init ? { init: m.init } : {}),
      ...uplinkOf(scenario.spec, m),
    },
    trace,
  );
  const machine: Machine = { spec: m, record, agent, netns };
  if (!from) await agent.putFile('/etc/hosts', Buffer.from(hostsFile(scenario.spec, m)), 0o644);
  return machine;
}

/**
 * A machine on networks with an uplink gets egress of its own (its link to the home's router,
 * beside its network links), with the lists of those networks together.
 */
function uplinkOf(spec: ScenarioSpec, m: ScenarioSpec['machines'][number]): { egress?: EgressLists } {
  const ups = m.networks.flatMap((n) => spec.networks.find((x) => x.name === n.network)?.uplink ?? []);
  if (!ups.length) return {};
  return {
    egress: { allow: [...new Set(ups.flatMap((u) => u.allow))], deny: [...new Set(ups.flatMap((u) => u.deny))] },
  };
}

export function machineIndex(spec: ScenarioSpec, name: string): number {
  return spec.machines.findIndex((m: MachineFileSpec) => m.name === name);
}
