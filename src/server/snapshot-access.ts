/** A snapshot a caller may see, by the server's rules (served-lab.ts, RouteHost): for routes and the Daemon alike. */
import { SnaplabError, isSnaplabError } from '../errors.js';
import type { SnapshotApi } from '../sdk/api.js';
import type { Caller } from './keys.js';
import type { RouteHost } from './served-lab.js';

/**
 * The snapshot `name` as the caller's lab has it, if the caller may see it (`remove`: remove it).
 * Not there or not the caller's: one answer, SNAPSHOT_NOT_FOUND, naming nothing else.
 */
export async function snapshotFor(h: RouteHost, name: string, caller: Caller, remove = false): Promise<SnapshotApi> {
  const snap = await h
    .labFor(caller)
    .snapshot(name)
    .catch((e: unknown) => {
      if (isSnaplabError(e, 'SNAPSHOT_NOT_FOUND')) return undefined;
      throw e;
    });
  if (!snap || !h.snapshotVisible(caller, snap, remove)) throw snapshotGone(name);
  return snap;
}

/** The one answer for a snapshot not there or not the caller's: it names no other. */
function snapshotGone(name: string): SnaplabError {
  return new SnaplabError(
    'SNAPSHOT_NOT_FOUND',
    `no snapshot named ${JSON.stringify(name)}`,
    'list them with GET /snapshots',
  );
}

/**
 * For what acts on a snapshot after `snapshotFor` let it: one removed meanwhile (another request's
 * delete) fails in the lab with a hint naming the host's snapshots, others' too; it is answered as
 * `snapshotFor` answers.
 */
export const asGone =
  (name: string) =>
  (e: unknown): never => {
    if (isSnaplabError(e, 'SNAPSHOT_NOT_FOUND')) throw snapshotGone(name);
    throw e;
  };
