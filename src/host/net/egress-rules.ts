/**
 * The addresses and nftables rules of egress (docs/egress.md), as text: what a machine may reach
 * is decided in snaplab's router namespace, never in the machine's own (whose root holds
 * CAP_NET_ADMIN there). Pure: host/net/egress.ts applies them.
 */
import { createHash } from 'node:crypto';
import { SnaplabError } from '../../errors.js';

/** A machine's lists: IPv4 addresses or prefixes; deny wins over allow. */
export interface EgressLists {
  allow: string[];
  deny: string[];
}

/** The router's table in its own namespace, and the uplink's in the uplink namespace. */
export const ROUTER_TABLE = 'snaplab';
/** The router's end of its link to the uplink. */
export const UPLINK_IF = 'up0';
/** Machines' addresses: 100.96.0.0/12 (shared address space, RFC 6598), one per slot. */
const MACHINES_BASE = ip4('100.96.0.0');
export const MACHINES_PREFIX = '100.96.0.0/12';
/** Every machine's gateway, and its DNS server: the router's address on each machine's link. */
export const GATEWAY = '100.96.0.1';
export const MAX_SLOT = 2 ** 20 - 3;

/**
 * Never reachable unless a machine's allow list names them: this network, private and shared
 * space, loopback, link-local (cloud metadata at 169.254.169.254), benchmarking, multicast and
 * reserved. The host's own addresses are added to the set `host` when the router is made.
 */
export const DENIED_BY_DEFAULT = [
  '0.0.0.0/8',
  '10.0.0.0/8',
  '100.64.0.0/10',
  '127.0.0.0/8',
  '169.254.0.0/16',
  '172.16.0.0/12',
  '192.0.0.0/24',
  '192.168.0.0/16',
  '198.18.0.0/15',
  '224.0.0.0/3',
];

function ip4(s: string): number {
  const p = s.split('.').map(Number);
  return ((p[0]! << 24) | (p[1]! << 16) | (p[2]! << 8) | p[3]!) >>> 0;
}
const dotted = (n: number): string => [24, 16, 8, 0].map((s) => (n >>> s) & 255).join('.');

/** A home's tag: six hex digits of its path's hash, in its namespaces' names (gc finds them by it). */
export const homeTag = (home: string): string => createHash('sha256').update(home).digest('hex').slice(0, 6);
export const routerNetns = (tag: string): string => `snaplab-e${tag}`;
export const machineEgressNetns = (tag: string, slot: number): string => `snaplab-e${tag}-${slot}`;
/** A router or machine namespace of egress: the home's tag, and the slot of a machine's. */
export const EGRESS_NETNS = /^snaplab-e([0-9a-f]{6})(?:-(\d+))?$/;
/** The uplink's end of the router's link, in the uplink namespace (the host's by default). */
export const uplinkIf = (tag: string): string => `sle${tag}`;
export const uplinkTable = (tag: string): string => `snaplab_e${tag}`;
/** The router's end of a machine's link. */
export const machineIf = (slot: number): string => `e${slot}`;

/**
 * The link-layer addresses of a machine's link, each end in the other's neighbour table for good
 * (`nud permanent`): the kernel's neighbour table is one for every namespace, refuses new entries
 * past `gc_thresh3` (1 024 by default) while the ones it has are in use, and does not count
 * permanent ones. With an entry learned by ARP at each end, ~500 machines talking at once filled it
 * ("neighbour table overflow": their packets dropped). The router's end is the same on every link
 * (each link is a pair of its own; Calico's shape); a machine's is drawn from its slot.
 */
export const ROUTER_LINK_MAC = 'ee:ee:ee:ee:ee:ee';
export const machineLinkMac = (slot: number): string =>
  `02:5e:00:${[16, 8, 0].map((b) => ((slot >>> b) & 255).toString(16).padStart(2, '0')).join(':')}`;

/** The machine's address in slot `slot` (from 1). */
export function slotAddress(slot: number): string {
  if (!Number.isSafeInteger(slot) || slot < 1 || slot > MAX_SLOT)
    throw new SnaplabError('BAD_INPUT', `egress slot ${slot} is out of range`, `slots are 1..${MAX_SLOT}`);
  return dotted(MACHINES_BASE + 1 + slot);
}

/** The slot a machine's address is in (slotAddress's inverse). */
export function slotOf(address: string): number {
  return ip4(address) - MACHINES_BASE - 1;
}

