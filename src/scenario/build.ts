import type { EgressLists } from '../host/net/egress-rules.js';
import { resolveEgress } from '../sdk/create-options.js';
import { readFileSync, statSync } from 'node:fs';
import { basename, resolve } from 'node:path';
import { isScalar } from 'yaml';
import { SnaplabError } from '../errors.js';
import { parsePortSpec } from '../lab/io/port-spec.js';
import { checkName } from '../lab/names.js';
import type { Locator, Path } from './locate.js';
import type { RawImageBuild, RawMachine, RawScenario, RawStep } from './schema.js';
import type { Check, ImageBuildSpec, MachineFileSpec, ScenarioSpec, Step } from './spec.js';
import { DEFAULT_IMAGE } from '../defaults.js';
import { FIRST_AUTO_HOST, NAME_RULE, RESERVED_GROUPS, SCENARIO_NAME } from './spec.js';
import { formatIpv4, overlaps, parseIpv4, parseSubnet, Problem, type Cidr } from './values.js';

const HOSTNAME = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/i;

/** Checks what needs the whole file and returns the parsed form. Throws at the first problem. */
export function buildSpec(raw: RawScenario, at: Locator, dir: string): ScenarioSpec {
  if (raw.name !== undefined && !SCENARIO_NAME.test(raw.name))
    at.fail(['name'], `invalid scenario name ${JSON.stringify(raw.name)}`, NAME_RULE);
  const spec: ScenarioSpec =
    raw.name === undefined ? { networks: [], machines: [] } : { name: raw.name, networks: [], machines: [] };
  if (raw.standby !== undefined) spec.standby = raw.standby;

  const cidrs = new Map<string, Cidr>();
  for (const name of at.keys(['networks'])) {
    if (!SCENARIO_NAME.test(name))
      at.fail(['networks', name], `invalid network name ${JSON.stringify(name)}`, NAME_RULE, true);
    const subnet = raw.networks![name]!.subnet;
    const cidr = value(at, ['networks', name, 'subnet'], () => parseSubnet(subnet));
    for (const [other, c] of cidrs) {
      if (overlaps(c, cidr)) {
        at.fail(
          ['networks', name, 'subnet'],
          `subnet ${subnet} of network "${name}" overlaps network "${other}" (${formatIpv4(c.base)}/${c.prefix})`,
          'give each network a subnet of its own, e.g. 10.77.1.0/24 and 10.77.2.0/24',
        );
      }
    }
    cidrs.set(name, cidr);
    const uplink = value(at, ['networks', name, 'uplink'], () => uplinkOf(raw.networks![name]!.uplink));
    spec.networks.push({ name, subnet: subnet.trim(), prefix: cidr.prefix, ...(uplink ? { uplink } : {}) });
  }

  const names = at.keys(['machines']);
  if (names.length === 0)
    at.fail(
      ['machines'],
      'a scenario needs at least one machine',
      'add one under machines:, e.g. `machines: { box: {} }`',
    );
  for (const name of names) {
    spec.machines.push(machine(name, raw.machines[name]!, at, dir, cidrs));
  }
  assignAddresses(spec, cidrs, at);
  resolveCheckHosts(spec, at);
  return spec;
}

function machine(name: string, raw: RawMachine, at: Locator, dir: string, cidrs: Map<string, Cidr>): MachineFileSpec {
  const p: Path = ['machines', name];
  if (!SCENARIO_NAME.test(name)) at.fail(p, `invalid machine name ${JSON.stringify(name)}`, NAME_RULE, true);
  const { image, build } = imageOf(raw.image, [...p, 'image'], at, dir);
  const hostname = raw.hostname ?? name;
  if (!HOSTNAME.test(hostname))
    at.fail(
      [...p, 'hostname'],
      `invalid hostname ${JSON.stringify(hostname)}`,
      'use letters, digits and "-" (at most 63), starting and ending with a letter or digit',
    );

  const limits: MachineFileSpec['limits'] = {};
  if (raw.memory !== undefined) limits.memoryBytes = raw.memory;
  if (raw.disk !== undefined) limits.diskBytes = raw.disk;
  if (raw.pids !== undefined) limits.pids = raw.pids;
  if (raw.cpus !== undefined) limits.cpus = raw.cpus;

  const networks: MachineFileSpec['networks'] = [];
  for (const net of at.keys([...p, 'networks'])) {
    const cidr = cidrs.get(net);
    if (!cidr) {
      const known = [...cidrs.keys()];
      at.fail(
        [...p, 'networks', net],
        `machine "${name}" is on network "${net}", which is not defined`,
        known.length
          ? `define it under networks:, or use one of: ${known.join(', ')}`
          : `define it under networks:, e.g. \`networks: { ${net}: { subnet: 10.77.1.0/24 } }\``,
        true,
      );
    }
    // Empty until assignAddresses: fixed ones are checked there, against every other machine.
    networks.push({ network: net, address: raw.networks?.[net]?.address ?? '', prefix: cidr.prefix });
  }

  const steps = (phase: 'provision' | 'start') => raw[phase].map((s, i) => step(s, [...p, phase, i], at, dir));
  const spec: MachineFileSpec = {
    name,
    image,
    ...(build ? { build } : {}),
    hostname,
    limits,
    env: raw.env,
    networks,
    provision: steps('provision'),
    start: steps('start'),
    ready: raw.ready,
  };
  if (raw.ports.length) {
    spec.ports = raw.ports.map((v, i) => value(at, [...p, 'ports', i], () => portOf(v)));
    for (const [i, port] of spec.ports.entries())
      if (port.local === 0)
        at.fail(
          [...p, 'ports', i],
          `machine ${name}: a scenario's ports need a fixed local port`,
          `write it as LOCAL:REMOTE, e.g. ${10000 + port.remote}:${port.remote}`,
        );
  }
  if (raw.groups.length) spec.groups = raw.groups.map((g, i) => value(at, [...p, 'groups', i], () => groupName(g)));
  if (raw.driver) spec.driver = raw.driver; // `namespaces` too: `up --driver` changes only machines that name none
  if (raw.init === 'systemd') spec.init = 'systemd';
  else if (raw.ready.some((c) => c.kind === 'unit' || c.kind === 'systemd')) {
    at.fail(
      [...p, 'ready'],
      `machine ${name}: unit and systemd checks need a system machine`,
      'add `init: systemd` to the machine (and an image with systemd)',
    );
  }
  return spec;
}

