import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { cgroupFor, destroyCgroup } from '../host/cgroups.js';
import { sameProcess } from '../host/procs.js';
import type { MachineHandle } from './driver.js';

/**
 * What every driver's destroy does: SIGKILL the machine's init (the agent as PID 1 of its pid
 * namespace, which takes every other process with it; or QEMU), sweep its cgroup, remove its run
 * directory. The pid is checked against its start time so that a reused pid is never killed.
 * The run directory goes last, only once the cgroup is gone: it is how gc knows a cgroup is
 * this home's. `timeoutMs`: how long the killed processes may take to leave the cgroup (a QEMU
 * with hundreds of MiB of guest RAM takes seconds to exit on a loaded host).
 */
export async function killAndSweep(home: string, handle: MachineHandle, timeoutMs = 5000): Promise<void> {
  if (handle.pid > 0 && (await sameProcess(handle.pid, handle.pidStart))) {
    try {
      process.kill(handle.pid, 'SIGKILL');
    } catch {
      /* already gone */
    }
  }
  await destroyCgroup(cgroupFor(handle.id), timeoutMs);
  await rm(join(home, 'run', handle.id), { recursive: true, force: true });
}
