import { SnaplabError } from '../../errors.js';
import { run } from '../run.js';
import { createNetnsBatch, deleteNetns, ipBatch, listSnaplabNetns } from './ns.js';
import { mkdir } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import {
  DEFAULT_BRIDGE,
  NETNS_DIR,
  NET_GROUP,
  checkCidr,
  checkIfName,
  checkNetnsName,
  macFor,
  netnsPath,
} from './names.js';
import { HostOps } from '../hostops.js';
import { noted } from '../../cleanup.js';

/** A whole scenario's networks, raised in one go: what `up` needs, in 1 + networks + machines spawns. */
export interface WirePlan {
  /** one namespace per network, holding its bridge */
  networks: { netns: string; bridge?: string }[];
  machines: {
    netns: string;
    /** made in a user namespace of its own, mapping 0..count-1 to base.. (the machine's, kept across resets) */
    userns?: { base: number; count: number };
    /**
     * a VM's namespace (QEMU runs in it): each link's `guestIf` gets no address but is bridged to a
     * tap of this name, which QEMU opens; the guest holds the address. Absent: the machine's
     * processes live in the namespace and `guestIf` holds the address
     */
    links: { bridgeNetns: string; hostIf: string; guestIf: string; address: string; tap?: string }[];
  }[];
}

/** The bridge that joins a VM's tap to its veth, in the VM's network namespace. */
const tapBridge = (tap: string): string => `br-${tap}`;

function validate(plan: WirePlan): Map<string, string> {
  const bridges = new Map<string, string>();
  for (const n of plan.networks) {
    checkNetnsName(n.netns);
    checkIfName(n.bridge ?? DEFAULT_BRIDGE, 'bridge');
    bridges.set(n.netns, n.bridge ?? DEFAULT_BRIDGE);
  }
  const names = new Set<string>(bridges.keys());
  for (const m of plan.machines) {
    checkNetnsName(m.netns);
    if (names.has(m.netns))
      throw new SnaplabError(
        'BAD_INPUT',
        `namespace ${m.netns} appears twice in the plan`,
        'give each network and machine its own namespace',
      );
    names.add(m.netns);
    for (const l of m.links) {
      if (!bridges.has(l.bridgeNetns))
        throw new SnaplabError(
          'BAD_INPUT',
          `machine ${m.netns} is linked to ${l.bridgeNetns}, which is not a network of the plan`,
          'list it under networks',
        );
      checkIfName(l.hostIf, 'bridge-side interface');
      checkIfName(l.guestIf, 'machine interface');
      checkCidr(l.address);
      if (l.tap !== undefined) {
        checkIfName(l.tap, 'tap');
        checkIfName(tapBridge(l.tap), 'tap bridge');
      }
    }
  }
  return bridges;
}

/**
 * Create every namespace of the plan (loopback up), a bridge in each network's, and each machine's
 * veths with their addresses: the same result as createNetns + addBridge + attach, with one spawn
 * per namespace instead of two or three per step. On failure, removes what it created and throws.
 */
export async function wire(plan: WirePlan): Promise<void> {
  const bridges = validate(plan);
  // a VM machine's taps need the tun device: said before anything is made
  if (plan.machines.some((m) => m.links.some((l) => l.tap)) && !existsSync('/dev/net/tun')) {
    throw new SnaplabError(
      'HOST_COMMAND_FAILED',
      'a VM machine needs /dev/net/tun for its taps, and this host has none',
      'load the tun module (`modprobe tun`); `snaplab doctor` checks it',
    );
  }
  const all = [...bridges.keys(), ...plan.machines.map((m) => m.netns)];
  await createNetnsBatch([...bridges.keys(), ...plan.machines.filter((m) => !m.userns).map((m) => m.netns)]);
  try {
    if (plan.machines.some((m) => m.userns)) await sharedNetnsDir();
    await Promise.all(
      plan.machines
        .filter((m) => m.userns)
        .map(async (m) => {
          try {
            await HostOps.require().request(
              'netns-userns',
              netnsPath(m.netns),
              String(m.userns!.base),
              String(m.userns!.count),
            );
          } catch (e) {
            throw new SnaplabError(
              'HOST_COMMAND_FAILED',
              `cannot create network namespace ${m.netns} in a user namespace: ${(e as Error).message}`,
              '`snaplab doctor` checks user namespaces',
              { cause: e },
            );
          }
        }),
    );
    const perNetwork = [...bridges].map(([ns, br]) => {
      const lines = [
        'link set lo up',
        `link add ${br} group ${NET_GROUP} type bridge stp_state 0 forward_delay 0 mcast_snooping 0`,
        `link set ${br} addrgenmode none`,
        `link set ${br} up`,
      ];
      for (const m of plan.machines) {
        for (const l of m.links.filter((x) => x.bridgeNetns === ns)) {
          // a VM's NIC has the address's MAC: its veth has one of its own, or the bridge between
          // them would take the guest's frames for its own
          lines.push(
            `link add ${l.hostIf} group ${NET_GROUP} master ${br} type veth peer name ${l.guestIf}${l.tap ? '' : ` address ${macFor(l.address)}`} netns ${m.netns}`,
            `link set ${l.hostIf} addrgenmode none`,
            `link set ${l.hostIf} up`,
          );
        }
      }
      return [ns, lines] as const;
    });
    await Promise.all(perNetwork.map(([ns, lines]) => batchOrThrow(ns, lines)));
    await Promise.all(
      plan.machines.map((m) =>
        batchOrThrow(m.netns, [
          'link set lo up',
          // no IPv6 link-local address: blocks and partitions are IPv4 routes, and fe80:: would go around them
          ...m.links.flatMap((l) => [
            `link set ${l.guestIf} group ${NET_GROUP}`,
            `link set ${l.guestIf} addrgenmode none`,
            ...(l.tap ? tapLines(l.guestIf, l.tap) : [`addr add ${l.address} dev ${l.guestIf}`]),
            `link set ${l.guestIf} up`,
          ]),
        ]),
      ),
    );
  } catch (e) {
    await unwire(all).catch(noted('unwire the half-wired network'));
    throw e;
  }
}

