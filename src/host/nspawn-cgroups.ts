import { existsSync } from 'node:fs';
import { readFile, readdir, rmdir } from 'node:fs/promises';
import { join } from 'node:path';
import { detectCgroups } from './cgroups-detect.js';

/*
 * The cgroups of `snaplab bench`'s systemd-nspawn baseline (src/bench/nspawn-baseline.ts): one
 * directory per run in each hierarchy systemd uses, named by the bench's pid, so that gc can
 * remove what a killed bench left.
 */
/** each run's directories, by this prefix and the bench's pid (nothing else of the host's is touched) */
export const NSPAWN_CGROUP_PREFIX = 'snaplab-bench-nspawn-';

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

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

/** Remove a cgroup directory and those below it, waiting briefly for processes leaving. */
export async function removeTree(dir: string): Promise<void> {
  const kids = await readdir(dir, { withFileTypes: true }).catch(() => []);
  for (const k of kids) if (k.isDirectory()) await removeTree(join(dir, k.name));
  for (let i = 0; i < 50; i++) {
    try {
      await rmdir(dir);
      return;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') return;
      await sleep(20); // its last processes are still leaving
    }
  }
}

/** Leftovers of a bench that was killed mid-run: its nspawn cgroups (and any process in them). */
export async function sweepNspawnCgroups(): Promise<string[]> {
  const removed: string[] = [];
  for (const parent of nspawnCgroupDirs('')) {
    for (const e of await readdir(parent).catch(() => [] as string[])) {
      if (!e.startsWith(NSPAWN_CGROUP_PREFIX)) continue;
      const pid = Number(e.slice(NSPAWN_CGROUP_PREFIX.length).split('-')[0]);
      if (pid && existsSync(`/proc/${pid}`)) continue; // a bench that runs
      await killTree(join(parent, e));
      await removeTree(join(parent, e));
      removed.push(`cgroup ${join(parent, e)}`);
    }
  }
  return removed;
}

async function killTree(dir: string): Promise<void> {
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
