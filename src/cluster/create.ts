/**
 * A create in the cluster, whoever asks (the HTTP gateway, a GatewayLab): placed, its name taken
 * in the store for that node before it starts, the key's quota checked cluster-wide, then sent;
 * one that never reached its node is placed once more, elsewhere, its claim moved with it.
 */
import { randomUUID } from 'node:crypto';
import { SnaplabError } from '../errors.js';
import { defaultName, newId } from '../lab/names.js';
import { clusterOwner, type Caller } from '../server/keys.js';
import { QuotaError } from '../server/http-errors.js';
import type { ClusterCore } from './core.js';
import type { PlacementRequest } from './placement.js';
import type { Claim, SandboxEntry } from './store.js';
import { noted } from '../cleanup.js';

/** a create's claim in the store lapses after this, whatever became of the gateway that made it */
const CLAIM_TTL_S = 360;

export interface PlacedCreate {
  /** where it may go */
  request: PlacementRequest;
  /** the name asked for (none for a pool's standby: it keeps its own) */
  given?: string;
  /** a pool's standby: no name is taken for it */
  standby: boolean;
}

/**
 * Send the create to its node: `send(node, name)` makes it there, with the name claimed for it
 * (undefined for a standby), and resolves with the node's view. Errors as ask() or fromNode()
 * mark them (`connect`: never reached; `status`: answered).
 */
export type SendCreate = (node: string, name: string | undefined) => Promise<Record<string, unknown>>;

/** The name taken cluster-wide for this create, on `node`; the key's quota admitted. */
async function claim(core: ClusterCore, caller: Caller, c: PlacedCreate, node: string): Promise<Claim> {
  const id = newId();
  let got: Claim | null = null;
  while (!got) {
    got = await core.store.claimCreate(
      id,
      node,
      clusterOwner(caller.key),
      c.standby ? undefined : (c.given ?? defaultName(newId())),
      CLAIM_TTL_S,
    );
    if (!got && c.given)
      throw new SnaplabError(
        'SANDBOX_EXISTS',
        `a sandbox named ${c.given} exists in the cluster`,
        'pick another name, or remove that one',
      );
  }
  // a key's quota holds cluster-wide: its sandboxes and the creates claimed before this one
  if (caller.maxSandboxes !== null) {
    const q = await core.store.withinQuota(got, caller.maxSandboxes);
    if (!q.ok) {
      await core.store.endCreate(got, 'refused');
      throw new QuotaError(
        'maxSandboxes',
        `key ${caller.key} has ${q.have} of its ${caller.maxSandboxes} sandboxes in the cluster`,
        5,
      );
    }
  }
  return got;
}

/**
 * Where a new sandbox is, written before its create is answered: the client's next call may
 * come through another gateway before its node has written it (the node's own entry, when it
 * comes, is the same). Never over an entry the node has written already.
 */
async function record(core: ClusterCore, v: Record<string, unknown>, node: string, caller: Caller): Promise<void> {
  const e: SandboxEntry = {
    id: String(v.id),
    name: String(v.name),
    node,
    owner: clusterOwner(caller.key),
    state: String(v.state ?? 'running'),
    image: (v.image as string) ?? null,
    labels: (v.labels as Record<string, string>) ?? {},
    createdAt: Date.parse(String(v.createdAt)) || Date.now(),
    reason: null,
  };
  core.view.sandboxes.set(e.id, e);
  core.view.names.set(e.name, { node, id: e.id, owner: e.owner, at: e.createdAt });
  await core.store.putSandboxIfAbsent(e);
}

/** A note on the cluster's event stream (create retried…), kept 10 minutes. */
async function note(core: ClusterCore, type: string, data: Record<string, unknown>): Promise<void> {
  const lease = core.store.client.lease(600, { autoKeepAlive: false });
  await lease
    .put(core.store.key('notes', `${Date.now()}-${randomUUID()}`))
    .value(JSON.stringify({ type, at: Date.now(), ...data }))
    .catch(noted(`store a cluster note (${type})`));
  lease.release();
}

/** Placed, claimed and sent; the node's view and the node. */
export async function placeCreate(
  core: ClusterCore,
  caller: Caller,
  c: PlacedCreate,
  send: SendCreate,
): Promise<{ value: Record<string, unknown>; node: string }> {
  const first = (await core.place(c.request, caller)).name;
  const held = await claim(core, caller, c, first);
  for (let attempt = 0; ; attempt++) {
    const node = held.node;
    let made = false;
    try {
      // a node gone since it was placed is one the create never reached
      if (!core.view.live(node))
        throw Object.assign(
          new SnaplabError('NODE_UNAVAILABLE', `node ${node} left the cluster`, 'see `snaplab cluster nodes`'),
          { connect: true },
        );
      const value = await send(node, held.name);
      made = true;
      await record(core, value, node, caller);
      await core.store.endCreate(held, 'made').catch(noted("end the create's claim"));
      return { value, node };
    } catch (e) {
      const connect = (e as { connect?: boolean }).connect === true;
      // refused at connect: it never reached the node, which made nothing; placed once more,
      // elsewhere, the claim (its name and its place in the quota's order) moved with it
      if (!made && connect && attempt === 0 && (await moved(core, caller, c, held, e))) continue;
      // the node said no: nothing was made, the claim and name go. Made, or gone during it:
      // they stay on their lease (the node's own entries take over if it made the sandbox)
      const answered = (e as { status?: number }).status !== undefined;
      await core.store
        .endCreate(held, made ? 'made' : answered || connect ? 'refused' : 'unknown')
        .catch(noted("end the create's claim"));
      throw e;
    }
  }
}

/** The claim moved to another node (true), or there is none to move it to (it is ended then). */
async function moved(core: ClusterCore, caller: Caller, c: PlacedCreate, held: Claim, e: unknown): Promise<boolean> {
  const from = held.node;
  const next = await core.place({ ...c.request, exclude: new Set([from]) }, caller).catch(async (err: unknown) => {
    await core.store.endCreate(held, 'refused').catch(noted("end the create's claim"));
    throw err;
  });
  if (!(await core.store.moveCreate(held, next.name))) return false;
  const reason = (e as Error).message;
  await note(core, 'create.retried', { from, to: next.name, name: held.name ?? null, reason });
  core.log({ msg: 'create retried on another node', from, to: next.name, error: reason });
  return true;
}
