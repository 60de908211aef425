/**
 * Egress's router (docs/egress.md): a home's namespace `snaplab-e<tag>` between its machines and
 * the uplink (the host's own network namespace, or $SNAPLAB_UPLINK_NETNS), holding every filter
 * and the NAT, made once and trusted by a note; the uplink's side (its link, forwarding and
 * masquerade, undone by gc); the host's local addresses and resolvers it reads. What a machine's
 * link and rules are: egress.ts.
 */
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SnaplabError } from '../../errors.js';
import { noted, orElse, recordFailure } from '../../cleanup.js';
import { HostOpError, HostOps } from '../hostops.js';
import { withLock } from '../lock.js';
import { requireTool, run, which, type RunResult } from '../run.js';
import {
  EGRESS_NETNS,
  ROUTER_TABLE,
  UPLINK_IF,
  flowCaps,
  arpClosedUpgrade,
  homeFlowsUpgrade,
  type FlowCap,
  homeTag,
  hostSetLines,
  routerNetns,
  routerRuleset,
  slotAddress,
  transit,
  uplinkIf,
  uplinkRuleset,
  uplinkTable,
} from './egress-rules.js';
import { NET_GROUP, NETNS_DIR, netnsPath } from './names.js';
import { createNetns, deleteNetns, ipBatch, isNamespace, listSnaplabNetns } from './ns.js';

/** The uplink: a namespace under /run/netns named by $SNAPLAB_UPLINK_NETNS (tests' "outside"), or the host's. */
export function uplink(): string | undefined {
  const name = process.env.SNAPLAB_UPLINK_NETNS;
  if (!name) return undefined;
  if (!/^[A-Za-z0-9_.-]{1,200}$/.test(name) || !existsSync(join(NETNS_DIR, name)))
    throw new SnaplabError(
      'BAD_INPUT',
      `SNAPLAB_UPLINK_NETNS=${name} names no network namespace under ${NETNS_DIR}`,
      'unset it to use the host network, or make it first (`ip netns add NAME`)',
    );
  return name;
}

/** Run argv in the uplink namespace. */
export const inUplink = (argv: string[], opts: { input?: string; allowFail?: boolean } = {}): Promise<RunResult> => {
  const up = uplink();
  return up ? run('ip', ['netns', 'exec', up, ...argv], opts) : run(argv[0]!, argv.slice(1), opts);
};
export const inNs = (
  ns: string,
  argv: string[],
  opts: { input?: string; allowFail?: boolean } = {},
): Promise<RunResult> => run('ip', ['netns', 'exec', ns, ...argv], opts);

export function failed(what: string, res: RunResult, hint = '`snaplab doctor` checks egress'): SnaplabError {
  return new SnaplabError(
    'HOST_COMMAND_FAILED',
    `${what}: ${res.stderr.trim().split('\n').slice(0, 3).join('; ')}`,
    hint,
  );
}

export async function nft(
  ns: string | null,
  script: string,
  what: string,
  hint = 'egress needs nftables (`apt-get install nftables`); `snaplab doctor` checks it',
): Promise<void> {
  const argv = ['nft', '-f', '-'];
  const res =
    ns === null
      ? await inUplink(argv, { input: script, allowFail: true })
      : await inNs(ns, argv, { input: script, allowFail: true });
  if (res.code !== 0) throw failed(what, res, hint);
}

export async function batch(ns: string, lines: string[], what: string): Promise<void> {
  const res = await ipBatch(ns, lines);
  if (res.code !== 0) throw failed(what, res);
}

/**
 * The caps on machines' connections (egress-rules.ts flowCaps) from the host's table size,
 * `nf_conntrack_max`: read each time (an administrator may raise it), 65 536 where it cannot be
 * read (the kernel's table is not loaded yet). `SNAPLAB_EGRESS_CAPS` sets them instead:
 * `RATE/BURST/OPEN,RATE/BURST`, a machine's then its home's (docs/egress.md "Flows").
 */
export function flowCapsNow(): { machine: Required<FlowCap>; home: FlowCap } {
  const given = process.env.SNAPLAB_EGRESS_CAPS;
  if (given) return parseCaps(given);
  let max = 65_536;
  try {
    max = Number(readFileSync('/proc/sys/net/netfilter/nf_conntrack_max', 'utf8').trim()) || max;
  } catch {
    // (no conntrack yet: the router's table loads it)
  }
  return flowCaps(max);
}

