import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, copyFile, link, mkdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { AgentClient } from '../../agent/client.js';
import { agentBinaryPath, hostAgentBinaryPath } from '../../agent/binary.js';
import { SnaplabError, isSnaplabError } from '../../errors.js';
import { withLock } from '../../host/lock.js';
import { cgroupFor, createCgroup } from '../../host/cgroups/cgroups.js';
import type { Availability } from '../../host/probe-types.js';
import { liveness, processStartTime, sameProcess, waitGone } from '../../host/procs.js';
import { which } from '../../host/run.js';
import { toolsVerdict } from '../../host/tools.js';
import type { Trace } from '../../timing/trace.js';
import type {
  DeathReport,
  Driver,
  LiveObjects,
  MachineHandle,
  MachineSpec,
  MemoryImage,
  PreparedHost,
  RaisedMachine,
} from '../driver.js';
import { checkMemory } from '../memory.js';
import { QEMU_INFO, VM_DEFAULT_MEMORY } from './info.js';
import { capacityOf } from '../capacity.js';
import { giveIdentity } from './identity.js';
import { ensureGuestKernel, ensureInitramfs, qemuKernelArgs } from './guest.js';
import { netArg } from './guest-init.js';
import { GUEST_LINK } from '../../host/net/egress-rules.js';
import { baseDiskPath, checkVolumeDisk, ensureBaseDisk, freshVolumeDisk, gcBaseDisks } from './disk.js';
import { QEMU, logTail, startQemu, vmFiles, vmmUid, type VmConfig } from './launch.js';
import { HostOps } from '../../host/hostops.js';
import { QmpClient } from './qmp.js';
import { gcMachines, killAndSweep } from '../teardown.js';
import { SANDBOX_CAPABILITIES } from '../namespaces/capabilities.js';
import { chooseAccel } from './accel.js';
import { holdRelay, releaseRelay, startRelay } from './relay.js';
import { copyRam, gcRam, removeRam, vmRamPath } from './ram.js';
import { noted, orElse } from '../../cleanup.js';

/** A memory snapshot continues with the NICs it had, on taps of the same names. */
function checkRestoredNics(snapped: VmConfig, spec: MachineSpec): void {
  const had = (snapped.net?.nics ?? []).map((n) => n.tap).join(',');
  const has = (spec.netns ? (spec.nics ?? []) : []).map((n) => n.tap).join(',');
  if (had === has) return;
  const orFiles = 'or take a filesystem snapshot (without --memory) to create a machine from';
  const [message, hint] = !had
    ? [
        'this memory snapshot is of a VM without network interfaces: it cannot continue with egress or on a network',
        `restore it without egress, ${orFiles}`,
      ]
    : had === GUEST_LINK.tap
      ? [
          'this memory snapshot is of a VM with egress: it continues only with egress (its NIC is in it)',
          `restore it with egress (--egress), ${orFiles}`,
        ]
      : [
          `this memory snapshot is of a scenario machine with network interfaces (${had}): it continues only in its scenario`,
          `reset the scenario to it (\`snaplab reset SCENARIO\`), ${orFiles}`,
        ];
  throw new SnaplabError('BAD_INPUT', message, hint);
}

/**
 * How long a booting or restored VM's agent may take to answer: 60 s, or SNAPLAB_VM_BOOT_TIMEOUT_MS
 * (an emulated host running many boots at once needs more; a test of the failure path, less).
 */
export const DEFAULT_BOOT_TIMEOUT_MS = 60_000;
export function bootTimeoutMs(): number {
  const text = process.env.SNAPLAB_VM_BOOT_TIMEOUT_MS;
  if (text === undefined || text === '') return DEFAULT_BOOT_TIMEOUT_MS;
  const ms = Number(text);
  if (!Number.isInteger(ms) || ms <= 0)
    throw new SnaplabError(
      'BAD_INPUT',
      `SNAPLAB_VM_BOOT_TIMEOUT_MS must be a whole number of milliseconds, not ${JSON.stringify(text)}`,
      'unset it for the default (60000)',
    );
  return ms;
}

