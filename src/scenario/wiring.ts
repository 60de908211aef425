import { listSnaplabNetns, unwire, wire } from '../host/net/netns.js';
import { USERNS_SIZE } from '../host/userns/id-ranges.js';
import { allScenarioRanges, claimRange, machineHolder, machineOf, releaseRange } from '../host/userns/registry.js';
import type { LabContext } from '../lab/context.js';
import { usernsFor } from '../lab/lifecycle/raise.js';
import { DEFAULT_DRIVER } from '../defaults.js';
import type { StorageKind } from '../storage/backend.js';
import type { Trace } from '../timing/trace.js';
import { type Copy, isVm, netnsOf, machineNetns, networkNetns, tapName, vethName } from './names.js';
import type { ScenarioSpec } from './spec.js';

/**
 * Make one copy of a scenario's networks: a namespace per network holding its bridge; one per
 * machine with its veths. Where the machines' storage gives them user namespaces, each machine's
 * network namespace is made in a user namespace of the machine's own (a range claimed here, held
 * by the copy's machine), which every sandbox raised into it joins: its root has its
 * capabilities over its own network (ping, port 80), and a reset keeps namespace, range and
 * addresses alike. A standby copy has the same addresses, bridges and veth names in namespaces of
 * its own: nothing joins it to the live copy.
 */
export async function wireNetworks(
  ctx: LabContext,
  sid: string,
  spec: ScenarioSpec,
  storage: StorageKind,
  trace: Trace,
  copy: Copy = 'live',
): Promise<void> {
  // a VM's namespace holds its QEMU and its taps, no process of the guest's: it needs no range
  const userns = (j: number): boolean => {
    const m = spec.machines[j]!;
    return !isVm(m) && usernsFor(ctx, { driver: m.driver ?? DEFAULT_DRIVER, storage });
  };
  const ranges = await trace.phase('user namespace ranges', () =>
    Promise.all(
      spec.machines.map((_, j) => (userns(j) ? claimRange(ctx.home, machineHolder(sid, j, copy)) : undefined)),
    ),
  );
  await trace.phase('networks', () =>
    wire({
      networks: spec.networks.map((_, i) => ({ netns: networkNetns(sid, i, copy) })),
      machines: spec.machines.map((m, j) => ({
        netns: machineNetns(sid, j, copy),
        ...(ranges[j] !== undefined ? { userns: { base: ranges[j], count: USERNS_SIZE } } : {}),
        links: m.networks.map((n, k) => ({
          bridgeNetns: networkNetns(
            sid,
            spec.networks.findIndex((x) => x.name === n.network),
            copy,
          ),
          hostIf: vethName(sid, j, k),
          guestIf: `eth${k}`,
          address: `${n.address}/${n.prefix}`,
          ...(isVm(m) ? { tap: tapName(k) } : {}),
        })),
      })),
    }),
  );
}

/**
 * Remove one copy's namespaces (networks and machines) and give back its machines' ranges (their
 * user namespaces went with their network namespaces, and their sandboxes before); without
 * `copy`, every copy's: the whole scenario's.
 */
export async function unwireNetworks(home: string, sid: string, copy?: Copy): Promise<void> {
  const ours = (c: Copy | undefined): boolean => c !== undefined && (copy === undefined || c === copy);
  await unwire((await listSnaplabNetns()).filter((ns) => netnsOf(ns)?.sid === sid && ours(netnsOf(ns)?.copy)));
  for (const [base, holder] of await allScenarioRanges(home, sid))
    if (ours(machineOf(holder)?.copy)) await releaseRange(base, home, holder);
}
