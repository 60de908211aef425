import { readFile } from 'node:fs/promises';
import { describeFailure, orElse } from '../cleanup.js';
import { probeEgressRules } from '../host/net/egress.js';
import { flowCapsNow } from '../host/net/egress-router.js';
import { existsSync } from 'node:fs';
import { BUILTIN_IMAGE, DEFAULT_DRIVER } from '../defaults.js';
import { createDrivers } from '../drivers/registry.js';
import { probeCgroupMoves, probeCgroups } from '../host/cgroups/cgroups.js';
import type { Availability } from '../host/probe-types.js';
import { which } from '../host/run.js';
import { HOST_TOOLS, installFix, toolsVerdict, type Feature } from '../host/tools.js';
import { busyboxSource, debianSource } from '../image/registry.js';
import { allBackends, pickDefault } from '../storage/index.js';
import { BtrfsBackend } from '../storage/btrfs/btrfs-backend.js';
import { OverlayBackend } from '../storage/overlay/overlay-backend.js';
import { DirBackend } from '../storage/dir/dir-backend.js';
import { Lab } from '../sdk/lab.js';
import { probeUserns } from '../host/userns/probe.js';
import { readUsernsPolicy, usernsPolicyVerdict } from '../host/userns/policy.js';
import { hostLimits } from '../host/limits.js';
import type { StorageKind } from '../storage/backend.js';
import type { SnaplabError } from '../errors.js';
import { join } from 'node:path';

export interface Check extends Availability {
  name: string;
  kind: 'host' | 'driver' | 'storage' | 'image' | 'feature';
  /** a tuning: snaplab works without it, only slower */
  optional?: boolean;
}

/** ok, noting the optional programs of `feature` that are missing (what then cannot be done). */
async function optionalNote(feature: Feature, found: string): Promise<Availability> {
  const absent = [];
  for (const t of HOST_TOOLS)
    if (t.optional && t.program && t.for.includes(feature) && !(await which(t.program))) absent.push(t);
  if (absent.length === 0)
    return {
      ok: true,
      reason: `${found}, and ${HOST_TOOLS.filter((t) => t.optional && t.for.includes(feature))
        .map((t) => t.program)
        .join(', ')}`,
    };
  return {
    ok: true,
    reason: `${found}; without ${absent.map((t) => `${t.program} (${t.why})`).join('; ')}`,
    fix: installFix(absent),
  };
}

/**
 * User namespaces per storage backend, tried as a create runs them: a busybox sandbox in a user
 * namespace on that backend (the launcher, the idmapped root, the agent and its /proc hardening),
 * a command in it, then removed. A check of the idmap alone said yes on stock Debian while every
 * such create failed in the agent's hardening. Not a readiness condition: a sandbox that cannot
 * get one fails with the reason, or runs with --no-userns.
 */
async function usernsChecks(home: string, ready: boolean, working: Set<string>): Promise<Check[]> {
  const kinds: StorageKind[] = ['btrfs', 'dir', 'overlay'];
  const skip = (k: StorageKind): string | undefined =>
    !ready
      ? 'not tried: the namespaces driver does not work here (above)'
      : !working.has(k)
        ? `not tried: ${k} storage does not work here (above)`
        : undefined;
  if (!kinds.some((k) => !skip(k)))
    return kinds.map((k) => ({ name: `userns: ${k}`, kind: 'storage', optional: true, ok: false, reason: skip(k)! }));
  const lab = await Lab.open({ home });
  try {
    const out: Check[] = [];
    for (const k of kinds) {
      const why = skip(k);
      out.push({
        name: `userns: ${k}`,
        kind: 'storage',
        optional: true,
        ...(why ? { ok: false, reason: why } : await sandboxInUserns(lab, k)),
      });
    }
    return out;
  } finally {
    lab.close();
  }
}

