/**
 * A stock Debian 12 host to run snaplab on, as a VM of snaplab's own qemu driver: the host this
 * project's CI is not (here PID 1 is not systemd, cgroups are hybrid v1, /dev is not nosuid).
 *
 *   const host = await raiseStockHost(lab);          // trees, stage, import, boot (stage.ts, trees.ts)
 *   host.facts                                        // PID 1, cgroup mounts, /dev's options, df /: read first
 *   const r = await host.snaplab(['doctor', '--json']);   // { code, stdout, stderr, ms }
 *
 * The guest boots the tree's own systemd (init: 'systemd'); its root is an ext4 disk made from the
 * image (src/drivers/qemu/disk.ts: max(2 GiB, 2 * used + 256 MiB)), so it has about used + 256 MiB
 * free when the tree is over ~900 MiB, more below. Under emulation (TCG) everything inside is slow:
 * a Node start takes seconds.
 */
import { rm } from 'node:fs/promises';
import type { Lab } from '../../src/sdk/lab.js';
import type { Sandbox } from '../../src/sdk/sandbox.js';
import type { ExecText } from '../../src/sdk/output.js';
import { assembleStage, GUEST_PREFIX, GUEST_SYSD_TREE, treeBytes, type Stage } from './stage.js';

export { GUEST_PREFIX, GUEST_SYSD_TREE };
export const STOCK_IMAGE = 'stock-host';

export interface RaiseOptions {
  /** the VM's name (default stock-host) */
  name?: string;
  /** guest RAM, bytes (default 2 GiB: 4 GiB took ~20 s more to start the kernel under TCG) */
  memoryBytes?: number;
  /** guest CPUs (default 2) */
  cpus?: number;
  /** aborts a create still booting (the test's afterAll, when beforeAll timed out) */
  signal?: AbortSignal;
  /** progress lines (default: none) */
  log?: (line: string) => void;
}

/** What the guest is, read before anything else runs in it. */
export interface StockFacts {
  /** readlink /proc/1/exe */
  pid1Exe: string;
  /** stat -fc %T /sys/fs/cgroup */
  cgroupFs: string;
  /** mount points of cgroup (v1) filesystems in /proc/self/mountinfo */
  cgroupV1Mounts: string[];
  /** the per-mount options of /dev in /proc/self/mountinfo ('' when /dev is not a mount) */
  devOptions: string;
  /** the exec'd command saw PID 1's mount namespace (so its mountinfo is the host's) */
  sameMountNsAsPid1: boolean;
  /** df -B1 / */
  rootSizeBytes: number;
  rootAvailBytes: number;
  kernel: string;
  /** modules snaplab loads that `modprobe --dry-run` cannot resolve (nothing is loaded to find out) */
  unresolvedModules: string[];
}

/** Kernel modules snaplab needs on a host (storage, disk caps, scenarios), loaded on demand on a stock one. */
export const NEEDED_MODULES = ['loop', 'btrfs', 'overlay', 'veth', 'bridge', 'tun', 'sch_netem'];

export interface GuestRun {
  argv: string[];
  code: number;
  stdout: string;
  stderr: string;
  /** wall time seen from the test (the exec's round trip included) */
  ms: number;
}

export interface StockHost {
  lab: Lab;
  vm: Sandbox;
  facts: StockFacts;
  stage: Omit<Stage, 'dir'> & { bytes: number };
  /** milliseconds per phase of raising it */
  timings: Record<string, number>;
  /** every snaplab command run in the guest, in order */
  runs: GuestRun[];
  /**
   * `snaplab ARGS` in the guest as a user at a root shell would run it: /usr/local/bin/snaplab on
   * PATH, HOME=/root, SNAPLAB_HOME unset (so /var/lib/snaplab), and, unless `scope: false`, in a
   * transient systemd scope of its own under user.slice, as a login session's shell is (not in the
   * cgroup of the snaplab agent's unit that exec runs commands in).
   */
  snaplab(
    args: string[],
    opts?: {
      env?: Record<string, string> /** default 90 s (a create took 5-7 s) */;
      timeoutMs?: number;
      scope?: boolean;
    },
  ): Promise<GuestRun>;
  /** a shell command in the guest (as root, in the agent's unit) */
  sh(script: string, timeoutMs?: number): Promise<ExecText>;
}

const GiB = 2 ** 30;
const BOOT_TIMEOUT_MS = 180_000;

async function out(vm: Sandbox, argv: string[]): Promise<string> {
  const r = await vm.exec(argv, { timeoutMs: 60_000 });
  if (r.exitCode !== 0) throw new Error(`${argv.join(' ')} exited ${r.exitCode} in the guest: ${r.stderr}`);
  return r.stdout.trim();
}

/** Read what makes the guest a stock host (or not): nothing else has run in it yet. */
export async function readFacts(vm: Sandbox): Promise<StockFacts> {
  const pid1Exe = await out(vm, ['readlink', '/proc/1/exe']);
  const cgroupFs = await out(vm, ['stat', '-fc', '%T', '/sys/fs/cgroup']);
  // one process reads its mountinfo and both namespaces' names, so all three are of the same view
  const [ns, ns1, ...mountinfo] = (
    await out(vm, ['sh', '-c', 'readlink /proc/self/ns/mnt /proc/1/ns/mnt && cat /proc/self/mountinfo'])
  ).split('\n');
  const mounts = mountinfo.map((l) => {
    const f = l.split(' ');
    const dash = f.indexOf('-');
    return { point: f[4]!, options: f[5]!, fstype: f[dash + 1]! };
  });
  const df = (await out(vm, ['df', '-B1', '--output=size,avail', '/']))
    .split('\n')
    .pop()!
    .trim()
    .split(/\s+/)
    .map(Number);
  return {
    pid1Exe,
    cgroupFs,
    cgroupV1Mounts: mounts.filter((m) => m.fstype === 'cgroup').map((m) => m.point),
    devOptions: mounts.filter((m) => m.point === '/dev').pop()?.options ?? '',
    sameMountNsAsPid1: ns === ns1,
    rootSizeBytes: df[0]!,
    rootAvailBytes: df[1]!,
    kernel: await out(vm, ['uname', '-r']),
    unresolvedModules: (
      await out(vm, [
        'sh',
        '-c',
        `for m in ${NEEDED_MODULES.join(' ')}; do modprobe --dry-run --show-depends "$m" >/dev/null 2>&1 || echo "$m"; done`,
      ])
    )
      .split('\n')
      .filter(Boolean),
  };
}

