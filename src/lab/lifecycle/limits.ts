import { DEFAULT_LIMITS } from '../../defaults.js';
import { findDriverInfo } from '../../drivers/registry.js';
import type { Limits } from '../../store/records.js';

/**
 * A machine's limits: what was asked, else the driver's own default memory (a VM's is its guest's
 * RAM: smaller), else the lab's defaults. An unknown driver gets the lab's (its raise says why not).
 */
export function withDefaults(l: Limits | undefined, driver?: string): Limits {
  const memoryBytes = findDriverInfo(driver)?.memory.defaultBytes;
  return { ...DEFAULT_LIMITS, ...(memoryBytes === undefined ? {} : { memoryBytes }), ...l };
}
