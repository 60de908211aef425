import { SnaplabError } from '../../errors.js';
import { run } from '../run.js';
import { ipBatch } from './ns.js';
import { DEFAULT_BRIDGE, NET_GROUP, checkCidr, checkIfName, checkNetnsName, hostPrefix, macFor } from './names.js';

function failed(what: string, stderr: string, hint: string): SnaplabError {
  return new SnaplabError('HOST_COMMAND_FAILED', `${what}: ${stderr.trim()}`, hint);
}

/**
 * A bridge in the network's own namespace, up. STP off and forward delay 0 so a port forwards the
 * moment it comes up; no IPv6 link-local address on it (nothing in this namespace speaks IP), and no
 * multicast snooping to learn.
 */
export async function addBridge(netns: string, bridge: string = DEFAULT_BRIDGE): Promise<void> {
  checkNetnsName(netns);
  checkIfName(bridge, 'bridge');
  const res = await ipBatch(netns, [
    `link add ${bridge} group ${NET_GROUP} type bridge stp_state 0 forward_delay 0 mcast_snooping 0`,
    `link set ${bridge} addrgenmode none`,
    `link set ${bridge} up`,
  ]);
  if (res.code !== 0) {
    if (!/Command failed -:1\b/.test(res.stderr))
      await run('ip', ['-n', netns, 'link', 'del', bridge], { allowFail: true });
    throw failed(
      `cannot add bridge ${bridge} in ${netns}`,
      res.stderr,
      /File exists/.test(res.stderr)
        ? `${netns} already has a link named ${bridge}`
        : 'the kernel needs bridge support (`modprobe bridge`); `snaplab doctor` checks networking',
    );
  }
}

export interface AttachOptions {
  bridgeNetns: string;
  bridge?: string;
  machineNetns: string;
  /** the bridge-side end, in bridgeNetns (unique there) */
  hostIf: string;
  /** the machine's end: eth0, eth1, ... */
  guestIf: string;
  /** '10.77.1.10/24': the prefix makes the on-link route; there is no default route and no NAT */
  address: string;
}

/**
 * A veth pair: one end made in the bridge's namespace and enslaved to the bridge, the other created
 * straight into the machine's namespace under its final name, with its address and a MAC derived
 * from it (macFor). Two spawns.
 */
export async function attach(o: AttachOptions): Promise<void> {
  const bridge = o.bridge ?? DEFAULT_BRIDGE;
  checkNetnsName(o.bridgeNetns);
  checkNetnsName(o.machineNetns);
  checkIfName(bridge, 'bridge');
  checkIfName(o.hostIf, 'bridge-side interface');
  checkIfName(o.guestIf, 'machine interface');
  checkCidr(o.address);
  const made = await ipBatch(o.bridgeNetns, [
    `link add ${o.hostIf} group ${NET_GROUP} master ${bridge} type veth peer name ${o.guestIf} address ${macFor(o.address)} netns ${o.machineNetns}`,
    `link set ${o.hostIf} addrgenmode none`,
    `link set ${o.hostIf} up`,
  ]);
  if (made.code !== 0) {
    // Past the first line the pair is ours and half made: undo it. On the first line the name may
    // belong to another attachment, which must stay.
    if (!/Command failed -:1\b/.test(made.stderr)) await detach(o.bridgeNetns, o.hostIf);
    throw failed(
      `cannot attach ${o.machineNetns} to ${o.bridgeNetns}/${bridge}`,
      made.stderr,
      /File exists/.test(made.stderr)
        ? `an interface named ${o.hostIf} (in ${o.bridgeNetns}) or ${o.guestIf} (in ${o.machineNetns}) exists already`
        : `check that both namespaces exist (\`ip netns list\`) and ${bridge} is in ${o.bridgeNetns}`,
    );
  }
  const conf = await ipBatch(o.machineNetns, [
    `link set ${o.guestIf} group ${NET_GROUP}`,
    `link set ${o.guestIf} addrgenmode none`,
    `addr add ${o.address} dev ${o.guestIf}`,
    `link set ${o.guestIf} up`,
  ]);
  if (conf.code !== 0) {
    await detach(o.bridgeNetns, o.hostIf);
    throw failed(
      `cannot give ${o.guestIf} in ${o.machineNetns} the address ${o.address}`,
      conf.stderr,
      'the address may already be on another interface of this machine',
    );
  }
}

/** Remove a veth pair by its bridge-side end (the machine's end goes with it). Idempotent. */
export async function detach(bridgeNetns: string, hostIf: string): Promise<void> {
  checkNetnsName(bridgeNetns);
  checkIfName(hostIf);
  const res = await run('ip', ['-n', bridgeNetns, 'link', 'del', hostIf], { allowFail: true });
  if (res.code !== 0 && !/Cannot find device|does not exist|No such/i.test(res.stderr)) {
    throw failed(
      `cannot remove ${hostIf} from ${bridgeNetns}`,
      res.stderr,
      `\`ip -n ${bridgeNetns} link\` shows what is there`,
    );
  }
}