function parseCaps(text: string): { machine: Required<FlowCap>; home: FlowCap } {
  const m = /^(\d{1,9})\/(\d{1,9})\/(\d{1,9}),(\d{1,9})\/(\d{1,9})$/.exec(text.trim());
  const n = m?.slice(1).map(Number);
  if (!n || n.some((x) => x < 1))
    throw new SnaplabError(
      'BAD_INPUT',
      `SNAPLAB_EGRESS_CAPS=${text} is not RATE/BURST/OPEN,RATE/BURST`,
      "a machine's then its home's, each a whole number from 1: e.g. 64/1024/1024,256/8192 (unset it for caps from nf_conntrack_max)",
    );
  return { machine: { rate: n[0]!, burst: n[1]!, active: n[2]! }, home: { rate: n[3]!, burst: n[4]! } };
}

/** Homes whose router this process has seen complete (a namespace check still runs each time). */
const ready = new Set<string>();

/** The home's egress lock: a router's making and removal, and a change of its `host` set. */
const egressLock = (home: string): string => join(home, 'run', 'egress.lock');

/**
 * The home's router, made if it is not there (under the home's egress lock). A router made whole
 * leaves a note of its namespace's inode (`run/egress.ready`): a process that finds the same
 * namespace there trusts it without asking nft (a spawn), one that finds another makes it again.
 */
export async function ensureRouter(home: string): Promise<string> {
  const tag = homeTag(home);
  const ns = routerNetns(tag);
  return withLock(egressLock(home), async () => {
    // (under the lock: gc removes a router under it, once no machine is recorded)
    if (ready.has(tag) && (await isNamespace(netnsPath(ns)))) return ns;
    const known = await isNoted(home, ns);
    if (known || ((await isNamespace(netnsPath(ns))) && (await routerComplete(ns)))) {
      // a router an earlier build made has no cap on its machines' connections, nor the uplink's
      // short timeouts (`capped` gives them: once), nor its machines' links closed to ARP, which
      // waits until no link is left whose ends learn each other by ARP (an older build's)
      let current = known === 'current';
      if (!current) {
        if (known !== 'capped') await capRouter(tag);
        current = await closeArp(ns);
        if (current || known !== 'capped') await note(home, ns, current ? ROUTER_GENERATION : 'capped');
      }
      // (one still open to ARP is looked at again by the next create, until its old links are gone)
      if (current) ready.add(tag);
      return ns;
    }
    await removeRouter(home);
    let hostAddrs: string[];
    try {
      hostAddrs = await makeRouter(tag);
    } catch (e) {
      await removeRouter(home).catch(noted(`remove the half-made egress router ${ns}`));
      throw e;
    }
    await note(home, ns);
    const text = await hostNoteText(home, hostAddrs);
    if (text !== undefined) await writeFile(hostNote(home), text);
    ready.add(tag);
    return ns;
  });
}

/**
 * Where the addresses the router's `host` set was last given are noted, with the router's ready
 * note (its namespace's inode and a token drawn when it was noted: another router, or the same
 * one noted again by a process that did not write its set, e.g. a build before this one, is
 * another set). A machine's attach rewrites the set only when the host's addresses differ from
 * it: flushing an interval set that holds elements makes nft's commit wait in the kernel (15–25 ms
 * here, against ~5 ms for all the rest of a machine's rules), and every create with egress did it.
 */
const hostNote = (home: string): string => join(home, 'run', 'egress.host');
async function hostNoteText(home: string, addrs: string[]): Promise<string | undefined> {
  const router = (await readReadyNote(home)).trim();
  // a ready note without its token (none, or an earlier build's): the set is written every time
  if (!/^\S+ [0-9a-f]{16}(?: [a-z-]+)?$/.test(router)) return undefined;
  return `${router}\n${[...addrs].sort().join(' ')}\n`;
}
const readHostNote = (home: string): Promise<string> =>
  readFile(hostNote(home), 'utf8').catch(orElse('', 'read the egress host note', 'ENOENT'));

