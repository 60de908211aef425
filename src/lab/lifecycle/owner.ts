import { ownStartTime, pidAlive, sameProcess } from '../../host/procs.js';
import type { Owner } from '../../store/records.js';

/** This process as the owner of a record in step `op`. */
export function me(op: Owner['op']): Owner {
  return { pid: process.pid, start: ownStartTime(), op };
}

/**
 * Does the owner still run? The same pid with the same start time: a pid the kernel has given to
 * another process since is not the owner. Owners carried over from the old reason text have no
 * start time (the pid alone is checked, as it was then) or, dead ones, no pid (gone). An owner
 * whose /proc entry cannot be read (EMFILE, EACCES) may still run: alive (procs.ts liveness).
 */
export async function ownerAlive(o: Owner | null | undefined): Promise<boolean> {
  if (!o || o.pid === null) return false;
  return o.start === null ? pidAlive(o.pid) : sameProcess(o.pid, o.start);
}
