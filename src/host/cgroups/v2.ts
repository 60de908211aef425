import { mkdir } from 'node:fs/promises';
import type { Cgroup, CgroupLimits, CgroupPlan, CgroupStats, CgroupWrite } from './types.js';
import { cgError, errno, keyed, parseNumber, poll, readText, readTextNow, writeText } from './fs.js';
import { ensureScope, SCOPE_PATH } from './scope.js';

/** cgroup v2: one directory, controllers enabled from the parent, cgroup.freeze/events/kill. */

const CPU_PERIOD_US = 100_000;
export const V2_LIMIT_CONTROLLERS = ['memory', 'pids', 'cpu'] as const;

export function planV2(cg: Cgroup, limits: CgroupLimits): CgroupPlan {
  const dir = cg.dirs[0]!;
  const ws: CgroupWrite[] = [];
  const skipped: string[] = [];
  const add = (ctrl: 'memory' | 'pids' | 'cpu', what: string, w: CgroupWrite[]): void => {
    if (cg.controllerDirs[ctrl]) ws.push(...w);
    else skipped.push(`${what}: the ${ctrl} controller is not available in ${cg.root}/cgroup.controllers`);
  };
  if (limits.memoryBytes !== undefined) {
    add('memory', 'memory limit', [
      { file: 'memory.max', value: String(limits.memoryBytes) },
      {
        file: 'memory.swap.max',
        value: '0',
        optional: 'swap limit: memory.swap.max is missing (kernel without swap accounting)',
      },
    ]);
  }
  if (limits.pids !== undefined) {
    add('pids', 'pids limit', [{ file: 'pids.max', value: String(limits.pids) }]);
  }
  if (limits.cpus !== undefined) {
    const quota = Math.max(1000, Math.round(limits.cpus * CPU_PERIOD_US));
    add('cpu', 'cpu limit', [{ file: 'cpu.max', value: `${quota} ${CPU_PERIOD_US}` }]);
  }
  return { writes: new Map([[dir, ws]]), skipped };
}

const prepared = new Set<string>();

/**
 * Make `root/snaplab` (root: the cgroup2 root, or snaplab's systemd scope, made first when
 * missing) and enable the controllers snaplab limits in root's and snaplab's
 * cgroup.subtree_control (children only get the files of controllers their parent enables).
 * Done once per process and again whenever a create finds the parent or a controller missing.
 */
export async function prepareV2Parent(cg: Cgroup, force = false): Promise<void> {
  if (prepared.has(cg.root) && !force) return;
  if (cg.root.endsWith(SCOPE_PATH)) await ensureScope(cg.root);
  const parent = `${cg.root}/snaplab`;
  await mkdir(parent).catch((e: unknown) => {
    if (errno(e) !== 'EEXIST') throw cgError(`cannot create ${parent}`, e);
  });
  const want = V2_LIMIT_CONTROLLERS.filter((c) => cg.controllerDirs[c]);
  for (const dir of [cg.root, parent]) {
    const on = new Set((await readText(`${dir}/cgroup.subtree_control`))?.trim().split(/\s+/));
    const missing = want.filter((c) => !on.has(c));
    if (!missing.length) continue;
    await writeText(`${dir}/cgroup.subtree_control`, missing.map((c) => `+${c}`).join(' ')).catch((e: unknown) => {
      throw cgError(`cannot enable ${missing.join(', ')} in ${dir}/cgroup.subtree_control`, e);
    });
  }
  prepared.add(cg.root);
}

export async function freezeV2(cg: Cgroup, timeoutMs: number): Promise<void> {
  const dir = cg.dirs[0]!;
  await writeText(`${dir}/cgroup.freeze`, '1').catch((e: unknown) => {
    throw cgError(`cannot freeze ${cg.id}`, e);
  });
  const ok = await poll(async () => keyed(await readText(`${dir}/cgroup.events`), 'frozen') === 1, timeoutMs);
  if (!ok) throw cgError(`${cg.id} did not freeze within ${timeoutMs} ms`);
}

export async function thawV2(cg: Cgroup): Promise<void> {
  await writeText(`${cg.dirs[0]!}/cgroup.freeze`, '0').catch((e: unknown) => {
    throw cgError(`cannot thaw ${cg.id}`, e);
  });
}

/** Asked to freeze counts as frozen, like v1 FREEZING. */
export async function isFrozenV2(cg: Cgroup): Promise<boolean> {
  const dir = cg.dirs[0]!;
  const [want, events] = await Promise.all([readText(`${dir}/cgroup.freeze`), readText(`${dir}/cgroup.events`)]);
  return want?.trim() === '1' || keyed(events, 'frozen') === 1;
}

/** SIGKILL the whole subtree at once (Linux 5.14+); false when cgroup.kill is missing. */
export async function killV2(cg: Cgroup): Promise<boolean> {
  try {
    await writeText(`${cg.dirs[0]!}/cgroup.kill`, '1');
    return true;
  } catch (e) {
    if (errno(e) === 'ENOENT') return false;
    throw cgError(`cannot kill the processes of ${cg.id}`, e);
  }
}

export function oomKillsV2(cg: Cgroup): number {
  const dir = cg.controllerDirs.memory;
  return dir ? (keyed(readTextNow(`${dir}/memory.events`), 'oom_kill') ?? 0) : 0;
}

export async function statsV2(cg: Cgroup, o: { cache?: boolean } = {}): Promise<CgroupStats> {
  const dir = cg.dirs[0]!;
  const { memory, pids } = cg.controllerDirs;
  const [mem, stat, n, cpu] = await Promise.all([
    memory ? readText(`${dir}/memory.current`) : undefined,
    memory && o.cache ? readText(`${dir}/memory.stat`) : undefined,
    pids ? readText(`${dir}/pids.current`) : undefined,
    readText(`${dir}/cpu.stat`), // core file: usage_usec is there without the cpu controller
  ]);
  const out: CgroupStats = {};
  const m = parseNumber(mem);
  const cache = keyed(stat, 'file');
  const p = parseNumber(n);
  const c = keyed(cpu, 'usage_usec');
  if (m !== undefined) out.memoryBytes = m;
  if (cache !== undefined) out.cacheBytes = cache;
  if (p !== undefined) out.pids = p;
  if (c !== undefined) out.cpuUsec = c;
  return out;
}