/**
 * The host's addresses now, which the router's `host` set is given unless it holds them already
 * (noted): rewritten alone, under the home's egress lock, its note removed until it is done. The
 * lock keeps the note true to the set: two attaches that saw different addresses (the host's
 * changed meanwhile) write one after the other, each noting what it wrote. (Addresses that change
 * while an attach runs are taken in by the next one, as they were when each attach wrote them.)
 */
export async function hostSetCurrent(home: string, ns: string): Promise<string[]> {
  const addrs = hostAddresses();
  const was = await hostNoteText(home, addrs);
  if (was !== undefined && (await readHostNote(home)) === was) return addrs;
  return withLock(egressLock(home), async () => {
    const now = hostAddresses();
    const text = await hostNoteText(home, now);
    if (text !== undefined && (await readHostNote(home)) === text) return now;
    await rm(hostNote(home), { force: true });
    await nft(ns, hostSetLines(now), 'cannot load the host addresses egress refuses');
    if (text !== undefined) await writeFile(hostNote(home), text);
    return now;
  });
}

const readyNote = (home: string): string => join(home, 'run', 'egress.ready');
const readReadyNote = (home: string): Promise<string> =>
  readFile(readyNote(home), 'utf8').catch(orElse('', 'read the egress note', 'ENOENT'));
const inode = (path: string): Promise<string | undefined> =>
  stat(path).then(
    (st) => `${st.dev}:${st.ino}`,
    () => undefined,
  );
/**
 * What a router this build makes has that an earlier build's may not: the caps on connections
 * (capRouter; a note of the build before says `capped`) and its machines' links closed to ARP
 * (closeArp).
 */
const ROUTER_GENERATION = 'capped-arp';
async function note(home: string, ns: string, generation = ROUTER_GENERATION): Promise<void> {
  // (the token: hostNote)
  await writeFile(readyNote(home), `${await inode(netnsPath(ns))} ${randomBytes(8).toString('hex')} ${generation}\n`);
}
/**
 * Whether the router's namespace is the one noted as made whole: false, or `current` when the
 * note says it has what this build's routers have, `capped` when it has the caps on connections
 * only, else true (an earlier build's note).
 */
async function isNoted(home: string, ns: string): Promise<boolean | 'current' | 'capped'> {
  if (!(await isNamespace(netnsPath(ns)))) return false;
  const [was, now] = await Promise.all([readReadyNote(home), inode(netnsPath(ns))]);
  const f = was.trim().split(' ');
  if (now === undefined || f[0] !== now) return false;
  return f[2] === ROUTER_GENERATION ? 'current' : f[2] === 'capped' ? 'capped' : true;
}

const routerComplete = async (ns: string): Promise<boolean> =>
  (await inNs(ns, ['nft', 'list', 'table', 'ip', ROUTER_TABLE], { allowFail: true })).code === 0;

/** Make the home's router; returns the host addresses its `host` set was given. */
async function makeRouter(tag: string): Promise<string[]> {
  const ns = routerNetns(tag);
  const t = transit(tag);
  const up = uplink();
  const upIf = uplinkIf(tag);
  // first: without nftables a router fails at its first rule, with forwarding already turned on
  // (and undone only by nft: removeRouter), as a stock host without it did
  await requireTool('nft');
  await createNetns(ns);
  await batch(
    ns,
    [
      `link add ${UPLINK_IF} group ${NET_GROUP} type veth peer name ${upIf} netns ${up ?? String(process.pid)}`,
      `link set ${UPLINK_IF} addrgenmode none`,
      `addr add ${t.router}/30 dev ${UPLINK_IF}`,
      `link set ${UPLINK_IF} up`,
      `route add default via ${t.uplink}`,
    ],
    `cannot link egress router ${ns} to the uplink`,
  );
  const upLines = [`link set ${upIf} group ${NET_GROUP}`, `addr add ${t.uplink}/30 dev ${upIf}`, `link set ${upIf} up`];
  const res = up
    ? await ipBatch(up, upLines)
    : await run('ip', ['-batch', '-'], { input: `${upLines.join('\n')}\n`, allowFail: true });
  if (res.code !== 0)
    throw failed(
      `cannot set up ${upIf} on the uplink`,
      res,
      /File exists/.test(res.stderr)
        ? `the uplink already has ${t.uplink}: another home's egress took it; \`snaplab gc\` there`
        : undefined,
    );
  // forwarding on, and no IPv6 through the router whatever the host's defaults give a new namespace
  await sysctl(ns, ['net.ipv4.ip_forward=1', 'net.ipv6.conf.all.disable_ipv6=1']);
  const [hostAddrs, dns] = [hostAddresses(), await uplinkResolvers()];
  // forwarding and the uplink's table together, under the host-wide lock a restore takes (so
  // another home's gc never sees forwarding on and no table of ours); the uplink's table first:
  // the router's own, loaded last, is what says the router is whole
  await withLock(FORWARD_LOCK, async () => {
    await forwardOnUplink();
    await loadUplinkTable(tag);
  });
  await nft(
    ns,
    routerRuleset({ hostAddrs, dns, transitRouter: t.router, caps: flowCapsNow().home }),
    `cannot load egress rules in ${ns}`,
  );
  return hostAddrs;
}

