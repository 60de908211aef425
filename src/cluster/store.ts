/**
 * The cluster's state in etcd (docs/cluster.md): which nodes are up (each under a lease it keeps
 * alive), where each sandbox lives, the API keys and the token nodes and gateways share. etcd
 * keeps it replicated and consistent; snaplab has no consensus, election or membership of its own.
 *
 *   <prefix>nodes/<node>      NodeInfo, on the node's lease: gone when the node stops or lapses
 *   <prefix>sandboxes/<id>    SandboxEntry, written by the node that holds it; `lost` once its node lapsed
 *   <prefix>names/<name>      NameEntry: the name taken cluster-wide, and where (written before the create)
 *   <prefix>creates/<id>      CreateClaim: a create in flight, on a lease (written before the create)
 *   <prefix>drain/<node>      a node that takes no new sandboxes (`snaplab cluster drain`)
 *   <prefix>left/<node>       a node that stopped on purpose: its sandboxes are unreachable, not lost
 *   <prefix>keys/<name>       an API key (its sha256 only), as the single daemon's store keeps them
 *   <prefix>token             the secret gateways send nodes (made by the first member to need it)
 */
import { randomBytes } from 'node:crypto';
import {
  STMConflictError,
  type Etcd3,
  type IOperation,
  type IOptions,
  type Isolation,
  type Lease,
  type SoftwareTransaction as STM,
  type Watcher,
} from 'etcd3';
import { SnaplabError } from '../errors.js';
import type { ApiKeyRecord } from '../store/records.js';
import { noted } from '../cleanup.js';

/**
 * How a read-check-write transaction reads (etcd3's STM isolation RepeatableReads: its `const enum`
 * has no runtime object): each read a serializable one, from the member its connection picks, and
 * the commit (a transaction the leader orders) checks that none of what was read has changed
 * since; if one has, or the member was behind, the whole is tried again. The default
 * (SerializableSnapshot) reads all but the first at the first one's revision; a member behind that
 * revision refuses ("mvcc: required revision is a future revision"), which failed a create in the
 * suite's three-member cluster. STM's own retries come at once, before a lagging member can catch
 * up: `transact` below spaces further attempts.
 */
const READ_CHECKED = { retries: 2, isolation: 2 as Isolation };
/** attempts of a read-check-write transaction, each after the one before failed with a conflict */
const TRANSACT_ATTEMPTS = 5;

export interface NodeInfo {
  name: string;
  /** where gateways reach its API (http://HOST:PORT) */
  url: string;
  labels: Record<string, string>;
  version: string;
  pid: number;
  home: string;
  startedAt: number;
  updatedAt: number;
  capacity: { cores: number; memoryBytes: number; memoryFreeBytes: number; diskBytes: number; diskFreeBytes: number };
  /** sandboxes it holds (not counting pool standbys) */
  sandboxes: number;
  /** each pool's ready standbys: what placement prefers */
  pools: Record<string, { image: string; size: number; ready: number }>;
  images: string[];
  snapshots: string[];
  drivers: string[];
  storage: string[];
}

export interface SandboxEntry {
  id: string;
  name: string;
  node: string;
  owner: string | null;
  state: string;
  image: string | null;
  labels: Record<string, string>;
  createdAt: number;
  reason?: string | null;
  lostAt?: number;
  /** its machine was stopped (`stop`): state dead, its volume kept for a `start` */
  stopped?: boolean;
}

export interface NameEntry {
  node: string;
  /** null while its create runs */
  id: string | null;
  /** the key that asked for it (quotas count creates in flight) */
  owner?: string | null;
  at: number;
}

/** A create this gateway has claimed: where, for whom, under which name and lease. */
export interface Claim {
  id: string;
  node: string;
  owner: string | null;
  name: string | undefined;
  leaseId: string;
}

/** states of a sandbox its node still holds (a lost or forgotten one is not counted) */
export const HELD_STATES: ReadonlySet<string> = new Set(['creating', 'running', 'paused', 'dead']);

