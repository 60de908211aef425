import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { detectCgroups } from './detect.js';
import { destroyCgroup } from './destroy.js';
import type { Cgroup } from './types.js';
import { sameProcess } from '../procs.js';
import { orElse } from '../../cleanup.js';

/*
 * The cgroups of `snaplab bench`'s systemd-nspawn baseline (src/bench/nspawn-baseline.ts): one
 * directory per run in each hierarchy systemd uses, named by the bench's pid and start time, so
 * that gc can remove what a killed bench left, and only that.
 */

/** each run's directories: this prefix, then PID-STARTTIME-N of the bench that made them */
export const NSPAWN_CGROUP_PREFIX = 'snaplab-bench-nspawn-';

/**
 * The cgroup an nspawn run gets: a directory in each hierarchy systemd uses, name=systemd and the
 * unified mount on a v1 hybrid host, the cgroup2 root on a v2 one. systemd-nspawn without
 * machined (`--register=no --keep-unit`) makes its payload and supervisor cgroups under the
 * cgroup it was started in, and left them at the top of the host's hierarchies when started at
 * the root (issue #13): each run starts in a cgroup of its own, destroyed after (destroyCgroup,
 * as a machine's is).
 */
export function nspawnCgroup(name: string): Cgroup {
  const layout = detectCgroups();
  const dirs =
    layout.version === 2 ? [join(layout.root, name)] : layout.named?.systemd ? [join(layout.named.systemd, name)] : [];
  const unified = layout.version === 1 && layout.unified ? join(layout.unified, name) : undefined;
  return {
    id: name,
    version: layout.version,
    root: layout.root,
    dirs,
    controllerDirs: {},
    skipped: [],
    procsFiles: [...dirs, ...(unified ? [unified] : [])].map((d) => join(d, 'cgroup.procs')),
    ...(unified ? { unifiedDir: unified } : {}),
  };
}

/** Every directory of a run's cgroup (what the shell that starts nspawn joins). */
export const nspawnCgroupDirs = (name: string): string[] =>
  nspawnCgroup(name).procsFiles.map((f) => f.slice(0, -'/cgroup.procs'.length));

/** A run's directory name, and whose it is: the bench process (pid and start time). */
export const nspawnRunName = (pid: number, start: number, n: number): string =>
  `${NSPAWN_CGROUP_PREFIX}${pid}-${start}-${n}`;
function ownerOf(name: string): { pid: number; start: number } | undefined {
  const m = /^(\d+)-(\d+)-\d+$/.exec(name.slice(NSPAWN_CGROUP_PREFIX.length));
  return m ? { pid: Number(m[1]), start: Number(m[2]) } : undefined;
}

/**
 * Leftovers of a bench that was killed mid-run: its nspawn cgroups (and any process in them).
 * Only directories of this exact name form whose bench process is gone; a bench in another pid
 * namespace is not told apart from a dead one (benches run where snaplab runs).
 */
export async function sweepNspawnCgroups(): Promise<string[]> {
  const removed: string[] = [];
  const seen = new Set<string>();
  for (const parent of nspawnCgroupDirs('')) {
    for (const e of await readdir(parent).catch(orElse([] as string[], 'readdir', 'ENOENT'))) {
      if (!e.startsWith(NSPAWN_CGROUP_PREFIX) || seen.has(e)) continue;
      seen.add(e);
      const owner = ownerOf(e);
      if (!owner || (await sameProcess(owner.pid, owner.start))) continue; // not ours to judge, or a bench that runs
      const cg = nspawnCgroup(e);
      if (
        await destroyCgroup(cg, 5000).then(
          () => true,
          () => false,
        )
      )
        removed.push(...nspawnCgroupDirs(e).map((d) => `cgroup ${d}`));
    }
  }
  return removed;
}