function step(raw: RawStep, p: Path, at: Locator, dir: string): Step {
  if ('run' in raw) return raw;
  const c = raw.copy;
  const from = resolve(dir, c.from);
  let mode: number;
  try {
    const st = statSync(from);
    if (!st.isFile())
      at.fail(
        [...p, 'copy', 'from'],
        `copy from ${JSON.stringify(c.from)}: ${from} is not a regular file`,
        'copy takes one file; copy each file of a directory with its own step',
      );
    mode = st.mode & 0o7777;
  } catch (e) {
    if (e instanceof SnaplabError) throw e;
    at.fail(
      [...p, 'copy', 'from'],
      `copy from ${JSON.stringify(c.from)}: ${from} does not exist`,
      `paths are relative to the scenario file's directory (${dir})`,
    );
  }
  if (c.mode !== undefined) mode = fileMode(at, [...p, 'copy', 'mode']);
  const to = c.to.endsWith('/') ? `${c.to}${basename(from)}` : c.to;
  if (to === '/')
    at.fail(
      [...p, 'copy', 'to'],
      'copy to "/": give a file path',
      'e.g. to: /srv/www/index.html, or a directory ending in /',
    );
  return { copy: { from, to, mode } };
}

/** A mode is read as octal digits as written: YAML would read 0755 as the decimal 755. */
function fileMode(at: Locator, p: Path): number {
  const node = at.node(p);
  const text = isScalar(node) ? (node.source ?? String(node.value)).trim() : '';
  const m = /^(?:0o?)?([0-7]{3,4})$/.exec(text);
  if (!m) at.fail(p, `invalid mode ${JSON.stringify(text)}`, 'write octal permissions such as 0644 or 0755');
  return parseInt(m[1]!, 8);
}

function groupName(g: string): string {
  if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(g))
    throw new Problem(
      `invalid group name ${JSON.stringify(g)}`,
      'Ansible group names are letters, digits and _, not starting with a digit',
    );
  if (RESERVED_GROUPS.includes(g))
    throw new Problem(`group name ${g} is Ansible's own`, 'pick another name (every host is in all already)');
  return g;
}

/** A network's uplink: its lists, checked as a create's egress (a bad entry said where it is). */
function uplinkOf(v: boolean | { allow?: string[]; deny?: string[] } | undefined): EgressLists | undefined {
  try {
    return resolveEgress(v);
  } catch (e) {
    if (e instanceof SnaplabError) throw new Problem(e.message, e.hint);
    throw e;
  }
}

function portOf(v: string | number): { local: number; remote: number } {
  try {
    return parsePortSpec(String(v));
  } catch (e) {
    if (e instanceof SnaplabError) throw new Problem(e.message, e.hint);
    throw e;
  }
}

function value<T>(at: Locator, p: Path, fn: () => T): T {
  try {
    return fn();
  } catch (e) {
    if (e instanceof Problem) at.fail(p, e.message, e.hint);
    throw e;
  }
}

/**
 * Fixed addresses are checked first; then, per network, every machine without one gets, in file
 * order, the first free host address from .10 of the subnet (from .1 in subnets too small for
 * that), so the same file always gives the same addresses.
 */
