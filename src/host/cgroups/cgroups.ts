import { close as fsClose, constants, open as fsOpen, write as fsWrite } from 'node:fs';
import { chmod, chown, mkdir, readFile, rmdir } from 'node:fs/promises';
import { SnaplabError } from '../../errors.js';
import { cgError, errno, writeText } from './fs.js';
import { cgroupFor, type CgroupOptions } from './paths.js';
import type { Cgroup, CgroupLimits, CgroupPlan, CgroupStats, CgroupWrite } from './types.js';
import * as v1 from './v1.js';
import * as v2 from './v2.js';
import { noted, orElse } from '../../cleanup.js';

export { detectCgroups, forgetCgroupLayouts, type CgroupLayout, type Controller } from './detect.js';
export type { Cgroup, CgroupLimits } from './types.js';
export { destroyCgroup, pids } from './destroy.js';
export {
  listSnaplabCgroups,
  snaplabCgroupsOnHost,
  snaplabCgroupsOf,
  probeCgroups,
  probeCgroupMoves,
  removeEmptySnaplabParents,
} from './host.js';
export { cgroupFor, PARENT, type CgroupOptions } from './paths.js';
export { freeze, isFrozen, thaw } from './freezer.js';

/** A cpuset cgroup takes no task until it has cpus and mems: copy them from its parent, top down. */
async function cpusetReady(dir: string): Promise<void> {
  for (const f of ['cpuset.cpus', 'cpuset.mems']) {
    const here = await readFile(`${dir}/${f}`, 'utf8').catch(orElse(undefined, `read ${dir}/${f}`, 'ENOENT'));
    if (here === undefined || here.trim()) continue;
    await writeText(`${dir}/${f}`, (await readFile(`${dir}/../${f}`, 'utf8')).trim());
  }
}

/** systemd nests 5 deep at most (user.slice/…/app.slice/…); 12 names of 255 bytes fit in PATH_MAX */
const DELEGATED_MAX_DEPTH = 12;
const DELEGATED_MAX_DESCENDANTS = 4096;

/** The files of a cgroup2 directory that its owner must own to manage the subtree (cgroup-v2.rst "Delegation"). */
const DELEGATED = ['', '/cgroup.procs', '/cgroup.threads', '/cgroup.subtree_control'];

/** A system machine's two leaves, as systemd-nspawn makes them: its monitor, and its systemd's tree. */
export const SUPERVISOR = 'supervisor';
export const PAYLOAD = 'payload';
/** The agent's leaf inside payload: its commands in the machine's cgroup namespace, where its systemd can move them. */
export const AGENT_LEAF = 'snaplab-agent';

/**
 * Give a system machine's root a cgroup2 subtree of its own (systemd as PID 1 needs one): on v2
 * in the machine's directory, on a v1 hybrid host in a directory in the unified mount. Two leaves:
 * `supervisor`, where the launcher puts the monitor (procsFiles), and `payload`, owned by `uid`
 * (the mapped root), which PID 1 moves itself into before it makes its cgroup namespace
 * (native/boot.c --cgroup): its systemd makes its slices there and nowhere else. The agent moves
 * itself into `payload/snaplab-agent` (--agent-cgroup), a leaf the host owns, so that its
 * commands are inside the machine's cgroup namespace: with nsdelegate (stock Debian) systemd
 * inside can move only processes it can see there (systemd-run --scope, pam_systemd). On v2 a
 * cgroup that holds processes cannot give its children controllers, so with the monitor in the
 * machine's directory systemd inside got none and its units' MemoryMax= did nothing; with the
 * split the directory holds none, its controllers are enabled for both leaves, and payload's
 * subtree_control is systemd's to write. Returns the cgroup.procs files of payload and of the
 * agent's leaf, for the boot.
 */