/** how long a killed VM's QEMU and relay may take to leave its cgroup */
const DESTROY_TIMEOUT_MS = 20_000;
/** a running guest answers a new relay at once; a paused one never does */
const RELAY_RESTART_TIMEOUT_MS = 10_000;
/**
 * In a VM the machine is the boundary: the guest's root keeps the namespaces driver's capability
 * set plus SYS_TIME (the agent corrects the clock after a restore) and SYS_ADMIN (a restored copy
 * takes a hostname of its own). Commands still run under the seccomp filter.
 */
const VM_CAPABILITIES = [...SANDBOX_CAPABILITIES, 'CAP_SYS_TIME', 'CAP_SYS_ADMIN'];
/** what the QEMU process needs beyond the guest's RAM */
const VMM_OVERHEAD = 256 * 1024 * 1024;

/**
 * The VM driver: a QEMU machine per sandbox, booted from a Debian cloud kernel and a small
 * initramfs that mounts the VM's root disk (a qcow2 overlay, kept in the sandbox's volume, on a
 * base disk made from the image) and runs the agent as PID 1, served over a virtio-serial port.
 * KVM only where a test boot proves it works, else emulation (TCG).
 */
export class QemuDriver implements Driver {
  readonly name = QEMU_INFO.name;
  readonly capabilities = QEMU_INFO.capabilities;
  readonly memory = QEMU_INFO.memory;
  readonly consoleLog = QEMU_INFO.consoleLog;
  readonly machineNoun = QEMU_INFO.machineNoun;

  constructor(private readonly home: string) {}

  runDir(id: string): string {
    return join(this.home, 'run', id);
  }

  async probe(): Promise<Availability> {
    if (process.getuid?.() !== 0)
      return { ok: false, reason: 'the VM driver needs root (cgroups)', fix: 'run snaplab as root' };
    // QEMU, its disks (qemu-img, mkfs.ext4), the guest kernel's fetch (apt, dpkg-deb, depmod), the initramfs
    const missing = await toolsVerdict('qemu', 'the VM driver');
    if (missing) return missing;
    const qemu = (await which(QEMU))!;
    try {
      agentBinaryPath();
      hostAgentBinaryPath(); // the VM's relay
    } catch (e) {
      return { ok: false, reason: (e as Error).message, fix: 'make -C native' };
    }
    const accel = await readFile(join(this.home, 'qemu', 'accel.json'), 'utf8').then(
      (t) => JSON.parse(t) as { accel: string; reason: string },
      () => null,
    );
    return {
      ok: true,
      reason: `${qemu}; acceleration: ${accel ? `${accel.accel} (${accel.reason})` : 'decided by a test boot on first use (KVM only if a guest boots under it)'}`,
    };
  }

  /**
   * Fetch and build ahead of time what every VM needs, so that nothing is downloaded at run time
   * (set-up runs it): the guest kernel (apt) and the initramfs.
   */
  async prepareHost(onProgress?: (s: string) => void): Promise<PreparedHost> {
    const kernel = await ensureGuestKernel(this.home, onProgress, { net: true });
    onProgress?.('building the initramfs');
    const initramfs = await ensureInitramfs({
      home: this.home,
      kernel,
      agent: agentBinaryPath(),
      machine: 'pc',
      caps: VM_CAPABILITIES,
    });
    return { version: kernel.version, kernel: kernel.kernel, initramfs };
  }

  async prepare(spec: Omit<MachineSpec, 'rootfs'>, trace: Trace): Promise<void> {
    await trace.phase('cgroup', async () => {
      await mkdir(this.runDir(spec.id), { recursive: true, mode: 0o700 });
      if (!existsSync(cgroupFor(spec.id).dirs[0] ?? '')) {
        await createCgroup(spec.id, {
          memoryBytes: guestMemory(spec) + VMM_OVERHEAD,
          pids: 512,
          cpus: spec.limits.cpus,
        });
      }
    });
  }

