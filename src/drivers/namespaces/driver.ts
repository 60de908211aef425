import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { AgentClient } from '../../agent/client.js';
import { agentBinaryPath, hostAgentBinaryPath } from '../../agent/binary.js';
import { SnaplabError } from '../../errors.js';
import {
  type Cgroup,
  cgroupFor,
  createCgroup,
  delegateCgroup,
  isFrozen,
  freeze,
  oomKills,
  probeCgroups,
  thaw,
} from '../../host/cgroups/cgroups.js';
import type { Availability } from '../../host/probe-types.js';
import { liveness, processStartTime, waitGone } from '../../host/procs.js';
import { which } from '../../host/run.js';
import { toolsVerdict } from '../../host/tools.js';
import { Trace } from '../../timing/trace.js';
import type { DeathReport, Driver, LiveObjects, MachineHandle, MachineSpec, RaisedMachine } from '../driver.js';
import { NAMESPACES_INFO } from './info.js';
import { bootArgs, bwrapArgs } from './bwrap-args.js';
import { launchNative } from './launch.js';
import { gcMachines, killAndSweep } from '../teardown.js';
import { HostOps } from '../../host/hostops.js';
import { failureMeans, handledElsewhere, noted } from '../../cleanup.js';

const RAISE_TIMEOUT_MS = 10_000;

/**
 * The default driver: a sandbox is a set of Linux namespaces made by bubblewrap around a
 * copy-on-write root filesystem, held in a cgroup, with the agent as its PID 1.
 */
export class NamespacesDriver implements Driver {
  readonly name = NAMESPACES_INFO.name;
  readonly capabilities = NAMESPACES_INFO.capabilities;
  readonly memory = NAMESPACES_INFO.memory;
  readonly consoleLog = NAMESPACES_INFO.consoleLog;
  readonly machineNoun = NAMESPACES_INFO.machineNoun;
  private bwrap: string | undefined;
  /** each machine's cgroup, made ahead of its raise; a system machine's with its payload leaf's cgroup.procs */
  private readonly prepared = new Map<
    string,
    Promise<{ cg: Cgroup; delegated?: { payload: string; agent: string } }>
  >();

  constructor(private readonly home: string) {}

  runDir(id: string): string {
    return join(this.home, 'run', id);
  }

  /** the agent's socket: bound by the host, handed to the agent as an fd, never visible inside */
  socketPath(id: string): string {
    return join(this.runDir(id), 'agent.sock');
  }

  async probe(): Promise<Availability> {
    if (process.getuid?.() !== 0)
      return { ok: false, reason: 'namespaces, mounts and cgroups need root', fix: 'run snaplab as root (sudo)' };
    const missing = await toolsVerdict('namespaces', 'the namespaces driver');
    if (missing) return missing;
    const bwrap = (await which('bwrap'))!;
    try {
      agentBinaryPath();
      hostAgentBinaryPath(); // a copy's host side
      HostOps.require();
    } catch (e) {
      return {
        ok: false,
        reason: (e as Error).message,
        fix: 'make -C native (needs gcc, musl-tools and libseccomp-dev)',
      };
    }
    const cg = await probeCgroups();
    if (!cg.ok) return { ok: false, reason: cg.reason, fix: cg.fix };
    return { ok: true, reason: `bubblewrap at ${bwrap}; ${cg.reason}` };
  }

  async prepare(spec: Omit<MachineSpec, 'rootfs'>, trace: Trace): Promise<void> {
    if (this.prepared.has(spec.id)) return;
    const made = trace.phase('cgroup', async () => {
      // the run directory first: it is how gc knows the cgroup is this home's (see gc)
      await mkdir(this.runDir(spec.id), { recursive: true, mode: 0o700 });
      const cg = await createCgroup(spec.id, spec.limits);
      // the lab refuses a system machine without a user namespace before it gets here (raise.ts)
      if (spec.init === 'systemd') return { cg, delegated: await delegateCgroup(cg, spec.userns!.base) };
      return { cg };
    });
    this.prepared.set(spec.id, made);
    await made;
  }