/** (named, so that `ls` says what it is while it runs, and one left by a doctor that was killed is found) */
async function sandboxInUserns(lab: Lab, storage: StorageKind): Promise<Availability> {
  try {
    const box = await lab.create({
      image: BUILTIN_IMAGE,
      storage,
      userns: true,
      name: `doctor-${process.pid}-${storage}`,
    });
    try {
      const r = await box.exec(['cat', '/proc/self/uid_map']);
      if (r.exitCode !== 0)
        return {
          ok: false,
          reason: `a command in the sandbox failed (exit ${r.exitCode}): ${r.stderr.toString().trim()}`,
        };
      return {
        ok: true,
        reason: `a sandbox started in a user namespace (uid 0 is ${r.stdout.toString().trim().split(/\s+/)[1]} outside) and ran a command`,
      };
    } finally {
      await box.destroy();
    }
  } catch (e) {
    const err = e as SnaplabError;
    // the idmap step alone says more where it is what fails (a filesystem without idmapped mounts)
    const idmap = await probeUserns(storage === 'btrfs' ? join(lab.home, 'btrfs', 'volumes') : lab.home); // where the backend's volumes are
    if (!idmap.ok)
      return { ok: false, reason: `${err.message} (${idmap.reason})`, ...(idmap.fix ? { fix: idmap.fix } : {}) };
    return {
      ok: false,
      reason: err.message,
      fix: err.hint ?? '--no-userns runs without one (root inside is then host root)',
    };
  }
}

/** Which storage caps what a machine writes (--disk). */
async function diskCapChecks(home: string): Promise<Check[]> {
  return [
    { name: 'disk cap: btrfs', kind: 'storage', optional: true, ...(await new BtrfsBackend(home).diskCapSupport()) },
    {
      name: 'disk cap: overlay',
      kind: 'storage',
      optional: true,
      ...(await new OverlayBackend(home).diskCapSupport()),
    },
    { name: 'disk cap: dir', kind: 'storage', optional: true, ...(await new DirBackend(home).diskCapSupport()) },
  ];
}

/** What the host itself must give: root, cgroups. */
async function hostChecks(): Promise<Check[]> {
  const checks: Check[] = [];
  const root = process.getuid?.() === 0;
  checks.push({
    name: 'root',
    kind: 'host',
    ok: root,
    reason: root ? 'running as root' : 'not root: namespaces, mounts and cgroups need root',
    ...(root ? {} : { fix: 'run as root (sudo)' }),
  });
  const cg = await probeCgroups();
  checks.push({
    name: `cgroup v${cg.version}`,
    kind: 'host',
    ok: cg.ok,
    reason: cg.reason,
    ...(cg.fix ? { fix: cg.fix } : {}),
  });
  checks.push({ name: 'cgroup moves', kind: 'host', optional: true, ...(await probeCgroupMoves()) });
  checks.push({ name: 'user namespace policy', kind: 'host', ...usernsPolicyVerdict(readUsernsPolicy()) });
  // many sandboxes: what stops creates before memory does (issue 34)
  checks.push({ name: 'host limits', kind: 'host', optional: true, ...hostLimits() });
  return checks;
}

/**
 * Egress (docs/egress.md): nftables and procps, and what the host's forwarding is: on (left as it
 * is), or off (snaplab turns it on while a machine has egress; gc turns it off again).
 */
async function egressCheck(home: string): Promise<Omit<Check, 'name' | 'kind'>> {
  const missing = await toolsVerdict('egress', 'egress');
  if (missing) return missing;
  const refused = await probeEgressRules(home).catch((e: unknown) => describeFailure(e));
  if (refused)
    return {
      ok: false,
      reason: `nft refused egress's rules in a scratch namespace: ${refused}`,
      fix: "egress needs nftables with the nf_tables, nft_nat, nft_reject, nft_counter, nft_limit, nft_connlimit and nft_ct modules, and conntrack timeout policies (CONFIG_NF_CONNTRACK_TIMEOUT; Debian's and Ubuntu's kernels have them all)",
    };
  const caps = flowCapsNow();
  const forwarding = (
    await readFile('/proc/sys/net/ipv4/ip_forward', 'utf8').catch(orElse('', 'read ip_forward'))
  ).trim();
  return {
    ok: true,
    reason:
      (forwarding === '1'
        ? "nft takes its rules (tried in a scratch namespace); the host forwards (net.ipv4.ip_forward=1): a machine's egress goes out through NAT"
        : 'nft takes its rules (tried in a scratch namespace); the host does not forward now: snaplab turns net.ipv4.ip_forward on while a machine has egress, and gc turns it off after') +
      `; a machine may open ${caps.machine.rate} connections a second after ${caps.machine.burst}, ${caps.machine.active} at once, a home's machines ${caps.home.rate} a second after ${caps.home.burst} (${process.env.SNAPLAB_EGRESS_CAPS ? 'SNAPLAB_EGRESS_CAPS' : "from the host's nf_conntrack_max"}; docs/egress.md "Flows")`,
  };
}

