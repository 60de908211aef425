/**
 * Egress (docs/egress.md): each machine with egress has a namespace `snaplab-e<tag>-<slot>` (or,
 * a scenario machine, its own, with `up0` beside its links) whose link is a veth to the home's
 * router (egress-router.ts). The machine's root may rewrite its own namespace: nothing it does
 * there passes the router's rules, which check the link a packet came in on, its source
 * address and its holder's mark.
 */
import { basename, join } from 'node:path';
import { SnaplabError } from '../../errors.js';
import { noted, orElse } from '../../cleanup.js';
import { HostOps } from '../hostops.js';
import { withLock } from '../lock.js';
import { mapLimit } from '../../concurrency.js';
import {
  COUNTERS,
  GATEWAY,
  GUEST_LINK,
  guestLinkRuleset,
  ROUTER_LINK_MAC,
  ROUTER_TABLE,
  checkLists,
  homeTag,
  isHostName,
  machineEgressNetns,
  machineIf,
  machineLinkMac,
  machineRemoval,
  machineRules,
  routerNetns,
  routerRuleset,
  uplinkRuleset,
  slotAddress,
  type EgressLists,
} from './egress-rules.js';
import {
  batch,
  ensureRouter,
  failed,
  flowCapsNow,
  forgetFlows,
  hostAddresses,
  sweepFlows,
  hostSetCurrent,
  inNs,
  inUplink,
  nft,
  removeRouter,
} from './egress-router.js';
import { NET_GROUP, checkNetnsName, netnsPath } from './names.js';
import { createNetns, createNetnsBatch, deleteNetns, ipBatch, isNamespace, listSnaplabNetns } from './ns.js';
import { sharedNetnsDir, unwire } from './wire.js';

export { ensureRouter, hostAddresses, localPrefixes, removeRouter, sweepFlows } from './egress-router.js';

export interface EgressAttach {
  slot: number;
  lists: EgressLists;
  /** its holder's connection mark (egress-rules.ts newMark) */
  mark: number;
  /** the machine's user namespace, which is to own its network namespace (its root configures it) */
  userns?: { base: number; count: number };
  /**
   * a network namespace the machine has already (a scenario machine's, with its network links):
   * the link to the router is added there as `up0`, and detachEgress leaves the namespace
   */
  into?: string;
  /** a VM's: its guest reaches the namespace through a tap (GUEST_LINK), forwarded out as the slot's address */
  guest?: boolean;
}

/** The path of a machine's own egress namespace (a stopped machine keeps it: `start` joins it again). */
export const machineEgressNetnsPath = (home: string, slot: number): string =>
  netnsPath(machineEgressNetns(homeTag(home), slot));

/** The machine's side of its link to the router: eth0 in a namespace of its own, up0 beside a scenario machine's links. */
const machineSide = (a: { into?: string }): string => (a.into ? 'up0' : 'eth0');

/**
 * A machine's network namespace with eth0 linked to the router: its address by its slot, the
 * router as its gateway and DNS server, its rules loaded. Returns the namespace's path. On failure
 * removes what it made.
 */
