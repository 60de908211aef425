/**
 * One sandbox's resource use now: memory, processes and CPU time from its cgroup (as the daemon's
 * `/usage` reads every machine's), the CPUs and memory it may use (its limits, else the host's),
 * and its disk as its storage backend counts it (what it wrote against its cap, else the bytes
 * only its volume holds, out of the cap or the size of the filesystem it lives on).
 */
import { statfs } from 'node:fs/promises';
import { orElse } from '../../cleanup.js';
import { capacityOf } from '../../drivers/capacity.js';
import { findDriverInfo } from '../../drivers/registry.js';
import { cgroupFor, stats } from '../../host/cgroups/cgroups.js';
import type { SandboxRecord } from '../../store/records.js';
import type { LabContext } from '../context.js';

/** A sample of one sandbox's use (`sandbox.usage()`). */
export interface SandboxUsage {
  /** when it was read (ms since the epoch) */
  at: number;
  /** memory in use (its cgroup's count: page cache included), bytes */
  memoryBytes: number;
  /** of memoryBytes, the page cache (files read or written, tmpfs), bytes */
  memoryCacheBytes: number;
  /** its memory limit, else the host's memory */
  memoryTotalBytes: number;
  /** CPU time used since it started, µs */
  cpuUsec: number;
  /** the CPUs it may use: its limit rounded up, else the host's */
  cpus: number;
  /** processes (and threads) in it, or null where the pids controller is absent */
  pids: number | null;
  /** disk it uses, bytes, or null when its storage cannot say */
  diskUsedBytes: number | null;
  /** its disk cap, else the size of the filesystem its volume is on; null when unknown */
  diskTotalBytes: number | null;
}

export async function sandboxUsage(ctx: LabContext, rec: SandboxRecord): Promise<SandboxUsage> {
  const at = Date.now();
  type CgroupStats = Awaited<ReturnType<typeof stats>>;
  const [cg, disk] = await Promise.all([
    stats(cgroupFor(rec.id), { cache: true }).catch(orElse<CgroupStats>({}, `stats of ${rec.id}`, 'ENOENT')),
    diskOf(ctx, rec),
  ]);
  const capacity = capacityOf(rec.limits, findDriverInfo(rec.driver));
  return {
    at,
    memoryBytes: cg.memoryBytes ?? 0,
    memoryCacheBytes: cg.cacheBytes ?? 0,
    memoryTotalBytes: capacity.memoryTotalBytes,
    cpuUsec: cg.cpuUsec ?? 0,
    cpus: capacity.cpus,
    pids: cg.pids ?? null,
    ...disk,
  };
}

async function diskOf(
  ctx: LabContext,
  rec: SandboxRecord,
): Promise<{ diskUsedBytes: number | null; diskTotalBytes: number | null }> {
  const volume = rec.volume;
  if (!volume) return { diskUsedBytes: null, diskTotalBytes: null };
  const backend = await ctx.readyBackend(rec.storage);
  const quota = rec.limits.diskBytes ? await backend.diskQuota?.(volume) : null;
  if (quota)
    return { diskUsedBytes: quota.usedBytes, diskTotalBytes: quota.limitBytes ?? rec.limits.diskBytes ?? null };
  const [used, fs] = await Promise.all([
    backend.usage(volume).then((u) => u.exclusiveBytes),
    statfs(volume.path).catch(orElse(undefined, `statfs ${volume.path}`, 'ENOENT')),
  ]);
  return { diskUsedBytes: used, diskTotalBytes: rec.limits.diskBytes ?? (fs ? fs.blocks * fs.bsize : null) };
}
