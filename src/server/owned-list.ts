/**
 * The sandboxes a caller may list: a key without admin sees its own, and asking for another
 * owner's gives nothing. GET /sandboxes and an in-process keyed lab (keyed-lab.ts) both ask this.
 */
import type { LabApi, ListOptions } from '../sdk/api.js';
import type { Caller } from './keys.js';
import type { RouteHost } from './served-lab.js';

export async function listFor(
  h: Pick<RouteHost, 'labFor' | 'ownedBy'>,
  caller: Caller,
  opts: ListOptions,
): Promise<Awaited<ReturnType<LabApi['list']>>> {
  const mine = h.ownedBy(caller);
  // owner: null asks for those made without a key; undefined for any the caller may see
  const asked = opts.owner;
  if (mine !== undefined && asked !== undefined && asked !== mine) return [];
  return h.labFor(caller).list({ ...opts, owner: mine ?? asked });
}