/** Features beyond a single sandbox: snaplab runs without them, but they fail when used. */
async function featureChecks(home: string): Promise<Check[]> {
  const checks: Check[] = [];
  checks.push({
    name: 'scenarios',
    kind: 'feature',
    optional: true,
    ...((await toolsVerdict('scenario', 'scenarios')) ?? { ok: true, reason: 'ip and tc (iproute2) found' }),
  });
  checks.push({ name: 'egress', kind: 'feature', optional: true, ...(await egressCheck(home)) });
  checks.push({
    name: 'scenario VMs',
    kind: 'feature',
    optional: true,
    ...(existsSync('/dev/net/tun')
      ? { ok: true, reason: "/dev/net/tun: a VM machine's taps can be made" }
      : {
          ok: false,
          reason: "no /dev/net/tun: a scenario's VM machines (driver: qemu) need it for their taps",
          fix: 'modprobe tun',
        }),
  });
  checks.push({
    name: 'image import',
    kind: 'feature',
    optional: true,
    ...((await toolsVerdict('image', 'image import')) ??
      (await optionalNote('image', 'plain and gzip archives need nothing more'))),
  });
  checks.push({
    name: 'image build',
    kind: 'feature',
    optional: true,
    ...(await debianSource.probe()),
  });
  checks.push({
    name: 'ssh reach',
    kind: 'feature',
    optional: true,
    ...((await toolsVerdict('ssh', 'ssh-config and inventory')) ?? { ok: true, reason: 'ssh-keygen found' }),
  });
  // a node or gateway needs only an etcd to reach (--cluster); a member of one's own needs etcd here
  checks.push({
    name: 'cluster',
    kind: 'feature',
    optional: true,
    ...((await toolsVerdict('cluster', 'an etcd member on this host (docs/cluster.md)')) ?? {
      ok: true,
      reason: "etcd found (a node or gateway needs only the members' addresses: --cluster)",
    }),
  });
  return checks;
}

/** Probe everything snaplab needs; exit 0 when the default driver and a storage backend work. */
export async function doctor(home: string): Promise<{
  ok: boolean;
  home: string;
  defaultDriver: string;
  defaultStorage: string | null;
  defaultStorageReason: string;
  checks: Check[];
}> {
  const checks: Check[] = [];
  checks.push(...(await hostChecks()));
  // every driver of the registry; the default one must work, the others are optional
  for (const [name, driver] of createDrivers(home))
    checks.push({
      name,
      kind: 'driver',
      ...(name === DEFAULT_DRIVER ? {} : { optional: true }),
      ...(await driver.probe()),
    });
  const ns = checks.find((c) => c.kind === 'driver' && c.name === DEFAULT_DRIVER)!;
  for (const b of allBackends(home)) checks.push({ name: b.kind, kind: 'storage', ...(await b.probe()) });
  checks.push(
    ...(await usernsChecks(
      home,
      ns.ok,
      new Set(checks.filter((c) => c.kind === 'storage' && c.ok).map((c) => c.name)),
    )),
  );
  checks.push(...(await diskCapChecks(home)));
  checks.push({ name: 'busybox image', kind: 'image', ...(await busyboxSource.probe()) });
  checks.push(...(await featureChecks(home)));
  let defaultStorage: string | null = null;
  let defaultStorageReason = '';
  try {
    const d = await pickDefault(home);
    defaultStorage = d.kind;
    defaultStorageReason = d.reason;
  } catch (e) {
    defaultStorageReason = (e as Error).message;
  }
  return {
    ok: ns.ok && defaultStorage !== null,
    home,
    defaultDriver: DEFAULT_DRIVER,
    defaultStorage,
    defaultStorageReason,
    checks,
  };
}