  private async config(spec: MachineSpec, trace: Trace): Promise<VmConfig> {
    const nics = spec.netns ? (spec.nics ?? []) : [];
    // a VM with NICs needs virtio_net, which a kernel cached before scenario VMs lacks
    const kernel = await trace.phase('guest kernel', () =>
      ensureGuestKernel(this.home, undefined, { net: nics.length > 0 }),
    );
    const initrd = await trace.phase('initramfs', () => this.initramfs(spec.id, kernel));
    const { disk, base: diskBase } = await trace.phase('root disk', () => this.rootDisk(spec));
    const base = {
      machine: 'pc' as const,
      memoryMb: Math.round(guestMemory(spec) / 2 ** 20),
      cpus: capacityOf(spec.limits, QEMU_INFO).cpus,
      kernel: kernel.kernel,
      initrd,
      disk,
      diskBase,
      append: `${qemuKernelArgs('pc')} snaplab.hostname=${spec.hostname}`,
    };
    // the acceleration probe boots to the agent alone: a guest's systemd would only slow it
    const accel = await trace.phase('acceleration', () =>
      chooseAccel(this.home, (a) => this.testBoot(spec.id, { ...base, accel: a })),
    );
    const ram = await vmRamPath(this.home, spec.id, guestMemory(spec));
    // a system machine: the guest's /init hands over to the image's systemd (guest-init.ts);
    // a scenario machine's /init gives its NICs their addresses, named as the kernel found them
    // (net.ifnames=0: an image's udev renames none)
    const append = [
      base.append,
      ...(spec.init === 'systemd' ? ['snaplab.init=systemd'] : []),
      ...(nics.length ? ['net.ifnames=0', ...nics.map((n) => netArg(n.mac, n.address, n.gateway))] : []),
    ].join(' ');
    const net = nics.length ? { net: { netns: spec.netns!, nics: nics.map((n) => ({ tap: n.tap, mac: n.mac })) } } : {};
    return { ...base, append, accel, memoryBackend: true, ...(ram ? { ram: { path: ram, share: true } } : {}), ...net };
  }

  /** The shared initramfs (cached), linked into the VM's run directory: it outlives a cache rebuild. */
  private async initramfs(id: string, kernel: Awaited<ReturnType<typeof ensureGuestKernel>>): Promise<string> {
    const cached = await ensureInitramfs({
      home: this.home,
      kernel,
      agent: agentBinaryPath(),
      machine: 'pc',
      caps: VM_CAPABILITIES,
    });
    const mine = join(this.runDir(id), 'initrd.cpio.gz');
    await rm(mine, { force: true });
    await link(cached, mine).catch(() => copyFile(cached, mine));
    return mine;
  }

  /**
   * The VM's disk in its volume: a new overlay on the image's base disk when the volume is a
   * clone of an image (whatever the image's tree holds there is discarded), else the disk of the
   * VM snapshot it is a clone of, checked.
   */
  private async rootDisk(spec: MachineSpec): Promise<{ disk: string; base: string }> {
    if (!spec.source)
      throw new SnaplabError(
        'INTERNAL',
        `no source volume for the disk in ${spec.rootfs}`,
        'this is a bug in snaplab; please report it',
      );
    if (!spec.source.image) return checkVolumeDisk(this.home, spec.rootfs);
    const base = await ensureBaseDisk(this.home, spec.source);
    return { disk: await freshVolumeDisk(spec.rootfs, base), base };
  }

