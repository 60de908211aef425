/** What a VM is started with: the launcher builds QEMU's command line from it, the jail its mounts. */
export interface VmConfig {
  accel: 'kvm' | 'tcg';
  machine: 'pc';
  memoryMb: number;
  cpus: number;
  kernel: string;
  initrd: string;
  /** the root disk: a qcow2 overlay (ROOT_DEVICE in the guest) */
  disk: string;
  /** its backing file, a base disk: pinned on the command line, never taken from the overlay */
  diskBase: string;
  append: string;
  /**
   * guest RAM in a file: `share` (a booted VM: a tmpfs file of its own, which a memory snapshot
   * copies instead of streaming), or mapped copy-on-write from a snapshot's RAM file (a restore:
   * its pages are read on demand and shared, in the page cache, by every restore of it).
   * Absent: anonymous RAM, which a memory snapshot streams.
   */
  ram?: { path: string; share: boolean };
  /**
   * guest RAM is the memory backend `ram0` (a file per `ram`, else anonymous), so that a VM with
   * file RAM, its restores and their snapshots all name their RAM block alike. Absent in configs
   * written before RAM files (their streams name the block `pc.ram`): those keep plain `-M pc`.
   */
  memoryBackend?: boolean;
  /**
   * a scenario machine's network: QEMU runs in the machine's network namespace (made by `up`)
   * and opens each tap there, one virtio NIC per tap with the machine's MAC on that network
   */
  net?: VmNet;
}

export interface VmNet {
  /** the namespace's path, /run/netns/snaplab-… */
  netns: string;
  nics: { tap: string; mac: string }[];
}