  async raise(spec: MachineSpec, trace: Trace, signal?: AbortSignal): Promise<RaisedMachine> {
    const runDir = this.runDir(spec.id);
    await this.prepare(spec, trace);
    const { cg, delegated } = await this.prepared.get(spec.id)!;
    this.prepared.delete(spec.id);
    const agent = agentBinaryPath();
    this.bwrap ??= (await which('bwrap')) ?? 'bwrap';
    const bwrap =
      spec.init === 'systemd'
        ? bootArgs({
            hostname: spec.hostname,
            sharedNetns: spec.netns !== undefined,
            init: ['/sbin/init'],
            cgroups: delegated!,
          })
        : [
            this.bwrap,
            ...bwrapArgs({
              rootfs: spec.rootfs,
              agentBinary: agent,
              hostname: spec.hostname,
              sharedNetns: spec.netns !== undefined,
              staged: spec.userns !== undefined,
            }),
          ];
    signal?.throwIfAborted();
    const t0 = Trace.now();
    const res = await launchNative(HostOps.require(), {
      socket: this.socketPath(spec.id),
      netns: spec.netns,
      ...(spec.userns
        ? {
            userns: {
              ...spec.userns,
              rootfs: spec.rootfs,
              agent,
              ...(spec.stack ? { stack: spec.stack } : {}),
              allowSuid: spec.init === 'systemd',
            },
          }
        : {}),
      cgroupProcs: cg.procsFiles,
      argv: bwrap,
      logFile: join(runDir, this.consoleLog),
      timeoutMs: RAISE_TIMEOUT_MS,
      // a sandbox's bwrap monitor only waits for the agent: ~220 KiB each, let go (docs/architecture.md "Density");
      // a system machine's monitor (boot.c) holds its console and is its life
      dropMonitor: spec.init !== 'systemd',
    });
    trace.record('launch', t0, res.namespacesAt);
    trace.record('namespaces ready → agent listening', res.namespacesAt, res.readyAt);
    const pidStart = (await processStartTime(res.agentPid)) ?? 0;
    const handle: MachineHandle = { id: spec.id, pid: res.agentPid, pidStart };
    const client = await trace.phase('agent connect', () => this.connect(handle));
    return { handle, agent: client };
  }

  async connect(handle: MachineHandle, timeoutMs = 5000): Promise<AgentClient> {
    return AgentClient.connect(this.socketPath(handle.id), { timeoutMs });
  }

  async pause(handle: MachineHandle): Promise<void> {
    await freeze(cgroupFor(handle.id));
  }

  async resume(handle: MachineHandle): Promise<void> {
    await thaw(cgroupFor(handle.id));
  }

  async inspect(handle: MachineHandle): Promise<DeathReport> {
    const init = await liveness(handle.pid, handle.pidStart);
    if (init.state === 'alive') return { state: 'alive' };
    if (init.state === 'unknown') return { state: 'unknown', reason: init.cause.message };
    let ooms = 0;
    try {
      ooms = oomKills(cgroupFor(handle.id));
    } catch {
      /* cgroup gone */
    }
    return {
      state: 'dead',
      reason:
        ooms > 0
          ? `its init process is gone and its memory cgroup recorded ${ooms} OOM kill(s): it ran out of memory`
          : 'its init process is gone (killed from outside, or the host rebooted)',
    };
  }

  async destroy(handle: MachineHandle, opts: { halt?: boolean } = {}): Promise<void> {
    await this.prepared.get(handle.id)?.catch(handledElsewhere);
    this.prepared.delete(handle.id);
    // a halt only where the files stay (a stop): an rm's would cost ~0.2 s and save nothing
    if (opts.halt && handle.init === 'systemd') await haltSystem(handle);
    await killAndSweep(this.home, handle);
  }

  /** Cgroups and run directories of machines that are not live (drivers/teardown.ts, shared with the VM driver). */
  async gc(live: LiveObjects): Promise<string[]> {
    return gcMachines(this.home, (id) => live.sandbox(id));
  }

  /** A namespace machine uses the image volume's tree itself: nothing is derived from it. */
  async forgetImage(_volumeId: string): Promise<void> {}
}

/** SIGRTMIN+3: systemd's "halt" (systemd(1), SIGNALS). */
const SIGRTMIN_3 = 37;
/** A system machine's systemd halts in ~0.25 s here; past this it is killed like any other. */
export const HALT_GRACE_MS = 10_000;

/** Ask a system machine's systemd to halt (services stopped, filesystems synced), and wait for it. */
async function haltSystem(handle: MachineHandle): Promise<void> {
  // signalled only when known to be this machine's init (a pid not read may have been reused)
  if ((await liveness(handle.pid, handle.pidStart)).state !== 'alive') return;
  // a paused machine cannot halt: thawed first (it is going anyway)
  const cg = cgroupFor(handle.id);
  if (await isFrozen(cg).catch(failureMeans(false))) await thaw(cg).catch(noted(`thaw ${cg.id}`, 'ENOENT'));
  try {
    process.kill(handle.pid, SIGRTMIN_3);
  } catch {
    return;
  }
  await waitGone(handle.pid, HALT_GRACE_MS);
}

export function deadError(name: string, reason: string | undefined): SnaplabError {
  return new SnaplabError(
    'SANDBOX_DEAD',
    `sandbox ${name} has died: ${reason ?? 'cause unknown'}`,
    `remove it with \`snaplab rm ${name}\` and create a new one`,
  );
}
