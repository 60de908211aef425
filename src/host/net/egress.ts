/**
 * Egress (docs/egress.md): a home's router namespace `snaplab-e<tag>` between its machines and the
 * uplink (the host's own network namespace, or $SNAPLAB_UPLINK_NETNS), holding every filter and
 * the NAT; each machine with egress has a namespace `snaplab-e<tag>-<slot>` whose eth0 is a veth to
 * the router. The machine's root may rewrite its own namespace: nothing it does there passes the
 * router's rules, which check the link a packet came in on and its source address.
 */
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { SnaplabError } from '../../errors.js';
import { noted, orElse, recordFailure } from '../../cleanup.js';
import { HostOps } from '../hostops.js';
import { withLock } from '../lock.js';
import { run, which, type RunResult } from '../run.js';
import {
  COUNTERS,
  GATEWAY,
  hostSetLines,
  ROUTER_TABLE,
  UPLINK_IF,
  checkLists,
  homeTag,
  isHostName,
  machineEgressNetns,
  machineIf,
  machineRemoval,
  machineRules,
  routerNetns,
  routerRuleset,
  slotAddress,
  transit,
  uplinkIf,
  uplinkRuleset,
  uplinkTable,
  type EgressLists,
} from './egress-rules.js';
import { NET_GROUP, NETNS_DIR, checkNetnsName, netnsPath } from './names.js';
import { createNetns, createNetnsBatch, deleteNetns, ipBatch, isNamespace, listSnaplabNetns } from './ns.js';
import { sharedNetnsDir, unwire } from './wire.js';

/** The uplink: a namespace under /run/netns named by $SNAPLAB_UPLINK_NETNS (tests' "outside"), or the host's. */
function uplink(): string | undefined {
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
const inUplink = (argv: string[], opts: { input?: string; allowFail?: boolean } = {}): Promise<RunResult> => {
  const up = uplink();
  return up ? run('ip', ['netns', 'exec', up, ...argv], opts) : run(argv[0]!, argv.slice(1), opts);
};
const inNs = (ns: string, argv: string[], opts: { input?: string; allowFail?: boolean } = {}): Promise<RunResult> =>
  run('ip', ['netns', 'exec', ns, ...argv], opts);

function failed(what: string, res: RunResult, hint = '`snaplab doctor` checks egress'): SnaplabError {
  return new SnaplabError(
    'HOST_COMMAND_FAILED',
    `${what}: ${res.stderr.trim().split('\n').slice(0, 3).join('; ')}`,
    hint,
  );
}

async function nft(ns: string | null, script: string, what: string): Promise<void> {
  const argv = ['nft', '-f', '-'];
  const res =
    ns === null
      ? await inUplink(argv, { input: script, allowFail: true })
      : await inNs(ns, argv, { input: script, allowFail: true });
  if (res.code !== 0)
    throw failed(what, res, 'egress needs nftables (`apt-get install nftables`); `snaplab doctor` checks it');
}

async function batch(ns: string, lines: string[], what: string): Promise<void> {
  const res = await ipBatch(ns, lines);
  if (res.code !== 0) throw failed(what, res);
}

/** Homes whose router this process has seen complete (a namespace check still runs each time). */
const ready = new Set<string>();

/**
 * The home's router, made if it is not there (under the home's egress lock). A router made whole
 * leaves a note of its namespace's inode (`run/egress.ready`): a process that finds the same
 * namespace there trusts it without asking nft (a spawn), one that finds another makes it again.
 */
export async function ensureRouter(home: string): Promise<string> {
  const tag = homeTag(home);
  const ns = routerNetns(tag);
  return withLock(join(home, 'run', 'egress.lock'), async () => {
    // (under the lock: gc removes a router under it, once no machine is recorded)
    if ((ready.has(tag) && (await isNamespace(netnsPath(ns)))) || (await isNoted(home, ns))) {
      ready.add(tag);
      return ns;
    }
    if ((await isNamespace(netnsPath(ns))) && (await routerComplete(ns))) {
      await note(home, ns);
      ready.add(tag);
      return ns;
    }
    await removeRouter(home);
    try {
      await makeRouter(tag);
    } catch (e) {
      await removeRouter(home).catch(noted(`remove the half-made egress router ${ns}`));
      throw e;
    }
    await note(home, ns);
    ready.add(tag);
    return ns;
  });
}

const readyNote = (home: string): string => join(home, 'run', 'egress.ready');
const inode = (path: string): Promise<string | undefined> =>
  stat(path).then(
    (st) => `${st.dev}:${st.ino}`,
    () => undefined,
  );
async function note(home: string, ns: string): Promise<void> {
  await writeFile(readyNote(home), `${await inode(netnsPath(ns))}\n`);
}
/** Whether the router's namespace is the one noted as made whole. */
async function isNoted(home: string, ns: string): Promise<boolean> {
  if (!(await isNamespace(netnsPath(ns)))) return false;
  const [was, now] = await Promise.all([
    readFile(readyNote(home), 'utf8').catch(orElse('', 'read the egress note', 'ENOENT')),
    inode(netnsPath(ns)),
  ]);
  return now !== undefined && was.trim() === now;
}

const routerComplete = async (ns: string): Promise<boolean> =>
  (await inNs(ns, ['nft', 'list', 'table', 'ip', ROUTER_TABLE], { allowFail: true })).code === 0;

async function makeRouter(tag: string): Promise<void> {
  const ns = routerNetns(tag);
  const t = transit(tag);
  const up = uplink();
  const upIf = uplinkIf(tag);
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
    await nft(
      null,
      `table ip ${uplinkTable(tag)} {}\ndelete table ip ${uplinkTable(tag)}\n${uplinkRuleset(tag)}\n`,
      'cannot load the uplink rules of egress',
    );
  });
  await nft(ns, routerRuleset({ hostAddrs, dns, transitRouter: t.router }), `cannot load egress rules in ${ns}`);
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
  const ns = routerNetns(tag);
  const had = (await listSnaplabNetns()).includes(ns);
  if (had) await deleteNetns(ns);
  // without nftables nothing of egress was ever made here
  if (!(await which('nft'))) return had;
  const del = await inUplink(['nft', 'delete', 'table', 'ip', uplinkTable(tag)], { allowFail: true });
  if (del.code !== 0 && !/No such file|does not exist/i.test(del.stderr))
    throw failed(`cannot delete the uplink table ${uplinkTable(tag)}`, del);
  await restoreForwarding();
  return had || del.code === 0;
}