export async function delegateCgroup(cg: Cgroup, uid: number): Promise<{ payload: string; agent: string }> {
  let dir: string;
  if (cg.version === 2) dir = cg.dirs[0]!;
  else if (cg.unifiedDir) {
    dir = cg.unifiedDir;
    await mkdir(dir, { recursive: true });
  } else {
    throw cgError(
      'a system machine needs a cgroup2 hierarchy (v2, or the unified mount of a hybrid host); this host has only v1',
    );
  }
  const supervisor = `${dir}/${SUPERVISOR}`;
  const payload = `${dir}/${PAYLOAD}`;
  await mkdir(supervisor);
  await mkdir(payload);
  if (cg.version === 2) {
    const available = (await readFile(`${dir}/cgroup.controllers`, 'utf8')).trim().split(/\s+/).filter(Boolean);
    if (available.length) await writeText(`${dir}/cgroup.subtree_control`, available.map((c) => `+${c}`).join(' '));
    cg.procsFiles[0] = `${supervisor}/cgroup.procs`;
  } else {
    cg.procsFiles.push(`${supervisor}/cgroup.procs`);
  }
  // the v1 hierarchies without limits: joined, so that the machine's cgroup namespace is rooted
  // at its own directory in each (a mount of one inside shows its subtree, not the host's)
  for (const other of cg.otherDirs ?? []) {
    await mkdir(other, { recursive: true });
    if (
      await readFile(`${other}/cpuset.cpus`, 'utf8').then(
        () => true,
        () => false,
      )
    ) {
      await cpusetReady(`${other}/..`);
      await cpusetReady(other);
    }
    cg.procsFiles.push(`${other}/cgroup.procs`);
  }
  // host-owned limits on the subtree the machine may make: without them a chain of nested
  // directories past PATH_MAX made the machine's cgroup impossible to walk and remove
  await writeText(`${payload}/cgroup.max.depth`, String(DELEGATED_MAX_DEPTH));
  await writeText(`${payload}/cgroup.max.descendants`, String(DELEGATED_MAX_DESCENDANTS));
  for (const f of DELEGATED) await chownDelegated(`${payload}${f}`, uid);
  // the agent's leaf: made before its systemd starts (which leaves a cgroup it did not make
  // alone), the host's but for cgroup.procs, which the agent writes itself into
  const agent = `${payload}/${AGENT_LEAF}`;
  await mkdir(agent);
  await chownDelegated(`${agent}/cgroup.procs`, uid);
  // PID 1's move from supervisor to payload needs the common parent's cgroup.procs writable by
  // it too (cgroup-v2.rst "Delegation Containment"). Nothing inside can name that directory (its
  // cgroup namespace is rooted at payload), and it has controllers enabled, so no process can
  // be put in it.
  await chownDelegated(`${dir}/cgroup.procs`, uid);
  // searchable by the machine's root, who joins from inside its user namespace (boot.c): mkdir
  // took the umask of whatever started snaplab, and 077 left them 0700, the machine unable to
  // start ("join the machine's cgroup: Permission denied"). The snaplab parent too: made by it
  // as well (prepareV2Parent, or the recursive mkdir above)
  for (const d of [`${dir}/..`, dir, supervisor, payload, agent]) await chmod(d, 0o755);
  return { payload: `${payload}/cgroup.procs`, agent: `${agent}/cgroup.procs` };
}

async function chownDelegated(path: string, uid: number): Promise<void> {
  await chown(path, uid, uid).catch((e: unknown) => {
    if (errno(e) !== 'ENOENT') throw cgError(`cannot delegate ${path}`, e);
  });
}

function checkLimits(l: CgroupLimits): void {
  const bad = (what: string, v: unknown): never => {
    throw new SnaplabError('BAD_INPUT', `bad ${what}: ${String(v)}`, `${what} must be a positive number`);
  };
  if (l.memoryBytes !== undefined && !(Number.isSafeInteger(l.memoryBytes) && l.memoryBytes > 0))
    bad('memory limit', l.memoryBytes);
  if (l.pids !== undefined && !(Number.isSafeInteger(l.pids) && l.pids > 0)) bad('pids limit', l.pids);
  if (l.cpus !== undefined && !(Number.isFinite(l.cpus) && l.cpus > 0)) bad('cpu limit', l.cpus);
}

/**
 * Make sandbox `id`'s cgroup with its limits. Hot path of every raise: only mkdirs and writes,
 * all hierarchies in parallel. A cgroup of that id that already exists is an error (reuse fails
 * closed); on any failure whatever was made is removed again. Limits whose controller is missing
 * are skipped; the reasons are in the result's `skipped`.
 */
