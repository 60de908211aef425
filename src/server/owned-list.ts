/**
 * The sandboxes a caller may list: a key without admin sees its own, and asking for another
 * owner's gives nothing. GET /sandboxes, GET /counts/sandboxes and an in-process keyed lab
 * (keyed-lab.ts) all ask this.
 */
import type { CountOptions, LabApi, ListOptions, SandboxCount } from '../sdk/api.js';
import type { Caller } from './keys.js';
import type { RouteHost } from './served-lab.js';

export async function listFor(
  h: Pick<RouteHost, 'labFor' | 'ownedBy'>,
  caller: Caller,
  opts: ListOptions,
): Promise<Awaited<ReturnType<LabApi['list']>>> {
  const owner = ownerFor(h, caller, opts);
  return owner === NONE ? [] : h.labFor(caller).list({ ...opts, owner });
}

/** How many of those a caller may list pass these filters (GET /counts/sandboxes, a keyed lab's count). */
export async function countFor(
  h: Pick<RouteHost, 'labFor' | 'ownedBy'>,
  caller: Caller,
  opts: CountOptions,
): Promise<SandboxCount> {
  const owner = ownerFor(h, caller, opts);
  return owner === NONE ? { total: 0, byState: {} } : h.labFor(caller).count({ ...opts, owner });
}

const NONE = Symbol('none');

/** The owner a caller's list or count is of; NONE: it asked for another key's, and is given nothing. */
function ownerFor(
  h: Pick<RouteHost, 'ownedBy'>,
  caller: Caller,
  opts: { owner?: string | null },
): string | null | undefined | typeof NONE {
  const mine = h.ownedBy(caller);
  // owner: null asks for those made without a key; undefined for any the caller may see
  const asked = opts.owner;
  if (mine !== undefined && asked !== undefined && asked !== mine) return NONE;
  return mine ?? asked;
}
