import type { Controller } from './detect.js';

export interface CgroupLimits {
  /** hard memory limit; swap is limited to nothing beyond it, so a hog is OOM-killed, not swapped */
  memoryBytes?: number;
  /** most processes (and threads) at once */
  pids?: number;
  /** CPU time as cores; fractional is fine (0.5 = half of one core) */
  cpus?: number;
}

/** One sandbox's cgroup: on v1 a directory in each hierarchy, on v2 a single directory. */
export interface Cgroup {
  id: string;
  version: 1 | 2;
  /** the cgroup root it was derived from (see detectCgroups) */
  root: string;
  /** every directory of this cgroup (v1: one per hierarchy; v2: one) */
  dirs: string[];
  /** cgroup.procs of every dir; the launcher writes its pid to each before it execs */
  procsFiles: string[];
  /** the directory whose files belong to each controller, when that controller is available */
  controllerDirs: Partial<Record<Controller, string>>;
  /** limits asked for but not applied, each with its reason (filled by createCgroup) */
  skipped: string[];
  /**
   * v1 hybrid hosts: the machine's directory in the unified cgroup2 mount. Made (and handed to
   * the machine's root) only for a system machine, whose systemd manages a cgroup2 subtree of its
   * own; teardown always looks there.
   */
  unifiedDir?: string;
  /**
   * v1: the machine's directories in the hierarchies snaplab sets no limits in (cpuset, devices,
   * blkio, name=systemd, ...). Joined only by system machines, whose root can mount cgroup
   * hierarchies: its cgroup namespace is then rooted at its own directory there too, not at the
   * host's root. Teardown always looks there.
   */
  otherDirs?: string[];
}

/** One file write in a cgroup directory; `optional` ones are skipped with a reason on ENOENT. */
export interface CgroupWrite {
  file: string;
  value: string;
  optional?: string;
  /** written instead when an optional file is missing */
  fallback?: CgroupWrite;
}

/** What createCgroup does: the writes into each directory, in order, and what it cannot do. */
export interface CgroupPlan {
  writes: Map<string, CgroupWrite[]>;
  skipped: string[];
}

/** What a cgroup counts now (each absent where its controller is not there). */
export interface CgroupStats {
  /** memory charged to it, page cache included */
  memoryBytes?: number;
  /** of that, the page cache (v2 memory.stat `file`, v1 `total_cache`) */
  cacheBytes?: number;
  pids?: number;
  cpuUsec?: number;
}
