import { readdir, rmdir } from 'node:fs/promises';
import type { Dirent } from 'node:fs';
import type { Cgroup } from './types.js';
import { cgError, errno, poll, readText } from './fs.js';
import * as v1 from './v1.js';
import * as v2 from './v2.js';
import { isFrozen, thaw } from './freezer.js';
import { signal } from '../procs.js';
import { noted } from '../../cleanup.js';

/** Finding a cgroup's processes and tearing it down, on v1 and v2. */

/** The cgroup's own directories, the unified one of a system machine (hybrid hosts) included. */
const tops = (cg: Cgroup): string[] => [...cg.dirs, ...(cg.unifiedDir ? [cg.unifiedDir] : []), ...(cg.otherDirs ?? [])];

/** Every directory of the cgroup and of cgroups nested in it (a sandbox may make its own). */
async function allDirs(cg: Cgroup): Promise<string[]> {
  const out: string[] = [];
  const walk = async (dir: string): Promise<void> => {
    let entries: Dirent[];
    try {
      entries = await readdir(dir, { withFileTypes: true });
    } catch (e) {
      if (errno(e) === 'ENOENT') return;
      throw cgError(`cannot list ${dir}`, e);
    }
    out.push(dir);
    await Promise.all(entries.filter((d) => d.isDirectory()).map((d) => walk(`${dir}/${d.name}`)));
  };
  await Promise.all(tops(cg).map(walk));
  return out;
}

async function pidsIn(dirs: string[]): Promise<number[]> {
  const texts = await Promise.all(dirs.map((d) => readText(`${d}/cgroup.procs`)));
  const set = new Set<number>();
  for (const t of texts) for (const l of t?.split('\n') ?? []) if (l) set.add(Number(l));
  return [...set].sort((a, b) => a - b);
}

/** The processes in the cgroup (any of its hierarchies, nested cgroups included). */
export async function pids(cg: Cgroup): Promise<number[]> {
  return pidsIn(await allDirs(cg));
}

/**
 * SIGKILL every process and remove every directory. Safe to call on a frozen cgroup, a
 * half-made one or one already gone. v1 freezes first so nothing can fork while the kill runs.
 */
export async function destroyCgroup(cg: Cgroup, timeoutMs = 2000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  // fast path: the kernel refuses (EBUSY) to remove a cgroup holding processes or children
  const first = await Promise.all(
    tops(cg).map((d) =>
      rmdir(d).then(
        () => true,
        (e: unknown) => errno(e) === 'ENOENT',
      ),
    ),
  );
  if (first.every(Boolean)) return;
  const dirs = await allDirs(cg);
  if (!dirs.length) return;
  // rmdir failed: processes or nested cgroups are there. Kill whatever is inside.
  if (cg.version === 2 && (await v2.killV2(cg))) {
    // cgroup.kill reaches the whole subtree, frozen tasks too; the loop below only waits
  } else if (cg.version === 1 && cg.controllerDirs.freezer) {
    // frozen, nothing can fork between reading the pids and killing them; the kills land on thaw
    await v1.freezeV1(cg, 500).catch(noted(`freeze ${cg.id} before the kill`, 'ENOENT'));
    for (const p of await pidsIn(dirs)) signal(p, 'SIGKILL');
    await v1.thawV1(cg).catch(noted(`thaw ${cg.id}`, 'ENOENT'));
  } else if (await isFrozen(cg)) {
    await thaw(cg).catch(noted(`thaw ${cg.id}`, 'ENOENT'));
  }
  let left: number[] = [];
  const emptied = await poll(
    async () => {
      left = await pidsIn(dirs);
      for (const p of left) signal(p, 'SIGKILL');
      return left.length === 0;
    },
    Math.max(0, deadline - performance.now()),
  );
  if (!emptied) throw cgError(`cgroup ${cg.id} still holds pids ${left.join(' ')} after SIGKILL`);
  // each sandbox tree bottom-up (a parent is busy while it has children), the trees in parallel
  const trees = tops(cg).map((top) =>
    dirs.filter((d) => d === top || d.startsWith(`${top}/`)).sort((a, b) => b.length - a.length),
  );
  let busy: string[] = [];
  const removed = await poll(
    async () => {
      busy = (await Promise.all(trees.map(removeTree))).flat();
      return busy.length === 0;
    },
    Math.max(0, deadline - performance.now()),
  );
  if (!removed) throw cgError(`cannot remove ${busy.join(', ')}: still busy`);
}

/** rmdir each dir in order; returns those still busy (a missing one is already removed). */
async function removeTree(dirs: string[]): Promise<string[]> {
  for (const [i, d] of dirs.entries()) {
    try {
      await rmdir(d);
    } catch (e) {
      if (errno(e) === 'ENOENT') continue;
      if (errno(e) === 'EBUSY') return dirs.slice(i);
      throw cgError(`cannot remove ${d}`, e);
    }
  }
  return [];
}