  /** Does a guest reach its agent under this acceleration within a short time? (KVM hangs on some hosts.) */
  private async testBoot(id: string, c: VmConfig): Promise<boolean> {
    const dir = join(this.runDir(id), 'probe');
    await mkdir(dir, { recursive: true });
    let pid = 0;
    try {
      // in the sandbox's cgroup like any VM: killed with it, found by gc if this process dies
      pid = await startQemu(dir, c, false, cgroupFor(id).procsFiles, await vmmUid(id));
      const start = (await processStartTime(pid)) ?? 0;
      return await agentAnswers(vmFiles(dir).chardev, 8000, () => sameProcess(pid, start));
    } catch (e) {
      // QEMU that cannot start at all (no bwrap for its jail) says nothing of KVM: no verdict
      if (isSnaplabError(e, 'DRIVER_UNAVAILABLE')) throw e;
      return false;
    } finally {
      if (pid) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          /* gone */
        }
        await waitGone(pid, 5000); // its disk's image lock goes with it: the real VM opens the same disk
      }
      await rm(dir, { recursive: true, force: true });
    }
  }

  /**
   * The signal is asked between steps (a guest kernel's fetch, an initramfs's build and the
   * acceleration probe run to their end) and ends the boot wait at once; what was made by then is
   * the machine's cgroup and run directory, which the lab's destroy removes.
   */
  async raise(spec: MachineSpec, trace: Trace, signal?: AbortSignal): Promise<RaisedMachine> {
    bootTimeoutMs(); // a bad SNAPLAB_VM_BOOT_TIMEOUT_MS fails before anything is made
    signal?.throwIfAborted();
    await this.prepare(spec, trace);
    signal?.throwIfAborted();
    const config = await this.config(spec, trace);
    signal?.throwIfAborted();
    await writeFile(join(this.runDir(spec.id), 'vm.json'), JSON.stringify(config));
    return this.start(spec.id, config, trace, undefined, signal);
  }

  private async start(
    id: string,
    config: VmConfig,
    trace: Trace,
    memory?: MemoryImage,
    signal?: AbortSignal,
  ): Promise<RaisedMachine> {
    const dir = this.runDir(id);
    const bootMs = bootTimeoutMs();
    if (memory) await checkMemoryImage(memory, config);
    const pid = await trace.phase('spawn vmm', async () =>
      startQemu(dir, config, memory !== undefined, cgroupFor(id).procsFiles, await vmmUid(id)),
    );
    const handle: MachineHandle = { id, pid, pidStart: (await processStartTime(pid)) ?? 0 };
    // QEMU runs unprivileged: the memory file is opened here and handed over (before the QMP
    // client below takes the monitor's one connection)
    const incoming = `incoming-${randomBytes(4).toString('hex')}`;
    if (memory)
      await trace.phase('hand over memory', () =>
        handOver(vmFiles(dir).qmp, incoming, join(memory.dir, 'memory'), 'r'),
      );
    const qmp = await trace.phase('qmp ready', () => QmpClient.connect(vmFiles(dir).qmp));
    try {
      if (memory) {
        await trace.phase('load memory', async () => {
          // the RAM is the snapshot's file, mapped: the stream holds the devices' state alone
          if (config.ram)
            await qmp.execute('migrate-set-capabilities', {
              capabilities: [{ capability: 'x-ignore-shared', state: true }],
            });
          await qmp.execute('migrate-incoming', { uri: `fd:${incoming}` });
          await qmp.waitMigration(60_000);
        });
        await trace.phase('resume', () => qmp.execute('cont'));
      }
    } finally {
      qmp.close();
    }
    // the relay holds the VM's one agent connection; every host process connects to it
    await trace.phase('agent ready', () => startRelay(dir, pid, cgroupFor(id).procsFiles, bootMs, signal));
    const agent = await trace.phase('connect', () => this.connect(handle));
    return { handle, agent };
  }

  /**
   * A connection through the VM's relay: any number, from any process. A relay that has died
   * (killed, out of memory) while QEMU lives is started again, once, under a lock.
   */
  async connect(handle: MachineHandle, timeoutMs = 5000): Promise<AgentClient> {
    const dir = this.runDir(handle.id);
    const attempt = (): Promise<AgentClient> => AgentClient.connect(vmFiles(dir).relay, { timeoutMs, reset: true });
    const gone = async (): Promise<SnaplabError | undefined> =>
      (await sameProcess(handle.pid, handle.pidStart))
        ? undefined
        : new SnaplabError(
            'SANDBOX_DEAD',
            `the VM's QEMU process is gone:\n${await logTail(dir)}`,
            'remove it with `snaplab rm`',
          );
    try {
      return await attempt();
    } catch (first) {
      const dead = await gone();
      if (dead) throw dead;
      if (!isSnaplabError(first, 'AGENT_UNREACHABLE')) throw first;
      return withLock(join(dir, 'relay.lock'), async () => {
        try {
          return await attempt(); // another process may have restarted it meanwhile
        } catch {
          await startRelay(dir, handle.pid, cgroupFor(handle.id).procsFiles, RELAY_RESTART_TIMEOUT_MS);
          return attempt();
        }
      });
    }
  }

  private async qmp<T>(handle: MachineHandle, fn: (q: QmpClient) => Promise<T>): Promise<T> {
    const q = await QmpClient.connect(vmFiles(this.runDir(handle.id)).qmp, 5000);
    try {
      return await fn(q);
    } finally {
      q.close();
    }
  }

  /** The relay holds what is bound for the guest first: nothing moves in a stopped guest's memory. */
  async pause(handle: MachineHandle): Promise<void> {
    await holdRelay(this.runDir(handle.id));
    try {
      await this.qmp(handle, (q) => q.execute('stop'));
    } catch (e) {
      await releaseRelay(this.runDir(handle.id)); // still running: let its traffic flow again
      throw e;
    }
  }

  /** The guest's clock stands still while it is stopped: the lab sets it after (see Sandbox.resume). */
  async resume(handle: MachineHandle): Promise<void> {
    await this.qmp(handle, (q) => q.execute('cont'));
    await releaseRelay(this.runDir(handle.id));
  }

  /**
   * Write the whole machine state (memory, devices) to `dir`; the lab has paused the VM (QEMU
   * flushed its disk then) and snapshotted its volume, and resumes it after.
   */
  async snapshotMemory(handle: MachineHandle, dir: string, trace: Trace): Promise<MemoryImage> {
    await mkdir(dir, { recursive: true });
    // the restore starts QEMU with the same kernel and initramfs: the initramfs goes with the
    // snapshot (the VM's run directory goes when it is destroyed; the kernel cache stays)
    const config = JSON.parse(await readFile(join(this.runDir(handle.id), 'vm.json'), 'utf8')) as VmConfig;
    await link(config.initrd, join(dir, 'initrd.cpio.gz')).catch(() =>
      copyFile(config.initrd, join(dir, 'initrd.cpio.gz')),
    );
    // a VM with RAM of its own in a file: copy the file, stream the devices alone; any other
    // (a restored VM maps its snapshot's RAM privately): stream it all
    const ownRam = config.ram?.share === true;
    const { ram: _ram, ...rest } = config;
    // a restore of it names its RAM block as this VM does (ram0, or pc.ram for a VM from before RAM files)
    const snapped: VmConfig = {
      ...rest,
      initrd: join(dir, 'initrd.cpio.gz'),
      ...(ownRam ? { ram: { path: join(dir, 'ram'), share: false } } : {}),
    };
    await writeFile(join(dir, 'vm.json'), JSON.stringify(snapped));
    let ramBytes = 0;
    // a name of its own per operation: a descriptor left by a failed one is never used by the next
    const fdName = `snapshot-${randomBytes(4).toString('hex')}`;
    await handOver(vmFiles(this.runDir(handle.id)).qmp, fdName, join(dir, 'memory'), 'w');
    await this.qmp(handle, async (q) => {
      await q.execute('stop', undefined, trace); // already stopped by the lab: a no-op then
      await q.execute('migrate-set-capabilities', { capabilities: [{ capability: 'x-ignore-shared', state: ownRam }] });
      await trace.phase('save memory', async () => {
        try {
          await q.execute('migrate', { uri: `fd:${fdName}` });
        } catch (e) {
          await q.execute('closefd', { fdname: fdName }).catch(noted(`closefd ${fdName}`)); // not consumed: give it back
          throw e;
        }
        await q.waitMigration(120_000).catch(async (e: unknown) => {
          await q.execute('migrate_cancel').catch(noted('migrate_cancel'));
          throw e;
        });
      });
      if (ownRam) ramBytes = await trace.phase('copy ram', () => copyRam(config.ram!.path, join(dir, 'ram')));
      await chmod(join(dir, 'ram'), 0o444).catch(noted(`chmod 444 ${join(dir, 'ram')}`, 'ENOENT')); // restores map it read only
    });
    const { size } = await stat(join(dir, 'memory'));
    return { dir, bytes: size + ramBytes };
  }

  /** A new VM that continues from a memory snapshot: same devices and memory size, then resumed. */
  async restoreMemory(spec: MachineSpec, image: MemoryImage, trace: Trace): Promise<RaisedMachine> {
    await this.prepare(spec, trace);
    const snapped = JSON.parse(await readFile(join(image.dir, 'vm.json'), 'utf8')) as VmConfig;
    // the copy keeps its own initramfs: the snapshot may be removed while the copy lives on
    const initrd = join(this.runDir(spec.id), 'initrd.cpio.gz');
    await rm(initrd, { force: true });
    await link(snapped.initrd, initrd).catch(() => copyFile(snapped.initrd, initrd));
    // its disk is the one in its volume, a clone of the snapshot's, taken with the memory
    const { disk, base: diskBase } = await checkVolumeDisk(this.home, spec.rootfs);
    // its NICs come back on the taps of the namespace it is restored into (a scenario machine's,
    // or a new link out's): the devices are the snapshot's, so that namespace must have them
    checkRestoredNics(snapped, spec);
    const config: VmConfig = {
      ...snapped,
      initrd,
      disk,
      diskBase,
      ...(snapped.net ? { net: { ...snapped.net, netns: spec.netns! } } : {}),
    };
    await writeFile(join(this.runDir(spec.id), 'vm.json'), JSON.stringify(config));
    const raised = await this.start(spec.id, config, trace, image);
    try {
      // its clock stood still since the snapshot: the host's, then a name of its own
      await trace.phase('clock set', () => raised.agent.setClock(BigInt(Date.now()) * 1_000_000n));
      await giveIdentity(raised.agent, spec.hostname, spec.init, trace);
    } catch (e) {
      void raised.agent.close(); // the machine itself goes with the lab's destroy of the failed restore
      throw e;
    }
    return raised;
  }

  async inspect(handle: MachineHandle): Promise<DeathReport> {
    const qemu = await liveness(handle.pid, handle.pidStart);
    if (qemu.state === 'alive') return { state: 'alive' };
    if (qemu.state === 'unknown') return { state: 'unknown', reason: qemu.cause.message };
    return { state: 'dead', reason: 'its QEMU process is gone (killed from outside, or the host rebooted)' };
  }

  async destroy(handle: MachineHandle): Promise<void> {
    try {
      await killAndSweep(this.home, handle, DESTROY_TIMEOUT_MS);
    } finally {
      // QEMU is killed: the file's pages are freed as soon as it exits, whatever else failed
      await removeRam(this.home, handle.id);
    }
  }

  /**
   * A VM's host objects are its run directory and its cgroup (QEMU and its relay are in it), named
   * by the sandbox id as every driver's are (drivers/teardown.ts); its RAM file in /dev/shm; and
   * the base disks of image volumes that are gone.
   */
  async gc(live: LiveObjects): Promise<string[]> {
    return [
      ...(await gcMachines(this.home, (id) => live.sandbox(id))),
      ...(await gcRam(this.home, (id) => live.sandbox(id))),
      ...(await gcBaseDisks(this.home, (id) => live.imageVolume(id))),
    ];
  }

  /** The base disk made from an image volume, if any (nothing uses it: no sandbox, no snapshot). */
  async forgetImage(volumeId: string): Promise<void> {
    await rm(baseDiskPath(this.home, volumeId), { force: true });
  }
}

