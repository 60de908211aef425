import { readFileSync } from 'node:fs';
import { release } from 'node:os';

/**
 * What every memory cgroup on a host holds for the host's superblocks (docs/architecture.md
 * "Density"). The kernel gives each memory cgroup, at its mkdir, a map with a slot for every
 * memcg-aware shrinker id, one map per NUMA node (`alloc_shrinker_info`). Every superblock has such
 * a shrinker, and the ids are handed out up to a high-water mark that never comes down until a
 * reboot. So a sandbox, which has a memory cgroup of its own, pays for every superblock the host
 * has held at its peak, its own and every other sandbox's: quadratic in the count over a host.
 */

/**
 * The superblocks a namespace sandbox holds of its own: its proc, its /dev tmpfs (/dev/shm, /run
 * and the /proc masks are in it), its devpts, and its IPC namespace's mqueue instance (the kernel
 * makes one with every IPC namespace, mounted or not). The overlay storage backend adds one (the
 * sandbox's overlay mount); btrfs and dir add none. A create in flight holds three more for a
 * moment (the launcher's staging tmpfs and private proc, bwrap's own base tmpfs).
 */
export const SANDBOX_SUPERBLOCKS = 4;

/**
 * Memcg-aware shrinkers no mount table shows: the kernel's own superblocks, mounted nowhere
 * (sockfs, pipefs, nsfs, anon_inodefs, bdev, …) and the shrinkers that are not superblocks'
 * (workingset, huge pages). An allowance, not a count: ~20–30 on a Debian kernel.
 */
export const KERNEL_SHRINKERS = 32;

/** Distinct superblocks in a mount table: mountinfo's major:minor, one per superblock. */
export function superblocksMounted(text = readFileSync('/proc/self/mountinfo', 'utf8')): number {
  const devs = new Set<string>();
  for (const line of text.split('\n')) {
    const dev = line.split(' ')[2];
    if (dev?.includes(':')) devs.add(dev);
  }
  return devs.size;
}

/** The NUMA nodes the kernel may have ("0", "0-3,6"): a memory cgroup has a map for each. */
export function possibleNodes(text?: string): number {
  let t = text;
  if (t === undefined)
    try {
      t = readFileSync('/sys/devices/system/node/possible', 'utf8');
    } catch {
      return 1; // no NUMA support in the kernel: one node
    }
  let count = 0;
  for (const part of t.trim().split(',')) {
    const [a, b] = part.split('-').map(Number);
    if (a !== undefined && Number.isFinite(a)) count += b !== undefined && Number.isFinite(b) ? b - a + 1 : 1;
  }
  return Math.max(1, count);
}

const pow2 = (bytes: number): number => 2 ** Math.ceil(Math.log2(Math.max(8, bytes)));

/**
 * Bytes one memory cgroup holds for `ids` shrinker ids. From Linux 6.7 (mm/shrinker.c) the map is
 * cut in units of 64 ids, each 64 counters and a 64-bit map (520 bytes, a kmalloc-1k object) and a
 * pointer to it: ~16 bytes an id a node. Before, one allocation a node of a counter (8 bytes) and a
 * bit an id, rounded up to a power of two by the allocator.
 */
export function shrinkerMapBytes(ids: number, nodes: number, kernel = release()): number {
  const [major = 0, minor = 0] = kernel.split('.').map((x) => Number.parseInt(x, 10));
  const units = Math.ceil(ids / 64);
  const perNode = major > 6 || (major === 6 && minor >= 7) ? 24 + units * (8 + 1024) : pow2(40 + ids * 8 + units * 8);
  return nodes * perNode;
}

/** What the estimate reads of this host. */
export interface ShrinkerHost {
  /** superblocks in the host's mount table (superblocksMounted) */
  mounted: number;
  nodes: number;
  kernel: string;
}

export function shrinkerHost(): ShrinkerHost {
  return { mounted: superblocksMounted(), nodes: possibleNodes(), kernel: release() };
}

/**
 * Shrinker ids on a host holding `count` sandboxes: what its mount table shows, the kernel's own,
 * and each sandbox's. A floor: other mount namespaces (services' private /tmp, containers) are
 * not counted, and a host that held more since it booted keeps its higher mark (the kernel shows
 * no count of shrinker ids, nor their mark: without CONFIG_SHRINKER_DEBUG nothing lists them).
 */
export function shrinkerIdsAt(host: ShrinkerHost, count: number): number {
  return host.mounted + KERNEL_SHRINKERS + SANDBOX_SUPERBLOCKS * count;
}

/** Bytes of shrinker maps each sandbox's memory cgroup holds on a host holding `count` sandboxes. */
export function shrinkerBytesAt(host: ShrinkerHost, count: number): number {
  return shrinkerMapBytes(shrinkerIdsAt(host, count), host.nodes, host.kernel);
}
