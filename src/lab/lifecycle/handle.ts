import type { MachineHandle } from '../../drivers/driver.js';
import type { SandboxRecord } from '../../store/records.js';

/** What a driver needs of a sandbox record to find its machine. */
export function handleOf(s: SandboxRecord): MachineHandle {
  return { id: s.id, pid: s.pid ?? 0, pidStart: s.pidStart ?? 0, ...(s.init ? { init: s.init } : {}) };
}
