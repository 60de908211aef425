import type { Cgroup, CgroupLimits, CgroupPlan, CgroupStats, CgroupWrite } from './types.js';
import { cgError, keyed, parseNumber, poll, readText, readTextNow, writeText } from './fs.js';

/** cgroup v1: a directory per hierarchy, freezer.state, memory.oom_control, cpu.cfs_quota_us. */

const CFS_PERIOD_US = 100_000; // the kernel's default cpu.cfs_period_us

export function planV1(cg: Cgroup, limits: CgroupLimits): CgroupPlan {
  const writes = new Map<string, CgroupWrite[]>(cg.dirs.map((d) => [d, []]));
  const skipped: string[] = [];
  const add = (ctrl: 'memory' | 'pids' | 'cpu', what: string, ws: CgroupWrite[]): void => {
    const dir = cg.controllerDirs[ctrl];
    if (dir) writes.get(dir)!.push(...ws);
    else skipped.push(`${what}: no ${ctrl} hierarchy is mounted under ${cg.root}`);
  };
  if (limits.memoryBytes !== undefined) {
    const n = String(limits.memoryBytes);
    // memsw (memory + swap) must be set after the memory limit: the kernel keeps memsw >= memory
    add('memory', 'memory limit', [
      { file: 'memory.limit_in_bytes', value: n },
      {
        file: 'memory.memsw.limit_in_bytes',
        value: n,
        optional: 'swap limit: swap accounting is off (boot with swapaccount=1); swappiness set to 0 instead',
        fallback: { file: 'memory.swappiness', value: '0' },
      },
    ]);
  }
  if (limits.pids !== undefined) {
    add('pids', 'pids limit', [{ file: 'pids.max', value: String(limits.pids) }]);
  }
  if (limits.cpus !== undefined) {
    const quota = Math.max(1000, Math.round(limits.cpus * CFS_PERIOD_US));
    add('cpu', 'cpu limit', [{ file: 'cpu.cfs_quota_us', value: String(quota) }]);
  }
  return { writes, skipped };
}

function freezerState(cg: Cgroup): string {
  const dir = cg.controllerDirs.freezer;
  if (!dir) {
    throw cgError(`cannot freeze ${cg.id}: no freezer hierarchy is mounted under ${cg.root}`);
  }
  return `${dir}/freezer.state`;
}

/** Freeze and wait until the kernel reports FROZEN (FREEZING means tasks are still running). */
export async function freezeV1(cg: Cgroup, timeoutMs: number): Promise<void> {
  const file = freezerState(cg);
  await writeText(file, 'FROZEN').catch((e: unknown) => {
    throw cgError(`cannot freeze ${cg.id}`, e);
  });
  const ok = await poll(async () => (await readText(file))?.trim() === 'FROZEN', timeoutMs);
  if (!ok) throw cgError(`${cg.id} did not freeze within ${timeoutMs} ms (a task in D state?)`);
}

export async function thawV1(cg: Cgroup): Promise<void> {
  await writeText(freezerState(cg), 'THAWED').catch((e: unknown) => {
    throw cgError(`cannot thaw ${cg.id}`, e);
  });
}

/** FROZEN or FREEZING count as frozen: a half-frozen cgroup runs nothing reliably. */
export async function isFrozenV1(cg: Cgroup): Promise<boolean> {
  const dir = cg.controllerDirs.freezer;
  if (!dir) return false;
  const s = (await readText(`${dir}/freezer.state`))?.trim();
  return s === 'FROZEN' || s === 'FREEZING';
}

export function oomKillsV1(cg: Cgroup): number {
  const dir = cg.controllerDirs.memory;
  return dir ? (keyed(readTextNow(`${dir}/memory.oom_control`), 'oom_kill') ?? 0) : 0;
}

export async function statsV1(cg: Cgroup, o: { cache?: boolean } = {}): Promise<CgroupStats> {
  const { memory, pids, cpuacct } = cg.controllerDirs;
  const [mem, stat, n, ns] = await Promise.all([
    memory ? readText(`${memory}/memory.usage_in_bytes`) : undefined,
    memory && o.cache ? readText(`${memory}/memory.stat`) : undefined,
    pids ? readText(`${pids}/pids.current`) : undefined,
    cpuacct ? readText(`${cpuacct}/cpuacct.usage`) : undefined,
  ]);
  const out: CgroupStats = {};
  const m = parseNumber(mem);
  const cache = keyed(stat, 'total_cache') ?? keyed(stat, 'cache');
  const p = parseNumber(n);
  const c = parseNumber(ns);
  if (m !== undefined) out.memoryBytes = m;
  if (cache !== undefined) out.cacheBytes = cache;
  if (p !== undefined) out.pids = p;
  if (c !== undefined) out.cpuUsec = Math.round(c / 1000);
  return out;
}
