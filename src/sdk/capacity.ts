import { capacityOf as ofDriver } from '../drivers/capacity.js';
import { findDriverInfo } from '../drivers/registry.js';
import type { SandboxApi } from './api.js';

/**
 * The CPUs and memory a sandbox has, from its limits and its driver's defaults (a VM's one
 * virtual CPU), else the host's: what its usage samples are out of, for a front that shows it
 * without sampling (the E2B front's getInfo and list).
 */
export function capacityOf(box: Pick<SandboxApi, 'limits' | 'driver'>): { cpus: number; memoryTotalBytes: number } {
  return ofDriver(box.limits, findDriverInfo(box.driver));
}