/** A create in flight (`creates/<id>`): counted in placement's load and the key's quota. */
export interface CreateClaim {
  node: string;
  owner: string | null;
  name: string | null;
  at: number;
}

/** A cluster's key: the single daemon's record, kept in etcd instead of SQLite. */
export type KeyEntry = ApiKeyRecord;

export interface ClusterAddress {
  hosts: string[];
  prefix: string;
}

/** `etcd://HOST:PORT[,HOST:PORT…][/prefix]` (default prefix /snaplab/). */
export function parseClusterUrl(text: string): ClusterAddress {
  const m = /^etcd:\/\/([^/]+)(\/.*)?$/.exec(text.trim());
  const hosts = (m?.[1] ?? '').split(',').filter(Boolean);
  if (!m || !hosts.length || hosts.some((h) => !/^(\[[0-9a-f:]+\]|[A-Za-z0-9.-]+):\d{1,5}$/i.test(h))) {
    throw new SnaplabError(
      'BAD_INPUT',
      `invalid cluster address ${JSON.stringify(text)}`,
      'give etcd://HOST:PORT[,HOST:PORT…][/prefix], e.g. etcd://127.0.0.1:2379',
    );
  }
  let prefix = m[2] && m[2] !== '/' ? m[2] : '/snaplab/';
  if (!prefix.endsWith('/')) prefix += '/';
  return { hosts, prefix };
}

/** how long a removed lost record stays, for its node to destroy the sandbox if it comes back */
const TOMBSTONE_TTL_S = 86_400;

/** how long one call to etcd may take before it fails with CLUSTER_UNAVAILABLE */
const CALL_DEADLINE_MS = 5000;

const json = <T>(s: string | null): T | undefined => (s === null ? undefined : (JSON.parse(s) as T));

/** etcd's own errors (a member down, no leader, a timeout) as one clear code. */
export function unavailable(e: unknown, what: string): SnaplabError {
  if (e instanceof SnaplabError) return e;
  return new SnaplabError(
    'CLUSTER_UNAVAILABLE',
    `the cluster store did not answer (${what}): ${(e as Error).message}`,
    'check that a majority of the etcd members are up and reachable (--cluster)',
    { cause: e },
  );
}

export class ClusterStore {
  private constructor(
    readonly client: Etcd3,
    readonly address: ClusterAddress,
  ) {}

  static async open(url: string): Promise<ClusterStore> {
    const address = parseClusterUrl(url);
    const { Etcd3 } = await import('etcd3');
    // every unary call has a deadline (a cluster without a majority must not hang a request);
    // watches and lease keep-alives are streams and have none
    const opts: IOptions = {
      hosts: address.hosts.map((h) => `http://${h}`),
      dialTimeout: 3000,
      defaultCallOptions: (c) => (c.isStream ? {} : { deadline: Date.now() + CALL_DEADLINE_MS }),
    };
    const store = new ClusterStore(new Etcd3(opts), address);
    // a first read: a wrong address is an error now, not at the first request
    await store.client
      .get(`${address.prefix}token`)
      .string()
      .catch((e: unknown) => {
        store.close();
        throw unavailable(e, `reaching ${address.hosts.join(', ')}`);
      });
    return store;
  }

  key(...parts: string[]): string {
    return this.address.prefix + parts.join('/');
  }

  /** The secret gateways give nodes: made once, by whichever member needs it first. */
  async token(): Promise<string> {
    const k = this.key('token');
    await this.client
      .if(k, 'Create', '==', 0)
      .then(this.client.put(k).value(randomBytes(32).toString('base64url')))
      .commit();
    const t = await this.client.get(k).string();
    if (!t)
      throw new SnaplabError('CLUSTER_UNAVAILABLE', 'the cluster token could not be read', 'check the etcd cluster');
    return t;
  }