/**
 * Forwarding off again where snaplab turned it on, once no home has a router on this uplink (no
 * table of ours there) and it is still on; under the host-wide lock a router's making takes.
 */
async function restoreForwarding(): Promise<void> {
  if (!existsSync(forwardNote())) return;
  await withLock(FORWARD_LOCK, async () => {
    if (!existsSync(forwardNote())) return;
    const tables = await inUplink(['nft', 'list', 'tables'], { allowFail: true });
    if (tables.code !== 0 || /table ip snaplab_e[0-9a-f]{6}\b/.test(tables.stdout)) return;
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
}

/** The machine's side of its link to the router: eth0 in a namespace of its own, up0 beside a scenario machine's links. */
const machineSide = (a: { into?: string }): string => (a.into ? 'up0' : 'eth0');

/**
 * A machine's network namespace with eth0 linked to the router: its address by its slot, the
 * router as its gateway and DNS server, its rules loaded. Returns the namespace's path. On failure
 * removes what it made.
 */
export async function attachEgress(home: string, a: EgressAttach): Promise<string> {
  const router = await ensureRouter(home);
  const tag = homeTag(home);
  const ns = a.into ? basename(a.into) : machineEgressNetns(tag, a.slot);
  const address = slotAddress(a.slot);
  const ifn = machineIf(a.slot);
  const dev = machineSide(a);
  // names first: one that does not resolve leaves nothing made
  const lists = await pinNames(checkLists(a.lists));
  // three steps in a row, each one spawn (or the host helper's request): the namespace; its side
  // of the link, made there with its peer put in the router; the router's side beside its rules
  try {
    if (!a.into) await makeMachineNetns(ns, a.userns);
    await batch(
      ns,
      [
        `link add ${dev} group ${NET_GROUP} type veth peer name ${ifn} group ${NET_GROUP} netns ${router}`,
        'link set lo up',
        `link set ${dev} addrgenmode none`,
        `addr add ${address}/32 dev ${dev}`,
        `link set ${dev} up`,
        `route add ${GATEWAY}/32 dev ${dev} scope link`,
        `route add default via ${GATEWAY} dev ${dev}`,
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
        ],
        `cannot set up ${ifn} in the egress router`,
      ),
      nft(
        router,
        `${hostSetLines(hostAddresses())}${machineRules(a.slot, lists, { mark: a.mark, hostAddrs: hostAddresses() })}`,
        `cannot load the egress rules of slot ${a.slot}`,
      ),
    ]);
  } catch (e) {
    await detachEgress(home, a.slot, { keepNetns: a.into !== undefined }).catch(
      noted(`remove the half-made egress of slot ${a.slot}`),
    );
    throw e;
  }
  return netnsPath(ns);
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
    update: true,
  });
  await nft(router, `${rules}${reset}`, `cannot change the egress lists of slot ${slot}`);
}

/** Host names a machine's lists may hold (each one a lookup when they are set). */
const MAX_NAMES = 64;

/** `fn` over `xs`, at most `n` at once; the first failure is thrown once all started have ended. */
async function inBatches<T>(xs: T[], n: number, fn: (x: T) => Promise<void>): Promise<void> {
  for (let i = 0; i < xs.length; i += n) await Promise.all(xs.slice(i, i + n).map(fn));
}

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
  await inBatches(names, 8, async (n) => {
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

/** The counters' names of a slot (for docs and tests). */
export const counterNames = COUNTERS;

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
    const rules = `${routerRuleset({ hostAddrs: ['192.0.2.2'], dns: ['192.0.2.53'], transitRouter: '100.127.0.2' })}\n${machineRules(1, { allow: ['192.0.2.1', '0.0.0.0/0'], deny: ['192.0.2.9'] }, { mark: 7, hostAddrs: ['192.0.2.2'] })}`;
    const res = await inNs(ns, ['nft', '-f', '-'], { input: rules, allowFail: true });
    return res.code === 0 ? undefined : res.stderr.trim().split('\n')[0];
  } finally {
    await deleteNetns(ns);
  }
}

/** Run `fn` under the home's egress lock (what changes a machine's rules against what removes them). */
export const underEgressLock = <T>(home: string, fn: () => Promise<T>): Promise<T> =>
  withLock(join(home, 'run', 'egress.lock'), fn);
