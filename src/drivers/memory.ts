import { SnaplabError } from '../errors.js';
import type { DriverInfo } from './driver.js';

const mib = (bytes: number): number => Math.round(bytes / 2 ** 20);

/**
 * Refuse memory below the driver's floor (DriverInfo.memory), before anything is made: `what`
 * names the machine in the message ("machine web, a VM,"), `hint` replaces the default advice.
 */
export function checkMemory(info: DriverInfo, bytes: number, what?: string, hint?: string): void {
  const min = info.memory.minBytes;
  if (min === undefined || bytes >= min) return;
  const dflt = info.memory.defaultBytes;
  throw new SnaplabError(
    'BAD_SIZE',
    `${what ?? info.machineNoun} needs at least ${mib(min)} MiB of memory, not ${mib(bytes)} MiB`,
    hint ?? `give --memory ${mib(min)}M or more${dflt === undefined ? '' : ` (default ${mib(dflt)}M)`}`,
  );
}