  async nodes(): Promise<NodeInfo[]> {
    const all = await this.client.getAll().prefix(this.key('nodes', '')).strings();
    return Object.values(all).map((v) => JSON.parse(v) as NodeInfo);
  }

  async drained(): Promise<Set<string>> {
    return new Set(
      Object.keys(await this.client.getAll().prefix(this.key('drain', '')).strings()).map((k) =>
        k.slice(this.key('drain', '').length),
      ),
    );
  }

  async setDrain(node: string, on: boolean): Promise<void> {
    if (on) await this.client.put(this.key('drain', node)).value(JSON.stringify({ at: Date.now() }));
    else await this.client.delete().key(this.key('drain', node));
  }

  async left(): Promise<Set<string>> {
    return new Set(
      Object.keys(await this.client.getAll().prefix(this.key('left', '')).strings()).map((k) =>
        k.slice(this.key('left', '').length),
      ),
    );
  }

  async sandboxes(): Promise<SandboxEntry[]> {
    return Object.values(await this.client.getAll().prefix(this.key('sandboxes', '')).strings()).map(
      (v) => JSON.parse(v) as SandboxEntry,
    );
  }

  async sandbox(id: string): Promise<SandboxEntry | undefined> {
    return json<SandboxEntry>(await this.client.get(this.key('sandboxes', id)).string());
  }

  async name(name: string): Promise<NameEntry | undefined> {
    return json<NameEntry>(await this.client.get(this.key('names', name)).string());
  }

  /**
   * A create placed on `node`, recorded before it starts (`creates/<id>`, and `names/<name>` when
   * it has one). Both are on a lease of their own that outlasts any create, so a gateway that dies
   * mid-create leaves nothing behind for long; the node's own entries, written without a lease,
   * take over once it has made the sandbox. Null if the name is taken.
   */
  async claimCreate(
    id: string,
    node: string,
    owner: string | null,
    name: string | undefined,
    ttlS: number,
  ): Promise<Claim | null> {
    const lease = this.client.lease(ttlS, { autoKeepAlive: false });
    const leaseId = await lease.grant();
    lease.release();
    const claim: Claim = { id, node, owner, name, leaseId };
    const ops = this.claimOps(claim);
    // a new id is never taken; a name may be
    const r = await this.client
      .if(this.key(...(name === undefined ? ['creates', id] : ['names', name])), 'Create', '==', 0)
      .then(...ops)
      .commit();
    if (!r.succeeded)
      await this.client.leaseClient.leaseRevoke({ ID: leaseId }).catch(noted(`revoke lease ${leaseId}`));
    return r.succeeded ? claim : null;
  }

  private claimOps(c: Claim): IOperation[] {
    const at = Date.now();
    return [
      this.client
        .put(this.key('creates', c.id))
        .value(JSON.stringify({ node: c.node, owner: c.owner, name: c.name ?? null, at } satisfies CreateClaim))
        .lease(c.leaseId),
      ...(c.name === undefined
        ? []
        : [
            this.client
              .put(this.key('names', c.name))
              .value(JSON.stringify({ node: c.node, id: null, owner: c.owner, at } satisfies NameEntry))
              .lease(c.leaseId),
          ]),
    ];
  }

  /**
   * A create that never reached its node, placed on another: the claim and its name move in one
   * transaction, keeping their place in the store's order (a key rewritten keeps its creation
   * revision) and the name. False if the claim is gone (its lease lapsed).
   */
  async moveCreate(c: Claim, to: string): Promise<boolean> {
    const moved = { ...c, node: to };
    const r = await this.client
      .if(this.key('creates', c.id), 'Create', '>', 0)
      .then(...this.claimOps(moved))
      .commit();
    if (r.succeeded) c.node = to;
    return r.succeeded;
  }

