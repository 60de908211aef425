import { existsSync, readFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { listMountsSync } from '../mounts.js';
import { SCOPE_PATH, systemdManagesCgroups } from './scope.js';

/** The controllers snaplab uses; v1 mounts each (or a few together) as its own hierarchy. */
export const USED_CONTROLLERS = ['memory', 'pids', 'cpu', 'cpuacct', 'freezer'] as const;
export type Controller = (typeof USED_CONTROLLERS)[number];

const V1_CONTROLLERS = new Set([
  'cpu',
  'cpuacct',
  'cpuset',
  'memory',
  'devices',
  'freezer',
  'net_cls',
  'net_prio',
  'blkio',
  'perf_event',
  'hugetlb',
  'pids',
  'rdma',
  'misc',
]);

export const DEFAULT_ROOT = '/sys/fs/cgroup';

export interface CgroupLayout {
  version: 1 | 2;
  /** v2: the cgroup2 mount (or the directory passed); v1: the directory holding the hierarchies */
  root: string;
  /**
   * v2: the directory that holds snaplab/: the root, or on a host whose PID 1 is systemd the
   * delegated scope snaplab.scope (scope.ts). v1: the root.
   */
  base: string;
  /** v1: every mounted controller; v2: the controllers the root offers its children */
  controllers: string[];
  /** v1: the mount point of the hierarchy that carries each controller */
  hierarchies: Partial<Record<string, string>>;
  /** v1 hybrid hosts: the cgroup2 mount beside the v1 hierarchies (no controllers, usually) */
  unified?: string;
  /** v1: named hierarchies without controllers (name=systemd), by name */
  named?: Record<string, string>;
}

const cache = new Map<string, CgroupLayout>();

/**
 * Which cgroup version rules `root` (default /sys/fs/cgroup) and what it offers. A root holding
 * cgroup.controllers is cgroup2 (pure v2 hosts, or the unified mount of a hybrid host passed
 * explicitly); otherwise the v1 hierarchies mounted below it are read from mountinfo. Cached:
 * mounts of cgroup hierarchies do not change while snaplab runs.
 */
export function detectCgroups(root: string = DEFAULT_ROOT): CgroupLayout {
  const abs = resolve(root);
  const hit = cache.get(abs);
  if (hit) return hit;
  const layout = existsSync(`${abs}/cgroup.controllers`) ? detectV2(abs) : detectV1(abs);
  cache.set(abs, layout);
  return layout;
}

function detectV2(root: string): CgroupLayout {
  const text = readFileSync(`${root}/cgroup.controllers`, 'utf8').trim();
  const base = root === DEFAULT_ROOT && systemdManagesCgroups() ? `${root}${SCOPE_PATH}` : root;
  return { version: 2, root, base, controllers: text ? text.split(/\s+/) : [], hierarchies: {} };
}

function detectV1(root: string): CgroupLayout {
  const hierarchies: Partial<Record<string, string>> = {};
  const named: Record<string, string> = {};
  let unified: string | undefined;
  for (const m of listMountsSync()) {
    if (dirname(m.target) !== root) continue;
    if (m.fstype === 'cgroup2') unified = m.target;
    if (m.fstype !== 'cgroup') continue;
    for (const opt of m.superOptions.split(',')) {
      // a hierarchy may be mounted twice (bind mounts); the first wins
      if (V1_CONTROLLERS.has(opt)) hierarchies[opt] ??= m.target;
      else if (opt.startsWith('name=')) named[opt.slice(5)] ??= m.target;
    }
  }
  const layout: CgroupLayout = {
    version: 1,
    root,
    base: root,
    controllers: Object.keys(hierarchies).sort(),
    hierarchies,
  };
  if (unified) layout.unified = unified;
  if (Object.keys(named).length) layout.named = named;
  return layout;
}

/** Forget cached layouts (tests; after mounting a hierarchy). */
export function forgetCgroupLayouts(): void {
  cache.clear();
}