export async function attachEgress(home: string, a: EgressAttach): Promise<string> {
  // (caps set wrong in SNAPLAB_EGRESS_CAPS: refused before anything is made)
  const caps = flowCapsNow().machine;
  const router = await ensureRouter(home);
  const tag = homeTag(home);
  const ns = a.into ? basename(a.into) : machineEgressNetns(tag, a.slot);
  const address = slotAddress(a.slot);
  const ifn = machineIf(a.slot);
  const dev = machineSide(a);
  // names first: one that does not resolve leaves nothing made
  const lists = await pinNames(checkLists(a.lists));
  // the router's set of the host's addresses, which no machine may reach, made current (the host's
  // may have changed since the last attach): before anything of the machine's is made
  const hostAddrs = await hostSetCurrent(home, router);
  // three steps in a row, each one spawn (or the host helper's request): the namespace; its side
  // of the link, made there with its peer put in the router; the router's side beside its rules
  try {
    if (!a.into) await makeMachineNetns(ns, a.userns);
    await batch(
      ns,
      [
        `link add ${dev} group ${NET_GROUP} address ${machineLinkMac(a.slot)} type veth peer name ${ifn} group ${NET_GROUP} address ${ROUTER_LINK_MAC} netns ${router}`,
        'link set lo up',
        `link set ${dev} addrgenmode none`,
        `addr add ${address}/32 dev ${dev}`,
        `link set ${dev} up`,
        `route add ${GATEWAY}/32 dev ${dev} scope link`,
        `route add default via ${GATEWAY} dev ${dev}`,
        // (each end in the other's neighbour table for good: ROUTER_LINK_MAC)
        `neigh replace ${GATEWAY} lladdr ${ROUTER_LINK_MAC} dev ${dev} nud permanent`,
      ],
      `cannot link ${ns} to the egress router`,
    );
    await Promise.all([
      batch(
        router,
        [
          `link set ${ifn} addrgenmode none`,
          `addr add ${GATEWAY}/32 dev ${ifn}`,
          `link set ${ifn} up`,
          `route add ${address}/32 dev ${ifn}`,
          `neigh replace ${address} lladdr ${machineLinkMac(a.slot)} dev ${ifn} nud permanent`,
        ],
        `cannot set up ${ifn} in the egress router`,
      ),
      nft(
        router,
        machineRules(a.slot, lists, { mark: a.mark, hostAddrs, caps }),
        `cannot load the egress rules of slot ${a.slot}`,
      ),
      a.guest ? linkGuest(ns, dev, a.into !== undefined) : undefined,
    ]);
  } catch (e) {
    await detachEgress(home, a.slot, { keepNetns: a.into !== undefined }).catch(
      noted(`remove the half-made egress of slot ${a.slot}`),
    );
    throw e;
  }
  return netnsPath(ns);
}

/** A VM's tap in the machine's namespace, the guest's gateway on it, forwarded out of `dev` (GUEST_LINK). */
async function linkGuest(ns: string, dev: string, kept: boolean): Promise<void> {
  const g = GUEST_LINK;
  // a scenario machine's namespace outlives its machines: a reset's last one may have left them
  if (kept) await unlinkGuest(ns);
  await batch(
    ns,
    [
      // persistent and root's: QEMU opens it before it drops to its own uid (wire.ts's taps too)
      `tuntap add dev ${g.tap} mode tap user 0`,
      `link set ${g.tap} group ${NET_GROUP}`,
      `link set ${g.tap} addrgenmode none`,
      `link set ${g.tap} address ${g.gatewayMac}`,
      `addr add ${g.gateway}/${g.prefix} dev ${g.tap}`,
      `link set ${g.tap} up`,
      // the guest's end, for good (ROUTER_LINK_MAC: the kernel's neighbour table is every namespace's)
      `neigh replace ${g.address.split('/')[0]} lladdr ${g.mac} dev ${g.tap} nud permanent`,
    ],
    `cannot make the guest's link in ${ns}`,
  );
  const [forward] = await Promise.all([
    // on these two alone: a scenario machine's namespace has its networks' bridges too
    inNs(ns, ['sysctl', '-qw', `net.ipv4.conf.${g.tap}.forwarding=1`, `net.ipv4.conf.${dev}.forwarding=1`], {
      allowFail: true,
    }),
    nft(ns, guestLinkRuleset(dev), `cannot load the guest's rules in ${ns}`),
  ]);
  if (forward.code !== 0) throw failed(`cannot turn forwarding on in ${ns}`, forward);
}

/** What linkGuest made in a namespace that stays (a scenario machine's). */
async function unlinkGuest(ns: string): Promise<void> {
  const res = await ipBatch(ns, [`link del ${GUEST_LINK.tap}`]);
  if (res.code !== 0 && !/Cannot find device|does not exist/i.test(res.stderr))
    throw failed(`cannot remove the guest's link in ${ns}`, res);
  for (const family of ['ip', 'arp']) {
    const t = await inNs(ns, ['nft', 'delete', 'table', family, `${ROUTER_TABLE}_guest`], { allowFail: true });
    if (t.code !== 0 && !/No such file or directory/.test(t.stderr))
      throw failed(`cannot remove the guest's rules in ${ns}`, t);
  }
}