function guestMemory(spec: Omit<MachineSpec, 'rootfs'>): number {
  const bytes = spec.limits.memoryBytes ?? VM_DEFAULT_MEMORY;
  checkMemory(QEMU_INFO, bytes);
  return bytes;
}

/** A restore needs the snapshot's files whole: check them before QEMU waits on a missing stream. */
async function checkMemoryImage(image: MemoryImage, config: VmConfig): Promise<void> {
  const files = [join(image.dir, 'memory'), ...(config.ram ? [config.ram.path] : [])];
  for (const f of files) {
    if (!(await stat(f).catch(orElse(null, 'stat', 'ENOENT')))?.size) {
      throw new SnaplabError(
        'SNAPSHOT_NOT_FOUND',
        `a file of this memory snapshot is missing or empty: ${f}`,
        'take a new memory snapshot; this one cannot be restored',
      );
    }
  }
}

/**
 * Does the agent answer on the VM's chardev within `timeoutMs` (RESET first, retrying while the
 * guest boots)? The acceleration probe's test; real VMs are reached through their relay.
 */
async function agentAnswers(path: string, timeoutMs: number, alive: () => Promise<boolean>): Promise<boolean> {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end && (await alive())) {
    try {
      void (
        await AgentClient.connect(path, { timeoutMs: Math.min(2000, Math.max(200, end - Date.now())), reset: true })
      ).close(); // close() never rejects
      return true;
    } catch {
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  return false;
}

/**
 * Open `file` here (as root) and give QEMU the descriptor under `name` through its monitor
 * (native/hostops.c qmp-getfd): QEMU runs as an unprivileged uid that cannot open snapshot paths.
 */
async function handOver(qmpSocket: string, name: string, file: string, mode: 'r' | 'w'): Promise<void> {
  try {
    await HostOps.require().request('qmp-getfd', qmpSocket, name, file, mode);
  } catch (e) {
    throw new SnaplabError(
      'VM_ERROR',
      `cannot hand ${file} to QEMU: ${(e as Error).message}`,
      'is the VM still running? see `snaplab ls`',
      { cause: e },
    );
  }
}