  /**
   * Is create `c` within `max` sandboxes of its owner? The owner's sandboxes and the creates
   * claimed before this one (the store's revision order, whichever gateway made them), read at
   * one revision.
   */
  async withinQuota(c: Claim, max: number): Promise<{ ok: boolean; have: number }> {
    const r = await this.client
      .if(this.key('creates', c.id), 'Create', '>', 0)
      .then(
        this.client.getAll().prefix(this.key('creates', '')),
        this.client.getAll().prefix(this.key('sandboxes', '')),
      )
      .commit();
    const [creates, boxes] = r.responses.map((x) => x.response_range?.kvs ?? []);
    const mine = creates!.find((kv) => kv.key.toString() === this.key('creates', c.id));
    if (!mine) return { ok: false, have: max };
    let have = creates!.filter(
      (kv) =>
        BigInt(kv.create_revision) < BigInt(mine.create_revision) &&
        (JSON.parse(kv.value.toString()) as CreateClaim).owner === c.owner,
    ).length;
    for (const kv of boxes!) {
      const e = JSON.parse(kv.value.toString()) as SandboxEntry;
      if (e.owner === c.owner && HELD_STATES.has(e.state)) have++;
    }
    return { ok: have < max, have };
  }

  /**
   * The create is over. Refused by its node, or made and recorded: the lease is revoked (the
   * claim goes, and the name too unless an entry, written without a lease, holds it now). Its
   * outcome unknown (the node went mid-create): they stay on their lease, which lapses unless the
   * node wrote its own entries meanwhile.
   */
  async endCreate(c: Claim, outcome: 'refused' | 'made' | 'unknown'): Promise<void> {
    // made: the entry is written (by the gateway or the node, without a lease), the claim may go
    if (outcome !== 'unknown') await this.client.leaseClient.leaseRevoke({ ID: c.leaseId });
  }