/** The /30 between the router (`.2`) and the uplink (`.1`): one of 100.127.0.0/16's, by the tag. */
export function transit(tag: string): { uplink: string; router: string } {
  const base = ip4('100.127.0.0') + 4 * (Number.parseInt(tag, 16) % 16384);
  return { uplink: dotted(base + 1), router: dotted(base + 2) };
}

/** A host name as a list may hold it (resolved when the list is set: host/net/egress.ts). */
const HOST_NAME =
  /^(?=.{1,253}$)([a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*\.?$/i;
export const isHostName = (entry: string): boolean => !/^[\d./]+$/.test(entry) && HOST_NAME.test(entry);

/**
 * An entry of a list as nft takes it: an address or a prefix (its host bits cleared), or a host
 * name (lower case, resolved when the list is set).
 */
export function checkEntry(entry: string): string {
  const trimmed = entry.trim();
  if (isHostName(trimmed)) return trimmed.toLowerCase().replace(/\.$/, '');
  const m = /^(\d{1,3}(?:\.\d{1,3}){3})(?:\/(\d{1,2}))?$/.exec(trimmed);
  const parts = m?.[1]?.split('.').map(Number);
  const len = m?.[2] === undefined ? 32 : Number(m[2]);
  if (!m || !parts || parts.some((p) => p > 255) || len > 32)
    throw new SnaplabError(
      'BAD_INPUT',
      `egress entry "${entry}" is not an IPv4 address, prefix or host name`,
      'give e.g. 203.0.113.7, 198.51.100.0/24 or example.com (IPv6 has no egress yet)',
    );
  const mask = len === 0 ? 0 : (0xffffffff << (32 - len)) >>> 0;
  const net = (ip4(m[1]!) & mask) >>> 0;
  return len === 32 ? dotted(net) : `${dotted(net)}/${len}`;
}

export function checkLists(l: Partial<EgressLists>): EgressLists {
  const one = (xs: unknown, what: string): string[] => {
    if (xs === undefined) return [];
    if (!Array.isArray(xs) || xs.some((x) => typeof x !== 'string'))
      throw new SnaplabError('BAD_INPUT', `egress ${what} must be a list of strings`, 'e.g. ["203.0.113.0/24"]');
    if (xs.length > 4096)
      throw new SnaplabError('BAD_INPUT', `egress ${what} has ${xs.length} entries`, 'give at most 4096');
    return [...new Set((xs as string[]).map(checkEntry))];
  };
  return { allow: one(l.allow, 'allow'), deny: one(l.deny, 'deny') };
}

/**
 * A cap on flows: at most `rate` new a second after a `burst`, and (a machine's) `active` at once.
 * A home has no count of its own: the kernel walks a count's whole list at each new flow (in
 * softirq, charged to no machine), ~45 ns an entry here, and a home's list of 32 768 made each new
 * flow cost ~1.5 ms of the host's CPU.
 */
export interface FlowCap {
  rate: number;
  burst: number;
  active?: number;
}

/**
 * How many connections (the kernel's tracked flows) egress lets through, from the host's
 * `nf_conntrack_max` (M; docs/egress.md "Flows"): each machine at most M/4096 new a second after a
 * burst of M/256, and M/256 open at once; all of a home's machines together M/1024 new a second
 * after M/32. Every flow a machine opens is an entry in the uplink's (the host's) table too, M
 * entries for everything the host does: with these caps and the uplink's timeouts for closing
 * connections (uplinkRuleset, 60 s at most), one machine holds at most about M/44 of it, and a
 * home's machines about M/11 in flows that are not open, plus M/256 for each machine's open ones.
 */
export function flowCaps(conntrackMax: number): { machine: Required<FlowCap>; home: FlowCap } {
  const m = Math.max(0, Math.floor(conntrackMax) || 0);
  const at = (d: number): number => Math.max(1, Math.floor(m / d));
  return {
    machine: { rate: at(4096), burst: at(256), active: at(256) },
    home: { rate: at(1024), burst: at(32) },
  };
}

/**
 * The first packet of a connection (`ct state new` holds for every packet sent before an answer;
 * a connection is confirmed in the table once its first packet has passed).
 */
const FIRST = 'ct state new ct status ! confirmed';
/** Refuse what goes over `cap`: rate first, then the count of open connections. */
const capRules = (cap: FlowCap, count: string): string[] => [
  `${FIRST} limit rate over ${cap.rate}/second burst ${cap.burst} packets counter name ${count} reject`,
  ...(cap.active ? [`${FIRST} ct count over ${cap.active} counter name ${count} reject`] : []),
];

const elements = (xs: string[]): string => (xs.length ? ` elements = { ${xs.join(', ')} }` : '');
const chain = (slot: number): string => `m${slot}`;
const counterNames = (slot: number) => ({ out: `m${slot}_bytes`, conns: `m${slot}_conns`, denied: `m${slot}_denied` });

/**
 * The router's table: forwarding only from a machine's link (each through its own chain, by the
 * interface it came in on) and back to it on established connections; DNS to the gateway sent on
 * to the uplink's resolvers; everything masqueraded out of the uplink. `hostAddrs` are the uplink
 * namespace's own addresses, denied like the defaults.
 */
export function routerRuleset(o: { hostAddrs: string[]; dns: string[]; transitRouter: string; caps: FlowCap }): string {
  const dnat = o.dns[0];
  return [
    `table ip ${ROUTER_TABLE} {`,
    `  set defaults { type ipv4_addr; flags interval; auto-merge;${elements(DENIED_BY_DEFAULT)} }`,
    `  set host { type ipv4_addr; flags interval; auto-merge;${elements(o.hostAddrs.map((a) => (a.includes('/') ? a : `${a}/32`)))} }`,
    '  map machines { type ifname : verdict; }',
    // a reply comes in only to the machine whose connection it is: its address and its holder's mark
    '  map inbound { type ipv4_addr . mark : verdict; }',
    '  chain forward {',
    '    type filter hook forward priority 0; policy drop;',
    `    iifname "${UPLINK_IF}" ct state established,related ip daddr . ct mark vmap @inbound`,
    '    iifname vmap @machines',
    '  }',
    ...homeFlowLines(o.caps),
    '  chain input {',
    '    type filter hook input priority 0; policy drop;',
    '    iifname "lo" accept',
    `    iifname "${UPLINK_IF}" ct state established,related accept`,
    '    meta l4proto tcp reject with tcp reset',
    '    reject with icmp type admin-prohibited',
    '  }',
    '  chain prerouting {',
    '    type nat hook prerouting priority -100;',
    ...(dnat
      ? [`    ip daddr ${GATEWAY} udp dport 53 dnat to ${dnat}`, `    ip daddr ${GATEWAY} tcp dport 53 dnat to ${dnat}`]
      : []),
    '  }',
    '  chain postrouting {',
    '    type nat hook postrouting priority 100;',
    `    oifname "${UPLINK_IF}" snat to ${o.transitRouter}`,
    '  }',
    '}',
    `table arp ${ROUTER_TABLE} {`,
    '  chain input {',
    '    type filter hook input priority 0; policy accept;',
    `    ${ARP_RULE}`,
    '  }',
    '}',
  ].join('\n');
}

/**
 * No ARP from a machine's link reaches the router: both ends are in each other's neighbour table
 * for good (ROUTER_LINK_MAC), and the kernel takes the sender of every request it answers into
 * its neighbour table, which is one for the whole host. A sandbox (CAP_NET_RAW) sending requests
 * for the gateway from 1 100 made-up senders filled it: the host's own new neighbours were refused.
 */
const ARP_RULE = `iifname != "${UPLINK_IF}" drop`;

/**
 * The home's cap on the flows of all its machines together: a base chain after `forward` (which
 * accepts what a machine may send), so a flow its own machine's cap refused takes nothing of the
 * home's. Its refusals are counted in `flows_refused`.
 */
export const HOME_FLOWS_CHAIN = 'flows';
const homeFlowLines = (cap: FlowCap): string[] => [
  '  counter flows_refused {}',
  `  chain ${HOME_FLOWS_CHAIN} {`,
  '    type filter hook forward priority 10; policy accept;',
  `    iifname "${UPLINK_IF}" accept`,
  ...capRules(cap, 'flows_refused').map((r) => `    ${r}`),
  '  }',
  `  chain ${EARLY_CHAIN} {`,
  '    type filter hook prerouting priority -300; policy accept;',
  ...EARLY_RULES.map((r) => `    ${r}`),
  '  }',
];

/**
 * Before the router's connection table sees them: what a machine sends that the router would
 * drop only after its table took it in (a frame not to the router's own address: broadcast or
 * multicast, which is not forwarded; a TTL of 1, which expires in forwarding; IP options). A reset
 * sent so closed the router's entry while the uplink's (the host's) stayed established, counted
 * by no cap and found by no forget.
 */
const EARLY_CHAIN = 'early';
const EARLY_RULES = [
  `iifname "${UPLINK_IF}" accept`,
  'meta pkttype != host drop',
  'ip ttl < 2 drop',
  'ip hdrlength != 5 drop',
];

/** The home's cap added to a router an earlier build made (ensureRouter): idempotent. */
export const homeFlowsUpgrade = (cap: FlowCap): string =>
  `${[
    `table ip ${ROUTER_TABLE} {`,
    `  chain ${HOME_FLOWS_CHAIN} { type filter hook forward priority 10; policy accept; }`,
    `  chain ${EARLY_CHAIN} { type filter hook prerouting priority -300; policy accept; }`,
    '}',
    `flush chain ip ${ROUTER_TABLE} ${EARLY_CHAIN}`,
    ...EARLY_RULES.map((r) => `add rule ip ${ROUTER_TABLE} ${EARLY_CHAIN} ${r}`),
    `add counter ip ${ROUTER_TABLE} flows_refused`,
    `flush chain ip ${ROUTER_TABLE} ${HOME_FLOWS_CHAIN}`,
    `add rule ip ${ROUTER_TABLE} ${HOME_FLOWS_CHAIN} iifname "${UPLINK_IF}" accept`,
    ...capRules(cap, 'flows_refused').map((r) => `add rule ip ${ROUTER_TABLE} ${HOME_FLOWS_CHAIN} ${r}`),
  ].join('\n')}\n`;

/**
 * The machines' links closed to ARP, added to a router an earlier build made (ensureRouter), once
 * every link it has is one whose ends are permanent entries: idempotent.
 */
export const arpClosedUpgrade = (): string =>
  `${[
    `table arp ${ROUTER_TABLE} { chain input { type filter hook input priority 0; policy accept; }; }`,
    `flush chain arp ${ROUTER_TABLE} input`,
    `add rule arp ${ROUTER_TABLE} input ${ARP_RULE}`,
  ].join('\n')}\n`;

/** Whether `entry` (an address or prefix) lies inside one of `prefixes`: it names that range on purpose. */
function inside(entry: string, prefixes: string[]): boolean {
  const [a, l] = entry.split('/');
  const len = l === undefined ? 32 : Number(l);
  const n = ip4(a!);
  return prefixes.some((p) => {
    const [b, pl] = p.split('/');
    const plen = pl === undefined ? 32 : Number(pl);
    if (plen > len) return false;
    const mask = plen === 0 ? 0 : (0xffffffff << (32 - plen)) >>> 0;
    return (n & mask) >>> 0 === (ip4(b!) & mask) >>> 0;
  });
}

/** Other machines and the router's links: never reachable, whatever a list says. */
export const NEVER = [MACHINES_PREFIX, '100.127.0.0/16'];

/**
 * One machine's objects in the router's table (its counters, lists and chains, its entries in the
 * `machines` and `inbound` maps), or, `update`, its lists and chain replaced: in one nft
 * transaction either way, so a packet never meets half a change. Every packet from the machine
 * meets the lists (not only a connection's first): a change cuts what it no longer allows at
 * once. Each of its connections is marked with `mark`, the holder's (a new one per sandbox, and
 * per user of a pool's standby): a flow another holder of the slot left in the router's
 * connection table passes neither way. A packet must come from the machine's own address; other
 * machines and the router's links are never reachable; deny beats allow; an allow entry inside
 * the defaults (a private network named on purpose) or naming a host address opens it, a wider
 * one (0.0.0.0/0) does not; with an allow list nothing else passes. A refused connection is reset
 * (TCP) or answered "administratively prohibited": it fails at once instead of hanging.
 */
export function machineRules(
  slot: number,
  lists: EgressLists,
  o: { mark: number; hostAddrs: string[]; caps: FlowCap; update?: boolean; oldMark?: number },
): string {
  const t = ROUTER_TABLE;
  const m = chain(slot);
  const c = counterNames(slot);
  const addr = slotAddress(slot);
  const rule = (r: string): string => `add rule ip ${t} ${m} ${r}`;
  const refuse = (tag: string): string[] => [
    rule(`${tag} counter name ${c.denied} meta l4proto tcp reject with tcp reset`),
    rule(`${tag} counter name ${c.denied} reject with icmp type admin-prohibited`),
  ];
  const named = [...DENIED_BY_DEFAULT, ...o.hostAddrs.map((h) => (h.includes('/') ? h : `${h}/32`))];
  const narrow = lists.allow.filter((e) => inside(e, named));
  const wide = lists.allow.filter((e) => !inside(e, named));
  const sets = ['deny', 'narrow', 'wide'] as const;
  const lines = o.update
    ? sets.map((x) => `flush set ip ${t} ${m}_${x}`)
    : [
        `add counter ip ${t} ${c.out}`,
        `add counter ip ${t} ${c.conns}`,
        `add counter ip ${t} ${c.denied}`,
        ...sets.map((x) => `add set ip ${t} ${m}_${x} { type ipv4_addr; flags interval; auto-merge; }`),
        `add chain ip ${t} ${m}`,
        `add chain ip ${t} ${m}_ok`,
      ];
  const fill = (x: (typeof sets)[number], xs: string[]): void => {
    if (xs.length) lines.push(`add element ip ${t} ${m}_${x} { ${xs.join(', ')} }`);
  };
  fill('deny', lists.deny);
  fill('narrow', narrow);
  fill('wide', wide);
  const newHolder = o.oldMark !== undefined && o.oldMark !== o.mark;
  // what passes: within the machine's cap on connections (docs/egress.md "Flows"), counted, and a
  // new connection once. Made again only for a new holder (its cap and counts start afresh): a
  // change of lists keeps them, or each change would give the machine a full cap again
  if (!o.update || newHolder)
    lines.push(
      `flush chain ip ${t} ${m}_ok`,
      ...capRules(o.caps, c.denied).map((r) => `add rule ip ${t} ${m}_ok ${r}`),
      `add rule ip ${t} ${m}_ok counter name ${c.out}`,
      `add rule ip ${t} ${m}_ok ct state new counter name ${c.conns}`,
      `add rule ip ${t} ${m}_ok accept`,
    );
  lines.push(
    `flush chain ip ${t} ${m}`,
    // a packet the connection table cannot place (an ICMP error about no flow of its, a TCP
    // segment out of its window) has no mark and would pass the marks' check and the caps
    rule(`ct state invalid counter name ${c.denied} drop`),
    rule(`ip saddr != ${addr} counter name ${c.denied} drop`),
    rule(`ct state new ct mark set ${o.mark}`),
    rule(`ct mark != ${o.mark} counter name ${c.denied} drop`),
    ...refuse(`ip daddr { ${NEVER.join(', ')} }`),
    // the one DNAT is DNS to the uplink's resolver, which may be a private address
    rule(`ct status dnat jump ${m}_ok`),
    ...refuse(`ip daddr @${m}_deny`),
    rule(`ip daddr @${m}_narrow jump ${m}_ok`),
    ...refuse('ip daddr @defaults'),
    ...refuse('ip daddr @host'),
    rule(`ip daddr @${m}_wide jump ${m}_ok`),
    ...(lists.allow.length ? refuse('') : [rule(`jump ${m}_ok`)]),
  );
  if (!o.update) lines.push(`add element ip ${t} machines { "${machineIf(slot)}" : jump ${m} }`);
  if (newHolder) lines.push(`delete element ip ${t} inbound { ${addr} . ${o.oldMark} }`);
  if (!o.update || newHolder) lines.push(`add element ip ${t} inbound { ${addr} . ${o.mark} : accept }`);
  return `${lines.join('\n')}\n`;
}

/** Remove a machine's objects from the router's table (its map entries first: they lead to its chain). */
export function machineRemoval(slot: number, present: { element: boolean; mark?: number }): string {
  const t = ROUTER_TABLE;
  const m = chain(slot);
  const c = counterNames(slot);
  return `${[
    ...(present.element ? [`delete element ip ${t} machines { "${machineIf(slot)}" }`] : []),
    ...(present.mark !== undefined
      ? [`delete element ip ${t} inbound { ${slotAddress(slot)} . ${present.mark} }`]
      : []),
    `delete chain ip ${t} ${m}`,
    `delete chain ip ${t} ${m}_ok`,
    `delete set ip ${t} ${m}_deny`,
    `delete set ip ${t} ${m}_narrow`,
    `delete set ip ${t} ${m}_wide`,
    `delete counter ip ${t} ${c.out}`,
    `delete counter ip ${t} ${c.conns}`,
    `delete counter ip ${t} ${c.denied}`,
  ].join('\n')}\n`;
}

/** A new holder's connection mark: 31 random bits, never 0 (the mark of what nobody marked). */
export const newMark = (): number => 1 + Math.floor(Math.random() * 0x7ffffffe);

/** The set `host` replaced by these addresses (egress-router.ts hostSetCurrent). */
export const hostSetLines = (prefixes: string[]): string =>
  `flush set ip ${ROUTER_TABLE} host\n${prefixes.length ? `add element ip ${ROUTER_TABLE} host { ${prefixes.join(', ')} }\n` : ''}`;

/** Counter names → what they count, for reading them back. */
export const COUNTERS = counterNames;

/** Seconds a machine's TCP connection stays in the uplink's table in each state but `established`. */
export const CLOSING_TIMEOUTS =
  'syn_sent: 30, syn_recv: 30, fin_wait: 30, close_wait: 30, last_ack: 30, time_wait: 30, close: 10, retrans: 60, unack: 60';

/**
 * The uplink namespace's table: the router's link may forward out and be answered, and what leaves
 * by another interface is masqueraded (the host's own address, as any of its programs would use).
 */
export function uplinkRuleset(tag: string, o: { established: number }): string {
  const ifn = uplinkIf(tag);
  return [
    `table ip ${uplinkTable(tag)} {`,
    // a machine's TCP connection that is closing or was never answered leaves the host's table
    // within a minute, not two or five (the kernel's defaults): the host's table holds the
    // connections of every machine (docs/egress.md "Flows")
    '  ct timeout closing {',
    '    protocol tcp; l3proto ip;',
    // (every state a policy does not name takes nft's default, not the host's: established is
    // the host's, which an administrator may have lowered)
    `    policy = { established: ${o.established}, ${CLOSING_TIMEOUTS} }`,
    '  }',
    '  chain prerouting {',
    '    type filter hook prerouting priority -150; policy accept;',
    // nothing but the router's own address comes out of its link (a packet that passed the
    // router untranslated, one its table could not place, is not the host's to forward)
    `    iifname "${ifn}" ip saddr != ${transit(tag).router} drop`,
    // (as the connection is made, in prerouting: it is confirmed in the table once it leaves)
    `    iifname "${ifn}" meta l4proto tcp ct timeout set "closing"`,
    '  }',
    '  chain forward {',
    '    type filter hook forward priority 0; policy accept;',
    `    iifname "${ifn}" accept`,
    `    oifname "${ifn}" ct state established,related accept`,
    `    oifname "${ifn}" drop`,
    '  }',
    '  chain postrouting {',
    '    type nat hook postrouting priority 100;',
    `    iifname "${ifn}" oifname != "${ifn}" masquerade`,
    '  }',
    '}',
  ].join('\n');
}

/**
 * A VM's guest (a kernel of its own) reaches its machine's namespace through a tap: the guest has
 * the same address and gateway in every VM (a memory snapshot continues on any slot), and the
 * namespace sends what it forwards out of `dev` as the slot's address, which is what the router
 * checks. The tap's end of the link is the gateway; nothing listens there.
 */
export const GUEST_LINK = {
  tap: 'uptap',
  mac: '52:54:00:64:7e:02',
  address: '100.126.0.2/30',
  gateway: '100.126.0.1',
  /** the tap's: a restored guest's neighbour table still holds it */
  gatewayMac: '52:54:00:64:7e:01',
  prefix: 30,
} as const;

/** The machine namespace's table for a VM: the guest's link forwarded out of `dev` as its address, and answered; nothing else. */
export function guestLinkRuleset(dev: string): string {
  const t = GUEST_LINK.tap;
  return [
    `table ip ${ROUTER_TABLE}_guest {`,
    '  chain forward {',
    // accept by default: a scenario machine's namespace bridges its networks' frames, which pass
    // here too where br_netfilter is loaded
    '    type filter hook forward priority 0; policy accept;',
    `    iifname "${t}" ct state invalid drop`,
    `    iifname "${t}" oifname "${dev}" accept`,
    `    iifname "${dev}" oifname "${t}" ct state established,related accept`,
    `    iifname { "${t}", "${dev}" } drop`,
    `    oifname { "${t}", "${dev}" } drop`,
    '  }',
    '  chain postrouting {',
    '    type nat hook postrouting priority 100;',
    `    iifname "${t}" oifname "${dev}" masquerade`,
    '  }',
    '}',
    // the guest asks for its gateway (it answers from the tap); from any other sender, a request
    // would put that sender in the host's one neighbour table (ARP_RULE)
    `table arp ${ROUTER_TABLE}_guest {`,
    '  chain input {',
    '    type filter hook input priority 0; policy accept;',
    `    iifname "${t}" arp saddr ip != ${GUEST_LINK.address.split('/')[0]} drop`,
    '  }',
    '}',
  ].join('\n');
}