async function makeMachineNetns(ns: string, userns?: { base: number; count: number }): Promise<void> {
  checkNetnsName(ns);
  if (!userns) {
    await createNetnsBatch([ns]); // (its loopback is brought up with its link)
    return;
  }
  await sharedNetnsDir();
  try {
    await HostOps.require().request('netns-userns', netnsPath(ns), String(userns.base), String(userns.count));
  } catch (e) {
    throw new SnaplabError(
      'HOST_COMMAND_FAILED',
      `cannot create network namespace ${ns} in a user namespace: ${(e as Error).message}`,
      '`snaplab doctor` checks user namespaces',
      { cause: e },
    );
  }
}

/** Replace a machine's lists: new connections meet them at once, established ones go on. */
/**
 * Replace a machine's lists (names pinned already: pinNames): every packet meets them from now
 * on. With `newMark` (a standby handed to its next user) its holder's mark changes too, so what
 * the last one left in the connection table passes no more, and its counters start from zero.
 */
export async function setEgressLists(
  home: string,
  slot: number,
  pinned: EgressLists,
  marks: { mark: number; newMark?: number },
): Promise<void> {
  const router = routerNetns(homeTag(home));
  const c = COUNTERS(slot);
  const reset =
    marks.newMark !== undefined
      ? [c.out, c.conns, c.denied].map((n) => `reset counter ip ${ROUTER_TABLE} ${n}\n`).join('')
      : '';
  const rules = machineRules(slot, pinned, {
    mark: marks.newMark ?? marks.mark,
    oldMark: marks.mark,
    hostAddrs: hostAddresses(),
    caps: flowCapsNow().machine,
    update: true,
  });
  await nft(router, `${rules}${reset}`, `cannot change the egress lists of slot ${slot}`);
  // a new holder: what the last one's flows left in the router's table and the host's goes
  // (in the background, as at a removal: detachEgress)
  if (marks.newMark !== undefined && marks.newMark !== marks.mark)
    void forgetFlows(home, slot, marks.mark).catch(noted(`forget the last holder's flows of egress slot ${slot}`));
}

/** Host names a machine's lists may hold (each one a lookup when they are set). */
const MAX_NAMES = 64;

/**
 * The lists with each host name replaced by the IPv4 addresses it has now, as the uplink's own
 * programs resolve it (`getent ahostsv4`, in the uplink namespace): resolve and pin. A name whose
 * addresses change later keeps the old ones until its lists are set again (docs/egress.md).
 */
export async function pinNames(lists: EgressLists): Promise<EgressLists> {
  const names = [...new Set([...lists.allow, ...lists.deny].filter(isHostName))];
  if (!names.length) return lists;
  if (names.length > MAX_NAMES)
    throw new SnaplabError(
      'BAD_INPUT',
      `egress lists name ${names.length} hosts`,
      `give at most ${MAX_NAMES} host names (addresses and prefixes have no such limit)`,
    );
  const found = new Map<string, string[]>();
  await mapLimit(names, 8, async (n) => {
    const res = await inUplink(['getent', 'ahostsv4', n], { allowFail: true });
    const addrs = [...new Set([...res.stdout.matchAll(/^(\d+\.\d+\.\d+\.\d+)\s/gm)].map((m) => m[1]!))];
    if (!addrs.length)
      throw new SnaplabError(
        'BAD_INPUT',
        `egress entry ${n} does not resolve to an IPv4 address on the uplink`,
        "check the name, or give its addresses; names are resolved by the host's resolver when the list is set",
      );
    found.set(n, addrs);
  });
  const pin = (xs: string[]): string[] => [...new Set(xs.flatMap((x) => found.get(x) ?? [x]))];
  return { allow: pin(lists.allow), deny: pin(lists.deny) };
}