/** Load the uplink's table again (whole, in one transaction), under the host-wide forwarding lock. */
async function loadUplinkTable(tag: string): Promise<void> {
  const established = await uplinkEstablished();
  await nft(
    null,
    `table ip ${uplinkTable(tag)} {}\ndelete table ip ${uplinkTable(tag)}\n${uplinkRuleset(tag, { established })}\n`,
    'cannot load the uplink rules of egress',
    'egress needs nftables (`apt-get install nftables`) and a kernel with conntrack timeout policies (`modprobe nf_conntrack_timeout`; CONFIG_NF_CONNTRACK_TIMEOUT); `snaplab doctor` checks both',
  );
}

/**
 * The uplink's timeout for an established TCP connection (its sysctl; the kernel's 5 days where
 * its connection table is not loaded yet): a machine's connections keep it (uplinkRuleset).
 */
async function uplinkEstablished(): Promise<number> {
  const file = '/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established';
  const text = uplink()
    ? (await inUplink(['cat', file], { allowFail: true })).stdout
    : await readFile(file, 'utf8').catch(orElse('', "read the uplink's established timeout", 'ENOENT'));
  const n = Number(text.trim());
  return Number.isSafeInteger(n) && n > 0 ? n : 432_000;
}

/**
 * Give a router an earlier build made the home's cap on its machines' connections, and the
 * uplink's short timeouts for their closing connections (its table loaded again: the connections
 * it tracks keep their translation). Its links closed to ARP: closeArp.
 */
async function capRouter(tag: string): Promise<void> {
  await nft(routerNetns(tag), homeFlowsUpgrade(flowCapsNow().home), 'cannot cap the connections of egress');
  await withLock(FORWARD_LOCK, () => loadUplinkTable(tag));
}

/**
 * A router an earlier build made: its machines' links closed to ARP (arpClosedUpgrade), if every
 * link it has is this build's, each end a permanent entry in the other's table (ROUTER_LINK_MAC):
 * a link an older build made learns its far end by ARP, and would lose it. Whether it did.
 */
async function closeArp(ns: string): Promise<boolean> {
  const [links, permanent] = await Promise.all([
    inNs(ns, ['ip', '-o', 'link', 'show'], { allowFail: true }),
    inNs(ns, ['ip', 'neigh', 'show', 'nud', 'permanent'], { allowFail: true }),
  ]);
  if (links.code !== 0 || permanent.code !== 0) return false;
  const machineLinks = [...links.stdout.matchAll(/^\d+: (e\d+)@/gm)].map((m) => m[1]!);
  const held = new Set([...permanent.stdout.matchAll(/ dev (e\d+) /g)].map((m) => m[1]!));
  if (!machineLinks.every((l) => held.has(l))) return false;
  await nft(ns, arpClosedUpgrade(), 'cannot close the links of egress to ARP');
  return true;
}

async function sysctl(ns: string, settings: string[]): Promise<void> {
  const res = await inNs(ns, ['sysctl', '-qw', ...settings], { allowFail: true });
  if (res.code !== 0) throw failed(`cannot set ${settings.join(', ')} in ${ns}`, res);
}

/** Where snaplab notes that it turned on forwarding in an uplink namespace (gc turns it off again). */
const forwardNote = (): string => `/run/snaplab/egress-forwarding-${uplink() ?? 'host'}`;

