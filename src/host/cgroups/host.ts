import { spawn } from 'node:child_process';
import { existsSync, writeFileSync } from 'node:fs';
import { mkdir, readdir, rmdir } from 'node:fs/promises';
import type { Availability } from '../probe-types.js';
import { DEFAULT_ROOT, detectCgroups } from './detect.js';
import { errno } from './fs.js';
import { cgroupFor, PARENT } from './paths.js';
import type { Cgroup } from './types.js';
import { listMounts } from '../mounts.js';
import { ensureScope, SCOPE_PATH, SCOPE_UNIT, stopScopeIfIdle } from './scope.js';
import { pidAlive } from '../procs.js';
import { noted, orElse } from '../../cleanup.js';

/** Host-wide views of snaplab's cgroups: what exists (for gc) and whether cgroups work here. */

async function idsUnder(mount: string): Promise<string[]> {
  try {
    const entries = await readdir(`${mount}/${PARENT}`, { withFileTypes: true });
    return entries.filter((e) => e.isDirectory()).map((e) => e.name);
  } catch (e) {
    if (errno(e) === 'ENOENT' || errno(e) === 'ENOTDIR') return [];
    throw e;
  }
}

/**
 * Where snaplab cgroups may be: every cgroup mount's snaplab/ (v1 hierarchies, the v2 root, and on
 * hybrid hosts the unified cgroup2 mount too), with the root a Cgroup handle is made under.
 */
export async function snaplabParents(): Promise<{ root: string; dir: string }[]> {
  const mounts = (await listMounts()).filter((m) => m.fstype === 'cgroup' || m.fstype === 'cgroup2');
  return mounts.flatMap((m) => {
    // v1 hierarchies belong to the default root; a cgroup2 mount is a root of its own, whose
    // snaplab/ may be in snaplab's systemd scope (scope.ts)
    const root = m.fstype === 'cgroup2' ? m.target : DEFAULT_ROOT;
    // (and under the root too: a sandbox made before snaplab moved into its scope)
    const base = m.fstype === 'cgroup2' ? detectCgroups(m.target).base : m.target;
    return [...new Set([base, m.target])].map((dir) => ({ root, dir }));
  });
}

/** Every snaplab cgroup on the host, in every place snaplabParents names, as Cgroup handles that destroyCgroup accepts. */
export async function snaplabCgroupsOnHost(): Promise<Cgroup[]> {
  const found = new Map<string, Cgroup>();
  await Promise.all(
    (await snaplabParents()).map(async ({ root, dir }) => {
      for (const id of await idsUnder(dir)) {
        const key = `${root}\0${id}`;
        if (!found.has(key)) found.set(key, cgroupFor(id, { root }));
      }
    }),
  );
  return [...found.values()];
}

/**
 * The snaplab cgroups of these sandbox ids that exist on the host, found where snaplabCgroupsOnHost
 * looks, without listing every other one: the host's list is every home's sandboxes (thousands),
 * a gc asks about the few of its own home that are not live. `parents`: snaplabParents() read once
 * by a caller that asks many times (it reads the host's mount table).
 */
export async function snaplabCgroupsOf(
  ids: Iterable<string>,
  parents?: { root: string; dir: string }[],
): Promise<Cgroup[]> {
  parents ??= await snaplabParents();
  const found = new Map<string, Cgroup>();
  for (const id of ids) {
    for (const { root, dir } of parents) {
      const key = `${root}\0${id}`;
      if (!found.has(key) && existsSync(`${dir}/${PARENT}/${id}`)) found.set(key, cgroupFor(id, { root }));
    }
  }
  return [...found.values()];
}

/** Ids of the sandboxes that have a cgroup on this host, in any hierarchy. */
export async function listSnaplabCgroups(): Promise<string[]> {
  return [...new Set((await snaplabCgroupsOnHost()).map((c) => c.id))].sort();
}

const NEEDED = ['memory', 'pids', 'cpu', 'freezer'] as const;

/** Do cgroups work here for snaplab: root, and the memory, pids, cpu and freezer controllers? */
export async function probeCgroups(
  root: string = DEFAULT_ROOT,
): Promise<Availability & { version: 1 | 2; controllers: string[] }> {
  const layout = detectCgroups(root);
  const base = { version: layout.version, controllers: layout.controllers };
  if (process.getuid?.() !== 0) {
    return { ...base, ok: false, reason: 'cgroups can only be managed as root', fix: 'run snaplab as root (sudo)' };
  }
  const have = (c: string): boolean => (c === 'freezer' && layout.version === 2) || layout.controllers.includes(c);
  const missing = NEEDED.filter((c) => !have(c));
  const kind = layout.version === 2 ? 'cgroup v2' : layout.unified ? 'cgroup v1 (hybrid)' : 'cgroup v1';
  if (missing.length) {
    const fix =
      layout.version === 2
        ? `enable them in the parent cgroup (echo +${missing.join(' +')} > <parent>/cgroup.subtree_control)` +
          (missing.includes('memory') ? ', or boot with cgroup_enable=memory' : '')
        : missing
            .map((c) => `mkdir -p ${layout.root}/${c} && mount -t cgroup -o ${c} cgroup ${layout.root}/${c}`)
            .join('; ');
    return {
      ...base,
      ok: false,
      reason: `${kind} at ${layout.root} lacks the ${missing.join(', ')} controller(s)`,
      fix,
    };
  }
  const notes: string[] = [];
  const mem = layout.hierarchies.memory;
  if (layout.version === 1 && mem && !existsSync(`${mem}/memory.memsw.limit_in_bytes`)) {
    notes.push('swap accounting off (boot with swapaccount=1 to keep sandboxes out of swap)');
  }
  const where = layout.base !== layout.root ? `, snaplab's cgroups in systemd's ${SCOPE_UNIT} (delegated)` : '';
  return {
    ...base,
    ok: true,
    reason: [`${kind} at ${layout.root} with ${NEEDED.join(', ')}${where}`, ...notes].join('; '),
  };
}