/**
 * Remove a machine's egress: its rules in the router and its namespace (its link with it).
 * Idempotent. The rules go in one transaction when they are all there (the usual case); what a
 * crash left half made is read first and removed as it is.
 */
export async function detachEgress(
  home: string,
  slot: number,
  opts: { keepNetns?: boolean; mark?: number } = {},
): Promise<void> {
  const tag = homeTag(home);
  const router = routerNetns(tag);
  const ns = machineEgressNetns(tag, slot);
  const hasRouter = await isNamespace(netnsPath(router));
  // the link first, at once, from the router's end (both ends go): its name is free again for
  // the slot's next machine, and a scenario machine's namespace keeps its other links
  const link = async (): Promise<void> => {
    if (!hasRouter) return;
    const res = await ipBatch(router, [`link del ${machineIf(slot)}`]);
    if (res.code !== 0 && !/Cannot find device|does not exist/i.test(res.stderr))
      throw failed(`cannot remove the egress link of slot ${slot}`, res);
  };
  await Promise.all([hasRouter ? removeRules(router, slot, opts.mark) : undefined, link()]);
  // then what its flows left in the router's table and the host's (nothing of it can add more
  // now). A holder's (by its mark) in the background: the kernel walks its whole table for them
  // (~9 ms on this host), and no later machine's flows carry that mark. Without a mark (what a
  // crash left), before the slot can be given again.
  if (hasRouter) {
    const forgetting = forgetFlows(home, slot, opts.mark).catch(noted(`forget the flows of egress slot ${slot}`));
    if (opts.mark === undefined) await forgetting;
  }
  if (!opts.keepNetns) await unwire([ns]);
}

async function removeRules(router: string, slot: number, mark?: number): Promise<void> {
  const all = await inNs(router, ['nft', '-f', '-'], {
    input: machineRemoval(slot, { element: true, mark }),
    allowFail: true,
  });
  if (all.code === 0) return;
  // what a crash left: read what is there, remove that
  const listed = await inNs(router, ['nft', 'list', 'chain', 'ip', ROUTER_TABLE, `m${slot}`], { allowFail: true });
  const map = await inNs(router, ['nft', 'list', 'map', 'ip', ROUTER_TABLE, 'machines'], { allowFail: true });
  const inbound = await inNs(router, ['nft', 'list', 'map', 'ip', ROUTER_TABLE, 'inbound'], { allowFail: true });
  const element = new RegExp(`"${machineIf(slot)}"\\s*:`).test(map.stdout);
  const addr = slotAddress(slot).replace(/\./g, '\\.');
  const marks = [...inbound.stdout.matchAll(new RegExp(`\\b${addr} \\. (0x[0-9a-f]+|\\d+)\\b`, 'g'))].map((m) =>
    Number(m[1]),
  );
  const script = [
    ...marks.map((k) => `delete element ip ${ROUTER_TABLE} inbound { ${slotAddress(slot)} . ${k} }\n`),
    ...(listed.code === 0 ? [machineRemoval(slot, { element })] : []),
  ].join('');
  if (script) await nft(router, script, `cannot remove the egress rules of slot ${slot}`);
}

export interface EgressCounters {
  /** bytes the machine sent out through the router */
  bytesOut: number;
  /** connections it opened that were let through */
  connections: number;
  /** packets of connections refused (and spoofed packets dropped) */
  denied: number;
}

/** Every machine's counters in one read of the router's table: slot → counters. */
export async function egressCounters(home: string): Promise<Map<number, EgressCounters>> {
  const router = routerNetns(homeTag(home));
  const out = new Map<number, EgressCounters>();
  if (!(await isNamespace(netnsPath(router)))) return out;
  const res = await inNs(router, ['nft', '-j', 'list', 'counters', 'table', 'ip', ROUTER_TABLE], { allowFail: true });
  if (res.code !== 0) throw failed('cannot read the egress counters', res);
  const items = (
    JSON.parse(res.stdout) as { nftables: { counter?: { name: string; packets: number; bytes: number } }[] }
  ).nftables;
  for (const { counter: c } of items) {
    const m = c && /^m(\d+)_(bytes|conns|denied)$/.exec(c.name);
    if (!c || !m) continue;
    const slot = Number(m[1]);
    const v = out.get(slot) ?? { bytesOut: 0, connections: 0, denied: 0 };
    if (m[2] === 'bytes') v.bytesOut = c.bytes;
    else if (m[2] === 'conns') v.connections = c.packets;
    else v.denied = c.packets;
    out.set(slot, v);
  }
  return out;
}

