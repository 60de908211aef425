import type { Command } from 'commander';
import { DEFAULT_DISK_BYTES, DEFAULT_LIMITS } from '../defaults.js';
import { parseCpus, parsePositiveInt, parseSize } from '../lab/sizes.js';
import type { Limits } from '../store/records.js';

export interface LimitOptions {
  memory?: string;
  pids?: string;
  cpus?: string;
  disk?: string;
}

const gib = (bytes: number): string => `${bytes / 1024 ** 3}G`;

export function addLimitOptions(cmd: Command): Command {
  return cmd
    .option(
      '--memory <size>',
      `memory limit, e.g. 256M or 1G (swap is not allowed beyond it; default ${gib(DEFAULT_LIMITS.memoryBytes!)}, or the driver's own: a VM's is smaller)`,
    )
    .option('--pids <n>', `most processes and threads at once (default ${DEFAULT_LIMITS.pids})`)
    .option('--cpus <n>', 'CPU time as cores, e.g. 1 or 0.5')
    .option(
      '--disk <size>',
      `most the machine may write to its filesystem beyond its image, e.g. 1G (default ${gib(DEFAULT_DISK_BYTES)} on btrfs; on overlay and dir a cap is made only when asked; 0: no cap)`,
    );
}

export function limitsFrom(o: LimitOptions): Limits {
  const l: Limits = {};
  if (o.memory !== undefined) l.memoryBytes = parseSize(o.memory, 'memory limit');
  if (o.pids !== undefined) l.pids = parsePositiveInt(o.pids, 'pids limit');
  if (o.cpus !== undefined) l.cpus = parseCpus(o.cpus);
  if (o.disk !== undefined) l.diskBytes = o.disk === '0' || o.disk === 'none' ? 0 : parseSize(o.disk, 'disk cap');
  return l;
}
