import { existsSync } from 'node:fs';
import { SnaplabError } from '../../errors.js';
import { DEFAULT_ROOT, detectCgroups, USED_CONTROLLERS, type Controller } from './detect.js';
import type { Cgroup } from './types.js';
import * as v2 from './v2.js';

/** Every snaplab cgroup sits below a parent of this name (principle 6: host objects are labelled). */
export const PARENT = 'snaplab';
const ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;

export interface CgroupOptions {
  /** cgroup root: default /sys/fs/cgroup; a cgroup2 mount (e.g. /sys/fs/cgroup/unified) for v2 */
  root?: string;
}

/** The paths of sandbox `id`'s cgroup. No I/O beyond the (cached) detection. */
export function cgroupFor(id: string, opts: CgroupOptions = {}): Cgroup {
  if (!ID.test(id)) {
    throw new SnaplabError(
      'BAD_NAME',
      `bad cgroup id ${JSON.stringify(id)}`,
      'use letters, digits, ".", "_" and "-" (at most 128)',
    );
  }
  const layout = detectCgroups(opts.root ?? DEFAULT_ROOT);
  const controllerDirs: Partial<Record<Controller, string>> = {};
  const dirs: string[] = [];
  // a sandbox made before snaplab moved into its systemd scope keeps its cgroup under the root
  const base = layout.base !== layout.root && existsSync(`${layout.root}/${PARENT}/${id}`) ? layout.root : layout.base;
  if (layout.version === 2) {
    const dir = `${base}/${PARENT}/${id}`;
    dirs.push(dir);
    for (const c of v2.V2_LIMIT_CONTROLLERS) if (layout.controllers.includes(c)) controllerDirs[c] = dir;
    controllerDirs.freezer = dir; // cgroup.freeze is core in v2
  } else {
    for (const c of ['memory', 'pids', 'cpu', 'cpuacct', 'freezer'] as const) {
      const mount = layout.hierarchies[c];
      if (!mount) continue;
      const dir = `${mount}/${PARENT}/${id}`;
      controllerDirs[c] = dir;
      if (!dirs.includes(dir)) dirs.push(dir); // cpu,cpuacct may share one hierarchy
    }
  }
  return {
    id,
    version: layout.version,
    root: base,
    dirs,
    procsFiles: dirs.map((d) => `${d}/cgroup.procs`),
    controllerDirs,
    skipped: [],
    ...(layout.version === 1 && layout.unified ? { unifiedDir: `${layout.unified}/${PARENT}/${id}` } : {}),
    ...(layout.version === 1 ? { otherDirs: otherHierarchies(layout).map((m) => `${m}/${PARENT}/${id}`) } : {}),
  };
}

const others = new WeakMap<ReturnType<typeof detectCgroups>, string[]>();

/** v1 hierarchies snaplab sets no limits in: every mounted one but those of the controllers it uses (once per layout). */
function otherHierarchies(layout: ReturnType<typeof detectCgroups>): string[] {
  let found = others.get(layout);
  if (!found) {
    const used = new Set(USED_CONTROLLERS.map((c) => layout.hierarchies[c]).filter(Boolean));
    const all = new Set(
      [...Object.values(layout.hierarchies), ...Object.values(layout.named ?? {})].filter((m): m is string => !!m),
    );
    others.set(layout, (found = [...all].filter((m) => !used.has(m)).sort()));
  }
  return found;
}