export async function createCgroup(id: string, limits: CgroupLimits = {}, opts: CgroupOptions = {}): Promise<Cgroup> {
  checkLimits(limits);
  const cg = cgroupFor(id, opts);
  if (!cg.dirs.length) throw cgError(`no cgroup hierarchy usable for snaplab under ${cg.root}`);
  const plan: CgroupPlan = cg.version === 1 ? v1.planV1(cg, limits) : v2.planV2(cg, limits);
  if (cg.version === 2) await v2.prepareV2Parent(cg);
  const created: string[] = [];
  const results = await Promise.allSettled(
    cg.dirs.map(async (dir) => {
      await makeDir(cg, dir);
      created.push(dir);
      await applyWrites(cg, dir, plan.writes.get(dir) ?? [], plan.skipped);
    }),
  );
  const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) {
    await Promise.all(created.map((d) => rmdir(d).catch(noted(`remove cgroup ${d}`, 'ENOENT'))));
    throw failed.reason instanceof SnaplabError ? failed.reason : cgError(`cannot create cgroup ${id}`, failed.reason);
  }
  cg.skipped = plan.skipped;
  return cg;
}

async function makeDir(cg: Cgroup, dir: string): Promise<void> {
  try {
    await mkdir(dir);
  } catch (e) {
    if (errno(e) === 'EEXIST') {
      throw new SnaplabError(
        'CGROUP_FAILED',
        `cgroup ${dir} already exists`,
        `destroy sandbox ${cg.id} or run snaplab gc`,
        { cause: e },
      );
    }
    if (errno(e) !== 'ENOENT') throw cgError(`cannot create ${dir}`, e);
    // first sandbox on this host (or after gc): make the snaplab parent, then retry
    if (cg.version === 2) await v2.prepareV2Parent(cg, true);
    else
      await mkdir(dir.slice(0, dir.lastIndexOf('/'))).catch((e2: unknown) => {
        if (errno(e2) !== 'EEXIST') throw cgError(`cannot create the snaplab parent of ${dir}`, e2);
      });
    await mkdir(dir).catch((e2: unknown) => {
      throw cgError(`cannot create ${dir}`, e2);
    });
  }
}

/**
 * Open every file of a directory at once, then write in order (memory.memsw after memory), then
 * close without waiting: two thread-pool round trips instead of three per file. Measured: this is what
 * keeps a v1 create near half a millisecond.
 */
async function applyWrites(cg: Cgroup, dir: string, writes: CgroupWrite[], skipped: string[]): Promise<void> {
  if (!writes.length) return;
  const opened = await Promise.all(writes.map((w) => openForWrite(`${dir}/${w.file}`)));
  try {
    for (const [i, w] of writes.entries()) {
      const fd = opened[i]!;
      if (typeof fd === 'number') {
        await new Promise<void>((res, rej) =>
          fsWrite(fd, w.value, (e) => (e ? rej(cgError(`cannot write ${w.value} to ${dir}/${w.file}`, e)) : res())),
        );
      } else {
        await applyWrite(cg, dir, w, skipped); // rare: missing file (skip, fallback, or v2 re-prepare)
      }
    }
  } finally {
    // not awaited: closing a cgroupfs file reports nothing, and a round trip costs ~0.05 ms
    for (const fd of opened) if (typeof fd === 'number') fsClose(fd, () => undefined);
  }
}

function openForWrite(path: string): Promise<number | Error> {
  return new Promise((res) => fsOpen(path, constants.O_WRONLY, (e, fd) => res(e ?? fd)));
}

async function applyWrite(cg: Cgroup, dir: string, w: CgroupWrite, skipped: string[], retried = false): Promise<void> {
  try {
    await writeText(`${dir}/${w.file}`, w.value);
  } catch (e) {
    if (errno(e) !== 'ENOENT') throw cgError(`cannot write ${w.value} to ${dir}/${w.file}`, e);
    if (w.optional) {
      skipped.push(w.optional);
      if (w.fallback) await applyWrite(cg, dir, w.fallback, skipped);
      return;
    }
    // v2: the parent lost a controller from its subtree_control since we prepared it
    if (cg.version === 2 && !retried) {
      await v2.prepareV2Parent(cg, true);
      return applyWrite(cg, dir, w, skipped, true);
    }
    throw cgError(`cannot write ${dir}/${w.file}`, e);
  }
}

/** How many processes the kernel's OOM killer has killed in this cgroup (0 without memory controller), read at once. */
export function oomKills(cg: Cgroup): number {
  return cg.version === 1 ? v1.oomKillsV1(cg) : v2.oomKillsV2(cg);
}
/** Memory in use (bytes), processes, CPU time used (µs); a figure is absent when its controller is. */
/** What `cg` counts now; `cache`: its page cache too (one more file read: memory.stat). */
export function stats(cg: Cgroup, o: { cache?: boolean } = {}): Promise<CgroupStats> {
  return cg.version === 1 ? v1.statsV1(cg, o) : v2.statsV2(cg, o);
}