/**
 * Drop this machine's traffic to those addresses: a blackhole route per address in the machine's
 * namespace, more specific than the network's on-link route. Replies are routed too, so a blocked
 * peer's packets get in but nothing goes back: TCP and ping fail both ways. Idempotent.
 */
export async function block(machineNetns: string, addresses: string[]): Promise<void> {
  checkNetnsName(machineNetns);
  const prefixes = addresses.map(hostPrefix);
  if (!prefixes.length) return;
  const res = await ipBatch(
    machineNetns,
    prefixes.map((p) => `route replace blackhole ${p}`),
    { force: true },
  );
  if (res.code !== 0)
    throw failed(
      `cannot block ${prefixes.join(', ')} in ${machineNetns}`,
      res.stderr,
      'check that the namespace exists',
    );
}

export async function unblock(machineNetns: string, addresses: string[]): Promise<void> {
  checkNetnsName(machineNetns);
  const prefixes = addresses.map(hostPrefix);
  if (!prefixes.length) return;
  const res = await ipBatch(
    machineNetns,
    prefixes.map((p) => `route del blackhole ${p}`),
    { force: true },
  );
  // A route that is not there is already unblocked.
  const real = res.stderr.split('\n').filter((l) => l.trim() && !/No such process|^Command failed/.test(l));
  if (res.code !== 0 && real.length)
    throw failed(
      `cannot unblock ${prefixes.join(', ')} in ${machineNetns}`,
      real.join('\n'),
      'check that the namespace exists',
    );
}

/** The addresses this machine's traffic is dropped to (its blackhole routes), as the kernel has them. */
export async function blackholes(machineNetns: string): Promise<string[]> {
  checkNetnsName(machineNetns);
  const res = await run('ip', ['-n', machineNetns, '-j', 'route', 'show', 'type', 'blackhole'], { allowFail: true });
  if (res.code !== 0) return [];
  try {
    return (JSON.parse(res.stdout || '[]') as { dst: string }[]).map((r) => r.dst.replace(/\/32$/, ''));
  } catch {
    return [];
  }
}

export interface Impairment {
  delayMs?: number;
  jitterMs?: number;
  lossPct?: number;
}

function checkNumber(v: number | undefined, what: string, max: number): void {
  if (v !== undefined && !(Number.isFinite(v) && v >= 0 && v <= max)) {
    throw new SnaplabError('BAD_INPUT', `${what} ${v} is out of range`, `give a number from 0 to ${max}`);
  }
}

/** Delay, jitter and loss on the machine's egress through dev (tc netem, replacing any); null clears. */
export async function setImpairment(machineNetns: string, dev: string, opts: Impairment | null): Promise<void> {
  checkNetnsName(machineNetns);
  checkIfName(dev);
  if (opts === null) {
    const res = await run('tc', ['-n', machineNetns, 'qdisc', 'del', 'dev', dev, 'root'], { allowFail: true });
    // No qdisc of ours there: nothing to clear.
    if (res.code !== 0 && !/handle of zero|No such file|Invalid handle/i.test(res.stderr)) {
      throw failed(
        `cannot clear impairment on ${dev} in ${machineNetns}`,
        res.stderr,
        `\`tc -n ${machineNetns} qdisc show\` shows what is there`,
      );
    }
    return;
  }
  checkNumber(opts.delayMs, 'delay (ms)', 3_600_000);
  checkNumber(opts.jitterMs, 'jitter (ms)', 3_600_000);
  checkNumber(opts.lossPct, 'loss (%)', 100);
  const args = ['-n', machineNetns, 'qdisc', 'replace', 'dev', dev, 'root', 'netem'];
  if (opts.delayMs !== undefined || opts.jitterMs !== undefined) {
    args.push('delay', `${opts.delayMs ?? 0}ms`);
    if (opts.jitterMs) args.push(`${opts.jitterMs}ms`);
  }
  if (opts.lossPct !== undefined) args.push('loss', `${opts.lossPct}%`);
  const res = await run('tc', args, { allowFail: true });
  if (res.code === 0) return;
  if (/qdisc kind is unknown|Unknown qdisc/i.test(res.stderr)) {
    throw new SnaplabError(
      'DRIVER_UNAVAILABLE',
      `tc netem is not available on this host: ${res.stderr.trim()}`,
      '`modprobe sch_netem` (the kernel needs CONFIG_NET_SCH_NETEM); `snaplab doctor` checks it',
    );
  }
  throw failed(
    `cannot impair ${dev} in ${machineNetns}`,
    res.stderr,
    `\`tc -n ${machineNetns} qdisc show dev ${dev}\``,
  );
}
