import { readdir, rm } from 'node:fs/promises';
import { orElse } from '../cleanup.js';
import { join } from 'node:path';
import { cgroupFor, destroyCgroup, removeEmptySnaplabParents, snaplabCgroupsOf } from '../host/cgroups/cgroups.js';
import { liveness } from '../host/procs.js';
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
  // killed only when known to be the machine's (a pid /proc could not read may have been reused);
  // the cgroup sweep below kills every process of the machine either way
  if (handle.pid > 0 && (await liveness(handle.pid, handle.pidStart)).state === 'alive') {
    try {
      process.kill(handle.pid, 'SIGKILL');
    } catch {
      /* already gone */
    }
  }
  await destroyCgroup(cgroupFor(handle.id), timeoutMs);
  await rm(join(home, 'run', handle.id), { recursive: true, force: true });
}

/**
 * What every driver's gc does for machines that are not live: their cgroups (and any process in
 * them) and run directories, both named by the sandbox id whatever the driver. Cgroups are
 * host-wide but several homes (several labs) may share a host, so a cgroup belongs to this home
 * when this home has its run directory: raise makes the run directory before the cgroup and
 * destroy removes it after, so a crash at any point leaves it findable.
 */
export async function gcMachines(home: string, isLive: (id: string) => boolean): Promise<string[]> {
  const removed: string[] = [];
  // sandbox ids only: other directories under run/ belong to others (run/net: scenarios)
  const runs = new Set(
    (await readdir(join(home, 'run')).catch(orElse([] as string[], 'readdir', 'ENOENT'))).filter((d) =>
      /^[0-9a-f]{12}$/.test(d),
    ),
  );
  // only the cgroups of this home's run directories that are not live are looked up (the host's
  // whole list is every home's sandboxes: a gc with nothing to do looks up none)
  for (const cg of await snaplabCgroupsOf([...runs].filter((id) => !isLive(id)))) {
    if (isLive(cg.id)) continue;
    // a VM's QEMU may take seconds to exit (see killAndSweep); one stuck cgroup must not stop gc
    const gone = await destroyCgroup(cg, 20_000).then(
      () => true,
      () => false,
    );
    if (gone) removed.push(`cgroup ${cg.dirs[0] ?? cg.id} (and any process in it)`);
    else runs.delete(cg.id); // kept: its run directory is how the next gc knows the cgroup is this home's
  }
  await removeEmptySnaplabParents();
  for (const id of runs) {
    if (isLive(id)) continue;
    await rm(join(home, 'run', id), { recursive: true, force: true });
    removed.push(`run directory ${join(home, 'run', id)}`);
  }
  return removed;
}