/**
 * Egress objects of this home that no live slot holds: machine namespaces (and their rules), and
 * the router itself when no machine has egress. Returns what was removed.
 */
export async function collectEgress(home: string, live: () => Set<number>): Promise<string[]> {
  return withLock(join(home, 'run', 'egress.lock'), () => collectLocked(home, live));
}

/**
 * Under the home's egress lock, which every router make (ensureRouter) and every change of a
 * machine's rules hold: the store is read again for each candidate, just before it is removed. A
 * create records its slot before it asks for the router, so a router gc removes has no machine
 * recorded, and a create that comes after makes it again.
 */
async function collectLocked(home: string, live: () => Set<number>): Promise<string[]> {
  const tag = homeTag(home);
  const removed: string[] = [];
  const prefix = `${routerNetns(tag)}-`;
  for (const ns of await listSnaplabNetns()) {
    if (!ns.startsWith(prefix)) continue;
    const slot = Number(ns.slice(prefix.length));
    if (!Number.isSafeInteger(slot) || live().has(slot)) continue;
    await detachEgress(home, slot);
    removed.push(`egress namespace ${ns}`);
  }
  if (!live().size) {
    if (await removeRouter(home)) removed.push(`egress router ${routerNetns(tag)}`);
    return removed;
  }
  // rules whose machine went (a crash between the two removals, a scenario machine's)
  const router = routerNetns(tag);
  if (!(await isNamespace(netnsPath(router)))) return removed;
  const swept = await sweepFlows(home).catch(orElse(0, `sweep the flows of egress router ${router}`));
  if (swept) removed.push(`${swept} flow${swept === 1 ? '' : 's'} of egress router ${router} the router had ended`);
  const chains = await inNs(router, ['nft', 'list', 'chains', 'ip'], { allowFail: true });
  for (const m of chains.stdout.matchAll(/chain m(\d+) \{/g)) {
    const slot = Number(m[1]);
    if (live().has(slot)) continue;
    await detachEgress(home, slot);
    removed.push(`egress rules of slot ${slot}`);
  }
  return removed;
}

/**
 * Whether this host's nftables takes egress's rules: the router's table and one machine's chain
 * loaded into a scratch namespace (slot 0 of the home's, which no machine has: gc removes it if
 * this is killed), then removed. Undefined when it does; the nft error when not.
 */
export async function probeEgressRules(home: string): Promise<string | undefined> {
  const ns = machineEgressNetns(homeTag(home), 0);
  await createNetns(ns);
  try {
    const caps = flowCapsNow();
    const rules = `${routerRuleset({ hostAddrs: ['192.0.2.2'], dns: ['192.0.2.53'], transitRouter: '100.127.0.2', caps: caps.home })}\n${machineRules(1, { allow: ['192.0.2.1', '0.0.0.0/0'], deny: ['192.0.2.9'] }, { mark: 7, hostAddrs: ['192.0.2.2'], caps: caps.machine })}\n${uplinkRuleset('000000', { established: 432_000 })}`;
    const res = await inNs(ns, ['nft', '-f', '-'], { input: rules, allowFail: true });
    return res.code === 0 ? undefined : res.stderr.trim().split('\n')[0];
  } finally {
    await deleteNetns(ns);
  }
}

/** Run `fn` under the home's egress lock (what changes a machine's rules against what removes them). */
export const underEgressLock = <T>(home: string, fn: () => Promise<T>): Promise<T> =>
  withLock(join(home, 'run', 'egress.lock'), fn);