/**
 * The uplink must forward the router's packets (the host's `net.ipv4.ip_forward`). When it is off,
 * snaplab turns it on and notes that it did: `snaplab gc` turns it off again once no home has a
 * router on this uplink. When it is on already it is left alone.
 */
async function forwardOnUplink(): Promise<void> {
  const now = await inUplink(['sysctl', '-n', 'net.ipv4.ip_forward'], { allowFail: true });
  if (now.stdout.trim() === '1') return;
  await mkdir('/run/snaplab', { recursive: true });
  await writeFile(forwardNote(), '0\n');
  const res = await inUplink(['sysctl', '-qw', 'net.ipv4.ip_forward=1'], { allowFail: true });
  if (res.code !== 0) throw failed('cannot turn on forwarding on the uplink (net.ipv4.ip_forward)', res);
}

/**
 * The host's own IPv4 addresses and local prefixes (this process's network namespace, whatever the
 * uplink), from the kernel's local routing table (/proc/net/fib_trie): an address on an interface
 * that is down, or a `local` route over a whole prefix, is delivered to the host all the same.
 * Machines may not reach them. Read again at each change of a machine's rules: a file read, no
 * spawn.
 */
export function hostAddresses(): string[] {
  let text = '';
  try {
    text = readFileSync('/proc/net/fib_trie', 'utf8');
  } catch (e) {
    recordFailure('read /proc/net/fib_trie (the host addresses egress refuses)', e);
    return [];
  }
  return localPrefixes(text);
}

/** The `host LOCAL` entries of fib_trie's Local table, as ADDRESS/PREFIX. */
export function localPrefixes(fibTrie: string): string[] {
  const local = fibTrie.slice(fibTrie.indexOf('Local:'));
  const out = new Set<string>();
  let at = '';
  for (const line of local.split('\n')) {
    const leaf = /\|-- (\d+\.\d+\.\d+\.\d+)\s*$/.exec(line);
    if (leaf) at = leaf[1]!;
    const kind = /^\s*\/(\d+) host LOCAL\s*$/.exec(line);
    if (kind && at) out.add(`${at}/${kind[1]}`);
  }
  return [...out];
}

/**
 * The uplink's DNS resolvers, as its own programs find them: /etc/netns/NAME/resolv.conf for a
 * named namespace (what `ip netns exec` shows its programs), else /etc/resolv.conf, and behind a
 * local stub (systemd-resolved's 127.0.0.53) the servers it forwards to.
 */
async function uplinkResolvers(): Promise<string[]> {
  const up = uplink();
  const files = [
    ...(up ? [`/etc/netns/${up}/resolv.conf`] : []),
    '/etc/resolv.conf',
    '/run/systemd/resolve/resolv.conf',
  ];
  for (const f of files) {
    const text = await readFile(f, 'utf8').catch(orElse('', `read ${f}`, 'ENOENT'));
    const servers = [...text.matchAll(/^\s*nameserver\s+(\d+\.\d+\.\d+\.\d+)\s*$/gm)].map((m) => m[1]!);
    const usable = servers.filter((s) => !s.startsWith('127.'));
    if (usable.length) return usable;
    if (servers.length && up) return [];
  }
  return [];
}

/** Remove the home's router, its uplink table, and forwarding where snaplab turned it on and no router is left. */
export async function removeRouter(home: string): Promise<boolean> {
  const tag = homeTag(home);
  ready.delete(tag);
  await rm(readyNote(home), { force: true });
  await rm(hostNote(home), { force: true });
  const ns = routerNetns(tag);
  const had = (await listSnaplabNetns()).includes(ns);
  if (had) await deleteNetns(ns);
  // what its machines' flows left in the uplink's (the host's) table, from the router's address
  await forgetFromRouter(tag).catch(noted(`forget the flows of egress router ${ns}`));
  // without the nft program its tables cannot be listed or deleted (a host that removed nftables
  // after a router was made keeps the uplink's table until nft is back and gc runs)
  let deleted = false;
  const withNft = (await which('nft')) !== undefined;
  if (withNft) {
    const del = await inUplink(['nft', 'delete', 'table', 'ip', uplinkTable(tag)], { allowFail: true });
    if (del.code !== 0 && !/No such file|does not exist/i.test(del.stderr))
      throw failed(`cannot delete the uplink table ${uplinkTable(tag)}`, del);
    deleted = del.code === 0;
  }
  await restoreForwarding(withNft);
  return had || deleted;
}