function assignAddresses(spec: ScenarioSpec, cidrs: Map<string, Cidr>, at: Locator): void {
  const taken = new Map<string, Map<number, string>>(); // network → address → machine
  for (const n of spec.networks) taken.set(n.name, new Map());
  for (const m of spec.machines) {
    for (const a of m.networks) {
      if (a.address === '') continue;
      const p: Path = ['machines', m.name, 'networks', a.network, 'address'];
      const cidr = cidrs.get(a.network)!;
      const net = `${formatIpv4(cidr.base)}/${cidr.prefix}`;
      const ip = parseIpv4(a.address.trim());
      if (ip === undefined)
        at.fail(
          p,
          `invalid address ${JSON.stringify(a.address)}`,
          `write a plain IPv4 address inside ${net}, without /prefix (or leave it out for a deterministic one)`,
        );
      if (ip < cidr.base || ip >= cidr.base + cidr.size)
        at.fail(
          p,
          `address ${a.address} of machine "${m.name}" is outside network "${a.network}" (${net})`,
          `give an address inside ${net}, or leave it out for a deterministic one`,
        );
      if (ip === cidr.base || ip === cidr.base + cidr.size - 1)
        at.fail(
          p,
          `address ${a.address} is the ${ip === cidr.base ? 'network' : 'broadcast'} address of ${net}`,
          `give a host address, from ${formatIpv4(cidr.base + 1)} to ${formatIpv4(cidr.base + cidr.size - 2)}`,
        );
      const owner = taken.get(a.network)!.get(ip);
      if (owner !== undefined)
        at.fail(
          p,
          `address ${a.address} on network "${a.network}" is already machine "${owner}"'s`,
          'give each machine its own address, or leave it out for a deterministic one',
        );
      taken.get(a.network)!.set(ip, m.name);
      a.address = formatIpv4(ip);
    }
  }
  for (const m of spec.machines) {
    for (const a of m.networks) {
      if (a.address !== '') continue;
      const cidr = cidrs.get(a.network)!;
      const used = taken.get(a.network)!;
      const last = cidr.base + cidr.size - 2;
      let ip = cidr.base + (cidr.size - 2 >= FIRST_AUTO_HOST ? FIRST_AUTO_HOST : 1);
      while (ip <= last && used.has(ip)) ip++;
      if (ip > last)
        at.fail(
          ['machines', m.name, 'networks', a.network],
          `network "${a.network}" (${formatIpv4(cidr.base)}/${cidr.prefix}) has no free address left for machine "${m.name}"`,
          'use a larger subnet',
          true,
        );
      used.set(ip, m.name);
      a.address = formatIpv4(ip);
    }
  }
}

/** A tcp check may name another machine: it becomes that machine's address on a shared network. */
function resolveCheckHosts(spec: ScenarioSpec, at: Locator): void {
  const byName = new Map(spec.machines.map((m) => [m.name, m]));
  for (const m of spec.machines) {
    m.ready.forEach((c: Check, i) => {
      if (c.kind !== 'tcp' || c.host === undefined || parseIpv4(c.host) !== undefined) return;
      const p: Path = ['machines', m.name, 'ready', i, 'tcp'];
      if (c.host === 'localhost' || c.host === m.name || c.host === m.hostname) {
        c.host = '127.0.0.1';
        return;
      }
      const target = byName.get(c.host) ?? spec.machines.find((o) => o.hostname === c.host);
      if (!target)
        at.fail(
          p,
          `tcp check host ${JSON.stringify(c.host)} is neither an IPv4 address nor a machine of this scenario`,
          `machines: ${[...byName.keys()].join(', ')}`,
        );
      const mine = new Set(m.networks.map((n) => n.network));
      const shared = target.networks.find((n) => mine.has(n.network));
      if (!shared)
        at.fail(
          p,
          `machine "${m.name}" shares no network with "${target.name}", so its tcp check cannot reach it`,
          'put both machines on a common network',
        );
      c.host = shared.address;
    });
  }
}

/** A machine's image: a name, or how it is built (its packages from a list or a file beside the scenario). */
function imageOf(
  raw: string | RawImageBuild | undefined,
  p: Path,
  at: Locator,
  dir: string,
): { image: string; build?: ImageBuildSpec } {
  const name = typeof raw === 'string' ? raw : (raw?.name ?? (raw ? '' : DEFAULT_IMAGE));
  try {
    if (name) checkName('image', name);
  } catch (e) {
    if (e instanceof SnaplabError) at.fail(typeof raw === 'string' ? p : [...p, 'name'], e.message, e.hint);
    throw e;
  }
  if (raw === undefined || typeof raw === 'string') return { image: name };
  const d = raw.debian;
  let packages: string[] = [];
  if (typeof d.packages === 'string') {
    const file = resolve(dir, d.packages);
    try {
      // `#` starts a comment, as in apt's lists
      packages = readFileSync(file, 'utf8')
        .replace(/#.*$/gm, '')
        .split(/[\s,]+/)
        .filter(Boolean);
    } catch (e) {
      at.fail(
        [...p, 'debian', 'packages'],
        `cannot read the package list ${file}: ${(e as Error).message}`,
        'give a list, or the path of a file of package names, relative to the scenario file',
      );
    }
  } else packages = d.packages ?? [];
  return {
    image: name,
    build: { suite: d.suite ?? 'bookworm', variant: d.variant ?? 'minbase', packages },
  };
}