  /** A read-check-write transaction; on a conflict (a read changed, or was stale) tried again after 20, 40, 80, 160 ms. */
  private async transact(fn: (tx: STM) => Promise<void>): Promise<void> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.client.stm(READ_CHECKED).transact(fn);
      } catch (e) {
        if (!(e instanceof STMConflictError) || attempt >= TRANSACT_ATTEMPTS) throw e;
        await new Promise((r) => setTimeout(r, 10 * 2 ** attempt));
      }
    }
  }

  /** Write what a node holds: the entries given, and the names with them. */
  async putSandbox(e: SandboxEntry): Promise<void> {
    const nk = this.key('names', e.name);
    const name = JSON.stringify({ node: e.node, id: e.id, owner: e.owner, at: e.createdAt } satisfies NameEntry);
    await this.transact(async (tx) => {
      await tx.put(this.key('sandboxes', e.id)).value(JSON.stringify(e));
      // the name only if it is free, this sandbox's, or claimed for its create on this node:
      // never over another sandbox's (one reused after a lost record was removed)
      const cur = json<NameEntry>(await tx.get(nk).string());
      if (!cur || cur.id === e.id || (cur.id === null && cur.node === e.node)) await tx.put(nk).value(name);
    });
  }

  /** The same, unless the node wrote the sandbox's entry first; the name only where putSandbox would. */
  async putSandboxIfAbsent(e: SandboxEntry): Promise<void> {
    const nk = this.key('names', e.name);
    await this.transact(async (tx) => {
      if (await tx.get(this.key('sandboxes', e.id)).string()) return;
      await tx.put(this.key('sandboxes', e.id)).value(JSON.stringify(e));
      const cur = json<NameEntry>(await tx.get(nk).string());
      if (!cur || cur.id === e.id || (cur.id === null && cur.node === e.node))
        await tx
          .put(nk)
          .value(JSON.stringify({ node: e.node, id: e.id, owner: e.owner, at: e.createdAt } satisfies NameEntry));
    });
  }

  async deleteSandbox(e: Pick<SandboxEntry, 'id' | 'name' | 'node'>): Promise<void> {
    const nk = this.key('names', e.name);
    // the name goes only if it is still this sandbox's (it may have been taken again since)
    const cur = await this.name(e.name);
    const ops = [this.client.delete().key(this.key('sandboxes', e.id))];
    await this.client
      .if(nk, 'Create', '>', 0)
      .then(
        ...ops,
        ...(cur && (cur.id === e.id || (cur.id === null && cur.node === e.node)) ? [this.client.delete().key(nk)] : []),
      )
      .commit();
  }

  /**
   * A lost sandbox's record removed by its owner: its name is free again, and the entry stays as
   * a `forgotten` tombstone on a day's lease, so that its node, if it comes back, destroys it.
   */
  async forget(e: SandboxEntry): Promise<boolean> {
    const lease = this.client.lease(TOMBSTONE_TTL_S, { autoKeepAlive: false });
    const id = await lease.grant();
    lease.release();
    const k = this.key('sandboxes', e.id);
    const r = await this.client
      .if(k, 'Value', '==', JSON.stringify(e))
      .then(
        this.client
          .put(k)
          .value(JSON.stringify({ ...e, state: 'forgotten' }))
          .lease(id),
      )
      .commit();
    // changed meanwhile (its node came back and wrote it again): not ours to forget
    if (!r.succeeded) return false;
    const cur = await this.name(e.name);
    if (cur?.id === e.id) await this.client.delete().key(this.key('names', e.name));
    return true;
  }

  /** Mark a lapsed node's sandboxes lost (idempotent: several gateways may do it at once). */
  async markLost(node: string, reason: string): Promise<SandboxEntry[]> {
    const marked: SandboxEntry[] = [];
    for (const e of await this.sandboxes()) {
      if (e.node !== node || !HELD_STATES.has(e.state)) continue;
      const lost: SandboxEntry = { ...e, state: 'lost', reason, lostAt: Date.now() };
      const k = this.key('sandboxes', e.id);
      // only if nobody changed it meanwhile (the node came back and wrote it again)
      // and only while the node is still out: one that came back meanwhile keeps its sandboxes
      const r = await this.client
        .if(k, 'Value', '==', JSON.stringify(e))
        .and(this.key('nodes', node), 'Create', '==', 0)
        .then(this.client.put(k).value(JSON.stringify(lost)))
        .commit();
      if (r.succeeded) marked.push(lost);
    }
    // creates placed there that never recorded a sandbox: their names are free again
    const names = await this.client.getAll().prefix(this.key('names', '')).strings();
    for (const [k, v] of Object.entries(names)) {
      const n = JSON.parse(v) as NameEntry;
      if (n.node === node && n.id === null)
        await this.client
          .if(k, 'Value', '==', v)
          .and(this.key('nodes', node), 'Create', '==', 0)
          .then(this.client.delete().key(k))
          .commit();
    }
    return marked;
  }

  async keys(): Promise<KeyEntry[]> {
    return Object.values(await this.client.getAll().prefix(this.key('keys', '')).strings()).map(
      (v) => JSON.parse(v) as KeyEntry,
    );
  }

  async insertKey(k: KeyEntry): Promise<boolean> {
    const kk = this.key('keys', k.name);
    return (
      await this.client
        .if(kk, 'Create', '==', 0)
        .then(this.client.put(kk).value(JSON.stringify(k)))
        .commit()
    ).succeeded;
  }

  async deleteKey(name: string): Promise<boolean> {
    return (await this.client.delete().key(this.key('keys', name)).exec()).deleted !== '0';
  }

  /** Watch everything under prefix `sub` from revision `from` (exclusive); the watcher reconnects by itself. */
  async watch(sub: string, from?: string): Promise<Watcher> {
    const b = this.client.watch().prefix(this.key(sub));
    if (from) b.startRevision(String(BigInt(from) + 1n));
    return b.create();
  }

  lease(ttlS: number): Lease {
    return this.client.lease(ttlS, { autoKeepAlive: true });
  }

  close(): void {
    this.client.close();
  }
}
