import { readFile, readdir, rmdir } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { join } from 'node:path';
import { detectCgroups } from './cgroups-detect.js';
import { sameProcess } from './procs.js';

/*
 * The cgroups of `snaplab bench`'s systemd-nspawn baseline (src/bench/nspawn-baseline.ts): one
 * directory per run in each hierarchy systemd uses, named by the bench's pid and start time, so
 * that gc can remove what a killed bench left, and only that.
 */

/** each run's directories: this prefix, then PID-STARTTIME-N of the bench that made them */
export const NSPAWN_CGROUP_PREFIX = 'snaplab-bench-nspawn-';

/**
 * The directories an nspawn run gets, one per hierarchy systemd uses: name=systemd and the unified
 * mount on a v1 hybrid host, the cgroup2 root on a v2 one. systemd-nspawn without machined
 * (`--register=no --keep-unit`) makes its payload and supervisor cgroups under the cgroup it was
 * started in, and left them at the top of the host's hierarchies when started at the root
 * (issue #13): each run starts in a directory of its own, removed after.
 */
export function nspawnCgroupDirs(name: string): string[] {
  const layout = detectCgroups();
  if (layout.version === 2) return [join(layout.root, name)];
  return [layout.named?.systemd, layout.unified].filter((d): d is string => d !== undefined).map((d) => join(d, name));
}

/** SIGKILL every process in a cgroup directory and those below it. */
export async function killTree(dir: string): Promise<void> {
  const procs = (await readFile(join(dir, 'cgroup.procs'), 'utf8').catch(() => '')).split('\n').filter(Boolean).map(Number);
  for (const p of procs) {
    try {
      process.kill(p, 'SIGKILL');
    } catch {
      /* gone */
    }
  }
  for (const k of await readdir(dir, { withFileTypes: true }).catch(() => [])) if (k.isDirectory()) await killTree(join(dir, k.name));
}

/** Kill what is left in a cgroup directory and remove it with those below it; false if it stays. */
export async function removeTree(dir: string): Promise<boolean> {
  await killTree(dir);
  const kids = await readdir(dir, { withFileTypes: true }).catch(() => []);
  for (const k of kids) if (k.isDirectory()) await removeTree(join(dir, k.name));
  for (let i = 0; i < 100; i++) {
    try {
      await rmdir(dir);
      return true;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') return true;
      await sleep(20); // its last processes are still leaving
    }
  }
  return false;
}

/** A run's directory name, and whose it is: the bench process (pid and start time). */
export const nspawnRunName = (pid: number, start: number, n: number): string => `${NSPAWN_CGROUP_PREFIX}${pid}-${start}-${n}`;
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
  for (const parent of nspawnCgroupDirs('')) {
    for (const e of await readdir(parent).catch(() => [] as string[])) {
      if (!e.startsWith(NSPAWN_CGROUP_PREFIX)) continue;
      const owner = ownerOf(e);
      if (!owner || (await sameProcess(owner.pid, owner.start))) continue; // not ours to judge, or a bench that runs
      if (await removeTree(join(parent, e))) removed.push(`cgroup ${join(parent, e)}`);
    }
  }
  return removed;
}
