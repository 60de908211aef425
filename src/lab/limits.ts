import { findDriverInfo } from '../drivers/registry.js';
import type { Limits } from '../store/records.js';

/**
 * Limits every sandbox gets unless told otherwise: without them one fork bomb exhausts the host's
 * pid space and one runaway process its memory. Generous enough for builds and tests; raise them
 * per sandbox (--memory, --pids) as needed. No CPU limit by default: the scheduler shares cores.
 */
export const DEFAULT_LIMITS: Readonly<Limits> = { memoryBytes: 1024 ** 3, pids: 1024 };

/**
 * What a machine may write to its own filesystem unless told otherwise (`--disk`): without a cap,
 * one sandbox fills the storage pool that every sandbox and snapshot shares (a 3 GiB write went
 * through before). Applied where a cap costs nothing (btrfs with simple quotas); overlay and dir
 * make a filesystem per capped machine, so only an explicit --disk (or a snapshot's) caps there;
 * where no cap can hold (a VM) an explicit --disk is refused. `snaplab doctor` says which.
 */
export const DEFAULT_DISK_BYTES = 4 * 1024 ** 3;

/**
 * A machine's limits: what was asked, else the driver's own default memory (a VM's is its guest's
 * RAM: smaller), else the lab's defaults. An unknown driver gets the lab's (its raise says why not).
 */
export function withDefaults(l: Limits | undefined, driver?: string): Limits {
  const memoryBytes = findDriverInfo(driver)?.memory.defaultBytes;
  return { ...DEFAULT_LIMITS, ...(memoryBytes === undefined ? {} : { memoryBytes }), ...l };
}
