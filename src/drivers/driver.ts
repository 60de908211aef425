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
   * machine's veth on that network, and the address (CIDR) and MAC the guest gives its NIC; or
   * (a VM with egress) the tap of its link out, with the gateway its default route goes through
   */
  nics?: { tap: string; mac: string; address: string; gateway?: string }[];
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
  /**
   * a machine's agent connection is the agent's own, so one exec's output can be held there
   * (HOLD_OUTPUT, 1.2) while the connection's others go on; a VM's is its relay's, which routes a
   * client's hold only from 1.7 (an older relay, of a VM raised before an upgrade, says 1.6)
   */
  execHold?: boolean;
  /** `snapshotMemory` and `restoreMemory` exist: a snapshot can hold the running machine, and a restore continues it */
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
  /**
   * the machine's clock stands still while it is paused (a guest kernel's own clock): the lab sets
   * it from the host's after a resume, a memory restore or a memory snapshot. A namespace machine
   * reads the host's clock, which never stops.
   */
  clockStopsWhilePaused: boolean;
  /**
   * without a user namespace, root inside the machine is root on the host (the machine is a set of
   * namespaces on the host's kernel): a system machine's systemd (CAP_SYS_ADMIN) is refused there,
   * and `ls` warns. A VM's root is its guest's.
   */
  hostRootWithoutUserns: boolean;
  /**
   * the machine's root filesystem is the volume's tree itself, so storage's disk cap holds on what
   * it writes (a VM writes a disk image kept in the volume, which the cap does not see yet), and
   * the host can read its files in place
   */
  rootIsVolumeTree: boolean;
  /**
   * the handle's pid is the init of the machine's namespaces: `nsenter -t PID` reaches inside (a
   * VM's is QEMU, a host process)
   */
  pidIsMachineInit: boolean;
  /**
   * the machine runs a kernel of its own (a VM): its network stack is its guest's (a scenario gives
   * it taps, MachineSpec.nics, in its network namespace, and the host's view of that namespace holds
   * none of its addresses), and a start is a boot, which costs seconds of CPU under emulation
   */
  ownKernel: boolean;
}

/**
 * What is known of a driver without a host or a machine (src/drivers/registry.ts answers it by
 * name): capabilities, defaults and where a machine's console log is.
 */
export interface DriverInfo {
  readonly name: string;
  readonly capabilities: DriverCapabilities;
  /**
   * memory a machine gets unless told (`defaultBytes`; none: the lab's own default) and the least it
   * runs in (`minBytes`; none: no floor), in bytes
   */
  readonly memory: { defaultBytes?: number; minBytes?: number };
  /** the CPUs a machine without a CPU limit has (none: the host's) */
  readonly defaultCpus?: number;
  /** the machine's console, a file in its run directory (`<home>/run/<id>/`) */
  readonly consoleLog: string;
  /** what one machine is called in messages ("a VM") */
  readonly machineNoun: string;
}

/** What `prepareHost` fetched and built (a VM's guest kernel and initramfs). */
export interface PreparedHost {
  version: string;
  kernel: string;
  initramfs: string;
}

/**
 * What gc may not remove, asked when an object is about to go (a create may have begun since gc
 * started): a sandbox by id, an image volume by id.
 */
export interface LiveObjects {
  sandbox(id: string): boolean;
  imageVolume(id: string): boolean;
}

/** Why a machine is no longer there, as far as the host can tell. */
/**
 * What a driver can say of a machine: alive; dead, only on evidence (its init or QEMU process is
 * gone); or unknown, when the host could not be read (EMFILE, EACCES): then it may still run, and
 * nothing of it may be removed. Callers retry later and report why they cannot tell.
 */
export type DeathReport = { state: 'alive' } | { state: 'dead'; reason: string } | { state: 'unknown'; reason: string };

/**
 * The driver contract (DESIGN.md). `raise` returns once the agent inside answers; the lab then
 * runs a first command before it calls the machine created (principle 1).
 */
export interface Driver extends DriverInfo {
  probe(): Promise<Availability>;
  /**
   * Fetch and build ahead of time what every machine of this driver needs, so that nothing is
   * downloaded at run time (`snaplab setup`). Drivers that need nothing have none.
   */
  prepareHost?(onProgress?: (s: string) => void): Promise<PreparedHost>;
  /**
   * Make the host objects that do not need the root filesystem (cgroup, run directory), so that
   * the lab can do it while storage clones. `raise` does it itself when it was not called.
   */
  prepare(spec: Omit<MachineSpec, 'rootfs'>, trace: Trace): Promise<void>;
  /**
   * A running machine on `spec.rootfs`. An abort of `signal` rejects with its reason, at the latest
   * once the step under way ends (a VM's boot wait ends at once), and leaves nothing of the machine
   * behind but what `prepare` made, which `destroy` removes.
   */
  raise(spec: MachineSpec, trace: Trace, signal?: AbortSignal): Promise<RaisedMachine>;
  connect(handle: MachineHandle, timeoutMs?: number): Promise<AgentClient>;
  /** Stop every process of the machine from running (its memory stays). */
  pause(handle: MachineHandle): Promise<void>;
  resume(handle: MachineHandle): Promise<void>;
  /** Is the machine alive, and if not, why (OOM, killed)? Never throws. */
  inspect(handle: MachineHandle): Promise<DeathReport>;
  /**
   * Kill every process and release host objects other than storage. Idempotent. `halt` (a stop,
   * whose files a later start boots again): a system machine's init is asked to halt first (its
   * services stopped, its writes synced). Without, it is killed outright: an rm (the files go), a
   * failed or interrupted start (a machine at most half booted, whose systemd may never halt).
   */
  destroy(handle: MachineHandle, opts?: { halt?: boolean }): Promise<void>;
  /**
   * Host objects and files this driver made that nothing live owns (a machine's cgroup and run
   * directory, a VM's RAM file, a base disk of an image volume that is gone); remove them, describe
   * each.
   */
  gc(live: LiveObjects): Promise<string[]>;
  /** An image volume is being removed: drop what this driver derived from it (a VM's base disk). Idempotent. */
  forgetImage(volumeId: string): Promise<void>;
  /**
   * (capabilities.memorySnapshot) write the whole machine state to `dir`. The lab pauses the
   * machine first and snapshots its volume while it is paused, so memory and disk agree.
   */
  snapshotMemory?(handle: MachineHandle, dir: string, trace: Trace): Promise<MemoryImage>;
  /**
   * (capabilities.memorySnapshot) a new machine continuing from a memory snapshot, on `rootfs`
   * cloned from the snapshot's volume, on the host's clock and with an identity of its own
   * (`spec.hostname`, a new machine id, its random pool reseeded): several restores of one
   * snapshot run side by side
   */
  restoreMemory?(spec: MachineSpec, image: MemoryImage, trace: Trace): Promise<RaisedMachine>;
}

export interface MemoryImage {
  /** directory holding the machine state */
  dir: string;
  bytes: number;
}

/** Where every machine, whatever its driver, has the agent's binary (read-only): the first exec runs it. */
export const MACHINE_AGENT_PATH = '/run/snaplab/agent';