/**
 * Remove the `snaplab` parent directories that hold no sandbox any more (gc, test teardown).
 * One still in use is left alone: rmdir of a non-empty cgroup fails with EBUSY. A create racing
 * with this finds its parent gone and makes it again.
 */
export async function removeEmptySnaplabParents(): Promise<void> {
  const mounts = (await listMounts()).filter((m) => m.fstype === 'cgroup' || m.fstype === 'cgroup2');
  await Promise.all(
    mounts.map(async (m) => {
      const base = m.fstype === 'cgroup2' ? detectCgroups(m.target).base : m.target;
      await rmdir(`${m.target}/${PARENT}`).catch((e: unknown) => {
        if (!['ENOENT', 'EBUSY', 'ENOTEMPTY'].includes(errno(e) ?? '')) throw e;
      });
      if (base.endsWith(SCOPE_PATH)) await stopScopeIfIdle(base);
    }),
  );
}

/**
 * Moving a process into a cgroup takes a global lock whose write side waits for an RCU grace
 * period when no move happened recently (~10 ms on these hosts: once per raise when raises are
 * spaced out). A cgroup2 mount with `favordynmods` keeps that lock in its slow-reader mode so
 * moves are cheap, at a small cost to every fork and exit on the host. snaplab does not change
 * host-wide settings itself: doctor measures one move and says what would help.
 */
const PROBE = `${PARENT}-probe-`;

/** Where doctor's probe cgroup goes: in snaplab's systemd scope on a systemd host, never the root's own. */
export function probeParent(layout: ReturnType<typeof detectCgroups>): string {
  return layout.version === 2 ? layout.base : `${layout.hierarchies.pids ?? layout.hierarchies.freezer}`;
}

/**
 * The probe cgroups of doctors that are gone (killed during the probe, or whose rmdir failed),
 * removed (gc). One whose process lives, or cannot be read, is left; one still holding a process
 * (its `sleep`, for up to 5 s) is left for the next gc.
 */
export async function sweepProbeCgroups(): Promise<string[]> {
  const parent = probeParent(detectCgroups(DEFAULT_ROOT));
  const removed: string[] = [];
  for (const e of await readdir(parent).catch(orElse([] as string[], `readdir ${parent}`, 'ENOENT'))) {
    const pid = Number(/^snaplab-probe-(\d+)$/.exec(e)?.[1]);
    if (!e.startsWith(PROBE) || !Number.isInteger(pid) || (await pidAlive(pid))) continue;
    const dir = `${parent}/${e}`;
    if (await rmdir(dir).then(() => true, noted(`remove ${dir}`, 'ENOENT', 'EBUSY'))) removed.push(`cgroup ${dir}`);
  }
  return removed;
}

export async function probeCgroupMoves(): Promise<Availability> {
  const layout = detectCgroups(DEFAULT_ROOT);
  const mountPoint = layout.version === 2 ? layout.root : layout.unified;
  const fix = mountPoint
    ? `mount -o remount,favordynmods ${mountPoint}`
    : 'mount a cgroup2 hierarchy with -o favordynmods';
  const dir = `${probeParent(layout)}/${PROBE}${process.pid}`;
  const scoped = layout.base.endsWith(SCOPE_PATH);
  const child = spawn('sleep', ['5'], { stdio: 'ignore' });
  let verdict: Availability;
  try {
    if (scoped) await ensureScope(layout.base);
    await mkdir(dir);
    await new Promise((r) => setTimeout(r, 50)); // let any recent move's grace period lapse
    const t0 = performance.now();
    writeFileSync(`${dir}/cgroup.procs`, String(child.pid));
    const ms = performance.now() - t0;
    const took = `moving a process into a cgroup took ${ms.toFixed(2)} ms`;
    verdict =
      ms < 2
        ? { ok: true, reason: took }
        : {
            ok: false,
            reason: `${took} (an RCU grace period; paid by each raise when raises are spaced out; optional tuning)`,
            fix,
          };
  } catch (e) {
    verdict = { ok: false, reason: `could not measure a cgroup move: ${(e as Error).message}`, fix };
  }
  // clean up, and say what could not be (gc removes it later)
  child.kill('SIGKILL');
  await new Promise((r) => child.once('exit', r));
  const left: string[] = [];
  await rmdir(dir).catch((e: unknown) => {
    if (errno(e) !== 'ENOENT') left.push(`${dir} (${errno(e)})`);
  });
  if (scoped)
    await stopScopeIfIdle(layout.base).catch((e: unknown) => left.push(`${SCOPE_UNIT} (${(e as Error).message})`));
  return left.length
    ? { ...verdict, reason: `${verdict.reason}; could not remove ${left.join(', ')}: snaplab gc does` }
    : verdict;
}