/**
 * Build (or take from the cache) the trees, assemble and import the stage as the image
 * `stock-host`, and boot it as a system VM. The stage directory is removed once imported. On a
 * failure after the VM was made, the VM stays in the lab for disposeLab to remove.
 */
export async function raiseStockHost(lab: Lab, opts: RaiseOptions = {}): Promise<StockHost> {
  const log = opts.log ?? (() => undefined);
  const timings: Record<string, number> = {};
  const step = async <T>(what: string, f: () => Promise<T>): Promise<T> => {
    const t0 = performance.now();
    log(`${what} ...`);
    try {
      return await f();
    } finally {
      timings[what] = Math.round(performance.now() - t0);
      log(`${what}: ${(timings[what] / 1000).toFixed(1)} s`);
    }
  };

  // the lab's own guest kernel (fetched with apt on its first VM): the modules must be its version's
  const prepared = await step('guest kernel (lab.prepare)', () => lab.prepare({ driver: 'qemu' }));
  const version = prepared.vm!.version;

  const stage = await step('stage', () => assembleStage(lab, version));
  let bytes = 0;
  try {
    for (const [k, v] of Object.entries(stage.ms)) timings[`stage: ${k}`] = v;
    bytes = await treeBytes(stage.dir);
    await step('image import', () => lab.importImage(stage.dir, STOCK_IMAGE));
  } finally {
    await rm(stage.dir, { recursive: true, force: true });
  }

  // its agent answered 30-33 s after QEMU started here (4 GiB: the kernel alone takes 26 s under
  // TCG, 6.5 s with 1 GiB), half the driver's default 60 s: give a loaded host room
  const bootTimeout = process.env.SNAPLAB_VM_BOOT_TIMEOUT_MS;
  process.env.SNAPLAB_VM_BOOT_TIMEOUT_MS ||= String(BOOT_TIMEOUT_MS);
  const vm = await step('boot (create, to systemd running)', () =>
    lab.create({
      name: opts.name ?? STOCK_IMAGE,
      image: STOCK_IMAGE,
      driver: 'qemu',
      init: 'systemd',
      limits: { memoryBytes: opts.memoryBytes ?? 2 * GiB, cpus: opts.cpus ?? 2 },
      signal: opts.signal,
    }),
  ).finally(() => {
    if (bootTimeout === undefined) delete process.env.SNAPLAB_VM_BOOT_TIMEOUT_MS;
  });
  for (const p of vm.lastTrace?.phases ?? [])
    if (p.depth === 0) timings[`boot: ${p.name}`] = Math.round(p.endMs - p.startMs);
  const facts = await step('facts', () => readFacts(vm));

  const runs: GuestRun[] = [];
  const host: StockHost = {
    lab,
    vm,
    facts,
    stage: { host: stage.host, sysd: stage.sysd, ms: stage.ms, bytes },
    timings,
    runs,
    async snaplab(args, o = {}) {
      const argv = [
        ...(o.scope === false ? [] : ['systemd-run', '--scope', '--quiet', '--collect', '--slice=user.slice', '--']),
        'snaplab',
        ...args,
      ];
      const t0 = performance.now();
      const r = await vm.exec(argv, {
        env: { HOME: '/root', ...o.env },
        cwd: '/root',
        timeoutMs: o.timeoutMs ?? 90_000,
      });
      const done: GuestRun = {
        argv: ['snaplab', ...args],
        code: r.exitCode,
        stdout: r.stdout,
        stderr: r.stderr,
        ms: Math.round(performance.now() - t0),
      };
      runs.push(done);
      log(`guest: ${done.argv.join(' ')} → ${done.code} in ${(done.ms / 1000).toFixed(1)} s`);
      return done;
    },
    sh: (script, timeoutMs = 120_000) => vm.exec(['sh', '-c', script], { timeoutMs }),
  };
  return host;
}

/** The timings and every guest command, as a table for the test's output. */
export function report(host: StockHost): string {
  const lines = ['stock host:'];
  const s = (ms: number): string => `${(ms / 1000).toFixed(1).padStart(7)} s`;
  lines.push(
    `  trees: host ${host.stage.host.cached ? 'from the cache' : 'built'}, sysd ${host.stage.sysd.cached ? 'from the cache' : 'built'}; stage ${(host.stage.bytes / 2 ** 20).toFixed(0)} MiB`,
  );
  lines.push(
    `  guest: ${host.facts.kernel}, / ${(host.facts.rootAvailBytes / 2 ** 20).toFixed(0)} MiB free of ${(host.facts.rootSizeBytes / 2 ** 20).toFixed(0)} MiB`,
  );
  for (const [k, v] of Object.entries(host.timings)) lines.push(`  ${s(v)}  ${k}`);
  for (const r of host.runs) lines.push(`  ${s(r.ms)}  guest: ${r.argv.join(' ')} → ${r.code}`);
  return lines.join('\n');
}