/** The uplink's namespace as the host helper takes it: its path, or "-" (the helper's own, the host's). */
function uplinkArg(): string {
  const up = uplink();
  return up ? join(NETNS_DIR, up) : '-';
}

/**
 * A machine's flows removed from its router's connection table and from the uplink's (the
 * host's) with it: those of holder `mark`, or every one from its address (docs/egress.md
 * "Flows"). Else a connection a machine left open stays in the host's table for the uplink's
 * established timeout (days), or for as long as its far end keeps sending. Needs the host helper
 * (without it, the tables' timeouts remove them). Returns how many went from the uplink's.
 */
export async function forgetFlows(home: string, slot: number, mark?: number): Promise<number> {
  const ops = HostOps.get();
  const router = netnsPath(routerNetns(homeTag(home)));
  if (!ops || !(await isNamespace(router))) return 0;
  try {
    const [, uplinkN] = await ops.request('ct-forget', router, uplinkArg(), slotAddress(slot), String(mark ?? 0));
    return Number(uplinkN);
  } catch (e) {
    // the router went meanwhile (gc, its last machine gone): its removal forgot its flows
    if (e instanceof HostOpError && e.errno === 2) return 0;
    throw e;
  }
}

/**
 * The uplink's (the host's) flows of a home's router that the router's own table no longer holds,
 * removed (docs/egress.md "Flows"): a flow the router ended (a reset or a close it took in, then
 * refused: a machine's lists changed under an open connection; one a full queue dropped on the
 * way to the uplink) would stay there for the uplink's established timeout (days), counted by no
 * cap. Needs the host helper. Returns how many went.
 */
export async function sweepFlows(home: string): Promise<number> {
  const ops = HostOps.get();
  const tag = homeTag(home);
  const router = netnsPath(routerNetns(tag));
  if (!ops || !(await isNamespace(router))) return 0;
  try {
    const [n] = await ops.request('ct-sweep', router, uplinkArg(), transit(tag).router);
    return Number(n);
  } catch (e) {
    // the router went meanwhile: its removal forgot its flows
    if (e instanceof HostOpError && e.errno === 2) return 0;
    throw e;
  }
}

/** Every flow of a home's router left in the uplink's table (its address there): at the router's removal. */
async function forgetFromRouter(tag: string): Promise<void> {
  await HostOps.get()?.request('ct-forget-src', uplinkArg(), transit(tag).router);
}

/** A home's router namespace, not a machine's (EGRESS_NETNS without a slot). */
function isRouterNetns(name: string): boolean {
  const m = EGRESS_NETNS.exec(name);
  return m !== null && m[2] === undefined;
}

/**
 * Forwarding off again where snaplab turned it on, once no home has a router on this uplink (no
 * table of ours there) and it is still on; under the host-wide lock a router's making takes.
 */
async function restoreForwarding(withNft: boolean): Promise<void> {
  if (!existsSync(forwardNote())) return;
  await withLock(FORWARD_LOCK, async () => {
    if (!existsSync(forwardNote())) return;
    if (withNft) {
      const tables = await inUplink(['nft', 'list', 'tables'], { allowFail: true });
      if (tables.code !== 0 || /table ip snaplab_e[0-9a-f]{6}\b/.test(tables.stdout)) return;
    } else if ((await listSnaplabNetns()).some(isRouterNetns)) return; // without nft: a router left still forwards
    const now = await inUplink(['sysctl', '-n', 'net.ipv4.ip_forward'], { allowFail: true });
    if (now.stdout.trim() === '1') {
      const res = await inUplink(['sysctl', '-qw', 'net.ipv4.ip_forward=0'], { allowFail: true });
      if (res.code !== 0) throw failed('cannot turn forwarding on the uplink off again', res);
    }
    await rm(forwardNote(), { force: true });
  });
}

/** Host-wide: homes share the uplink's forwarding switch. */
const FORWARD_LOCK = '/run/snaplab/egress-forwarding.lock';
