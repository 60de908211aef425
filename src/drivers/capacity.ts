import { availableParallelism, totalmem } from 'node:os';
import type { Limits } from '../store/records.js';
import type { DriverInfo } from './driver.js';

/**
 * The CPUs and memory a machine has: its limits (CPUs rounded up), else its driver's default (a
 * VM's one virtual CPU), else the host's. What a sample of its use is out of (lab/io/usage.ts)
 * and what the E2B front says it has (cpuCount, memoryMB).
 */
export function capacityOf(limits: Limits, driver: DriverInfo | undefined): { cpus: number; memoryTotalBytes: number } {
  return {
    cpus: limits.cpus ? Math.max(1, Math.ceil(limits.cpus)) : (driver?.defaultCpus ?? availableParallelism()),
    memoryTotalBytes: limits.memoryBytes ?? totalmem(),
  };
}