/**
 * A persistent tap owned by root (QEMU opens it as root, without CAP_NET_ADMIN, before it drops
 * to its own uid) and a bridge joining it to the veth `dev`, neither with an address: the
 * namespace only carries the VM's frames.
 */
function tapLines(dev: string, tap: string): string[] {
  const br = tapBridge(tap);
  return [
    `link add ${br} group ${NET_GROUP} type bridge stp_state 0 forward_delay 0 mcast_snooping 0`,
    `link set ${br} addrgenmode none`,
    `tuntap add dev ${tap} mode tap user 0`,
    `link set ${tap} group ${NET_GROUP}`,
    `link set ${tap} addrgenmode none`,
    `link set ${tap} master ${br}`,
    `link set ${tap} up`,
    `link set ${dev} master ${br}`,
    `link set ${br} up`,
  ];
}

/**
 * /run/netns as `ip netns add` leaves it: a mount of its own, shared, so that a namespace bound
 * there later reaches mount namespaces made before (a launch's) and is not hidden by ip's own
 * self-bind when it comes after ours (then `ip netns del` fails with EBUSY).
 */
export async function sharedNetnsDir(): Promise<void> {
  await mkdir(NETNS_DIR, { recursive: true });
  if ((await run('mount', ['--make-shared', NETNS_DIR], { allowFail: true })).code === 0) return;
  await run('mount', ['--bind', NETNS_DIR, NETNS_DIR]);
  await run('mount', ['--make-shared', NETNS_DIR]);
}

async function batchOrThrow(netns: string, lines: string[]): Promise<void> {
  const res = await ipBatch(netns, lines);
  if (res.code === 0) return;
  const line = Number(/Command failed -:(\d+)/.exec(res.stderr)?.[1] ?? 0);
  throw new SnaplabError(
    'HOST_COMMAND_FAILED',
    `cannot wire ${netns}: \`ip ${lines[line - 1] ?? '?'}\`: ${res.stderr.trim().split('\n')[0]}`,
    /File exists/.test(res.stderr)
      ? 'an interface or address of that name is there already: names and addresses must be unique'
      : /tuntap/.test(lines[line - 1] ?? '')
        ? "a VM machine's tap needs the tun module (`modprobe tun`) and /dev/net/tun"
        : '`snaplab doctor` checks networking',
  );
}

/**
 * Remove a whole scenario's namespaces (networks and machines together) in one spawn. Unlike
 * deleteNetns it does not delete links first: with every bridge namespace going too, the kernel
 * tears the veths down with the namespaces, in the background, and none of their names can collide
 * with a new scenario's (they live in namespaces that are gone from /run/netns). Deleting links
 * first would wait an RCU grace period per namespace, ~40 ms here. Idempotent; absent names skipped.
 */
export async function unwire(names: string[]): Promise<void> {
  names.forEach(checkNetnsName);
  const present = new Set(await listSnaplabNetns());
  const gone = names.filter((n) => present.has(n));
  if (!gone.length) return;
  const res = await run('ip', ['-force', '-batch', '-'], {
    input: gone.map((n) => `netns del ${n}\n`).join(''),
    allowFail: true,
  });
  if (res.code !== 0) for (const n of gone) await deleteNetns(n); // says which one and why
}
