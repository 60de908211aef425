import type { Availability } from '../host/probe-types.js';
import type { AgentClient } from '../agent/client.js';
import type { Limits } from '../store/records.js';
import type { Trace } from '../timing/trace.js';

export interface MachineSpec {
  id: string;
  hostname: string;
  limits: Limits;
  /** directory that becomes the machine's root filesystem (a VM keeps its disk in it) */
  rootfs: string;
  /**
   * the volume `rootfs` was cloned from: an image's (`image`: a VM makes its base disk from it), or
   * a snapshot's (a VM's holds the VM's disk)
   */
  source?: { id: string; path: string; image: boolean };
  /** join this existing network namespace (a path, e.g. /run/netns/snaplab-…) instead of a new loopback-only one */
  netns?: string;
  /**
   * (a VM in a scenario) its interfaces: each a tap in `netns`, made by `up` and bridged to the
   * machine's veth on that network, and the address (CIDR) and MAC the guest gives its NIC
   */
  nics?: { tap: string; mac: string; address: string }[];
  /** run in a user namespace of its own: ids 0..count-1 inside are base.. on the host */
  userns?: { base: number; count: number };
  /** 'systemd': a system machine, the image's own init is PID 1 and the agent runs beside it */
  init?: 'systemd';
  /** (overlay, in a user namespace) the root filesystem is this overlay, mounted inside: `rootfs` is not mounted on the host */
  stack?: { lowers: string[]; upper: string; work: string };
}

/** What a driver needs, persisted in the sandbox record, to find its machine again later. */
export interface MachineHandle {
  id: string;
  /** host pid of the machine's init (the agent for namespaces, QEMU for VMs) */
  pid: number;
  /** start time of `pid` (jiffies since boot) so that a reused pid is not mistaken for it */
  pidStart: number;
  /** a system machine: its init is halted cleanly before the machine is killed */
  init?: 'systemd';
}

export interface RaisedMachine {
  handle: MachineHandle;
  agent: AgentClient;
}

export interface DriverCapabilities {
  pause: boolean;
  memorySnapshot: boolean;
  /**
   * the guest caches its own writes (a VM's kernel): before a filesystem snapshot the lab has the
   * agent `sync`, and pausing alone does not make the disk whole
   */
  guestCache: boolean;
  /**
   * pool standbys are paused while they wait: an idle machine would still cost CPU (a guest
   * kernel's timers). Without it a standby simply waits, its agent blocked in epoll, and takes and
   * returns skip the freeze and thaw (5.5 ms of every execution, measured)
   */
  pauseStandbys: boolean;
  /**
   * machines can run in a user namespace of their own (MachineSpec.userns): root inside is an
   * unprivileged range of host ids. VMs need none: QEMU runs as a uid of its own
   */
  userns: boolean;
}

/** Why a machine is no longer there, as far as the host can tell. */
export interface DeathReport {
  alive: boolean;
  reason?: string;
}

/**
 * The driver contract (DESIGN.md). `raise` returns once the agent inside answers; the lab then
 * runs a first command before it calls the machine created (principle 1).
 */
export interface Driver {
  readonly name: string;
  readonly capabilities: DriverCapabilities;
  probe(): Promise<Availability>;
  /**
   * Make the host objects that do not need the root filesystem (cgroup, run directory), so that
   * the lab can do it while storage clones. `raise` does it itself when it was not called.
   */
  prepare(spec: Omit<MachineSpec, 'rootfs'>, trace: Trace): Promise<void>;
  raise(spec: MachineSpec, trace: Trace, signal?: AbortSignal): Promise<RaisedMachine>;
  connect(handle: MachineHandle, timeoutMs?: number): Promise<AgentClient>;
  /** Stop every process of the machine from running (its memory stays). */
  pause(handle: MachineHandle): Promise<void>;
  resume(handle: MachineHandle): Promise<void>;
  /** Is the machine alive, and if not, why (OOM, killed)? Never throws. */
  inspect(handle: MachineHandle): Promise<DeathReport>;
  /** Kill every process and release host objects other than storage. Idempotent. */
  destroy(handle: MachineHandle): Promise<void>;
  /**
   * Host objects this driver made whose ids are not live; remove them, describe each. `isLive`
   * is asked when an object is about to go (a create may have begun since gc started).
   */
  gc(isLive: (id: string) => boolean): Promise<string[]>;
  /**
   * (capabilities.memorySnapshot) write the whole machine state to `dir`. The lab pauses the
   * machine first and snapshots its volume while it is paused, so memory and disk agree.
   */
  snapshotMemory?(handle: MachineHandle, dir: string, trace: Trace): Promise<MemoryImage>;
  /** (capabilities.memorySnapshot) a new machine continuing from a memory snapshot, on `rootfs` cloned from the snapshot's volume */
  restoreMemory?(spec: MachineSpec, image: MemoryImage, trace: Trace): Promise<RaisedMachine>;
}

export interface MemoryImage {
  /** directory holding the machine state */
  dir: string;
  bytes: number;
}

/** Where every machine, whatever its driver, has the agent's binary (read-only): the first exec runs it. */
export const MACHINE_AGENT_PATH = '/run/snaplab/agent';
