/**
 * A sandbox's create, view and destroy in a cluster (server/served-lab.ts, RouteHost): a create is
 * placed (placement.ts), its name taken in the store for that node before it starts, then made by
 * the node (create.ts: one that never reached its node is placed once more, elsewhere); a view or
 * a destroy goes to the node that holds it, and a sandbox whose node lapsed or stopped is what the
 * store knows of it (lost, or unreachable).
 */
import { resolveCreate, type CreateInputs } from '../sdk/create-options.js';
import type { Caller } from '../server/keys.js';
import type { CreateBody } from '../server/schemas.js';
import type { ClusterCore } from './core.js';
import { placeCreate } from './create.js';
import { absentView } from './gateway-api.js';
import type { PlacementRequest } from './placement.js';
import { ask } from './proxy.js';

/** a node's create is bounded by its own limit (300 s, then cleaned); the gateway waits a little longer */
const CREATE_TIMEOUT_MS = 330_000;

const enc = encodeURIComponent;

/** POST /sandboxes: placed, claimed and sent on; the answer has its node. */
export async function createOnNode(
  core: ClusterCore,
  caller: Caller,
  { placement, ...body }: CreateBody,
): Promise<{ view: Record<string, unknown>; opId: string | null }> {
  // defaulted as a node will (the schema checked it): placement needs the image
  const asked = resolveCreate(body as CreateInputs);
  const pool = asked.from === 'pool' ? asked.pool : undefined;
  const snapshot = asked.from === 'snapshot' ? asked.snapshot : undefined;
  const image = asked.from === 'image' ? asked.image : undefined;
  const request: PlacementRequest = { pool, snapshot, image, labels: placement?.labels };
  const given = pool === undefined ? body.name : undefined;
  const { value, node } = await placeCreate(
    core,
    caller,
    { request, given, standby: pool !== undefined },
    async (n, name) =>
      (
        await ask<Record<string, unknown>>(
          core.node(n).url,
          n,
          core.token,
          caller,
          'POST',
          '/sandboxes',
          name === undefined ? body : { ...body, name },
          CREATE_TIMEOUT_MS,
        )
      ).value,
  );
  return { view: { ...value, node }, opId: null };
}

/** GET /sandboxes/{id}: its node's view, with its node; lost or unreachable from the store. */
export async function viewOnNode(
  core: ClusterCore,
  caller: Caller,
  idOrName: string,
): Promise<Record<string, unknown>> {
  const { view } = core;
  const r = view.resolve(idOrName);
  if (r?.entry && core.owns(caller, r.entry) && (r.entry.state === 'lost' || !view.live(r.node)))
    return absentView(r.entry, view.left.has(r.node));
  const node = await core.nodeOf(idOrName, caller);
  const v = await ask<Record<string, unknown>>(
    core.node(node).url,
    node,
    core.token,
    caller,
    'GET',
    `/sandboxes/${enc(idOrName)}`,
  );
  return { ...v.value, node };
}

/**
 * DELETE /sandboxes/{id}: on its node. A lost sandbox's record is all there is of it here:
 * removing it is the delete (its node, if it comes back, still destroys it: the record stays as
 * a tombstone for a day).
 */
export async function destroyOnNode(core: ClusterCore, caller: Caller, idOrName: string): Promise<void> {
  const r = core.view.resolve(idOrName);
  if (r?.entry?.state === 'lost' && core.owns(caller, r.entry) && (await core.store.forget(r.entry))) return;
  const node = await core.nodeOf(idOrName, caller);
  // as long as the node's destroy takes
  await ask(core.node(node).url, node, core.token, caller, 'DELETE', `/sandboxes/${enc(idOrName)}`, undefined, 0);
}
