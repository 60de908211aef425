/**
 * The cluster as a LabApi: a create is placed and claimed (create.ts), then made by the chosen
 * node's remote Lab; a lookup or list is answered from the watched copy and by asking every node,
 * merged; a sandbox's own calls go to its node's remote Sandbox. Every call acts for one caller:
 * a GatewayLab is bound to one (`GatewayLab.open` with a key, or `lab.as(caller)` for another),
 * and its nodes apply that key's scopes and ownership, as they do for the HTTP gateway's requests.
 */
import { checkList, countOf, listFilter, pageOf } from '../sdk/paging.js';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { SnaplabError } from '../errors.js';
import type { RemoteCreateOptions, RemoteLab, RemoteSandbox } from '../client/remote.js';
import type { PoolSpec, PoolStats } from '../lab/pools/admin.js';
import type {
  LabRestoreOptions,
  CheckResult,
  CountOptions,
  LabApi,
  ListOptions,
  PoolApi,
  SandboxApi,
  SandboxCount,
  SnapshotApi,
  StoredTrace,
  TraceQuery,
  CallerInfo,
} from '../sdk/api.js';
import { DEFAULT_IMAGE } from '../defaults.js';
import { describeCaller, type Caller } from '../server/keys.js';
import { ClusterCore, openCluster, type CoreOptions } from './core.js';
import { onNode, refusedBy } from './core-errors.js';
import { noted } from '../cleanup.js';
import { placeCreate } from './create.js';
import { eligible } from './placement.js';
import { AbsentSandbox } from './absent.js';
import { forwardTo, joinSocket, type Upgrade } from './streams.js';
import { ClusterPool, sumPools } from './cluster-pool.js';
import type { NodeInfo } from './store.js';

export interface GatewayLabOptions extends CoreOptions {
  /** etcd://HOST:PORT[,…][/prefix] */
  cluster: string;
  /** the API key (a cluster key: `snaplab key create NAME --cluster …`) the lab acts for */
  token: string;
}

type Placement = { placement?: { labels: Record<string, string> } };

/** A snapshot as its node gave it, with the node. */
const snapshotOf = (v: Record<string, unknown>): SnapshotApi => ({
  name: v.name as string,
  id: v.id as string,
  toJSON: () => v,
});

export class GatewayLab implements LabApi {
  constructor(
    readonly core: ClusterCore,
    readonly caller: Caller,
    /** the core is this lab's own (opened by it): closed with it */
    private readonly owned = false,
  ) {}

  /** A lab over the cluster at `cluster`, acting for the key `token`. */
  static async open(opts: GatewayLabOptions): Promise<GatewayLab> {
    const core = new ClusterCore(await openCluster(opts.cluster, opts.log), opts);
    try {
      return new GatewayLab(core, core.callerOf(opts.token), true);
    } catch (e) {
      await core.close();
      throw e;
    }
  }

  /** The same cluster, acting for another caller (the HTTP gateway: the one each request names). */
  as(caller: Caller): GatewayLab {
    return new GatewayLab(this.core, caller);
  }

  /**
   * Refused once the caller's key is removed: checked before a call, not per node (a fan-out
   * would take every node's refusal for a node that did not answer, and give an empty list).
   */
  private guard(): void {
    if (this.caller.hash !== undefined && !this.core.stillValid(this.caller))
      throw new SnaplabError(
        'UNAUTHORIZED',
        'the API key is not known (any more)',
        'make a new one with `snaplab key create NAME --cluster …`',
      );
  }

  /** @internal a node's remote lab, acting for this caller (`read`: for short reads, with an answer deadline) */
  remote(node: string, read = false): RemoteLab {
    this.guard();
    return this.core.remote(node, this.caller, read);
  }

  /** A node's sandbox, its view saying which node. */
  private placed(node: string, view: Record<string, unknown>): RemoteSandbox {
    return this.remote(node).sandboxOf({ ...view, node });
  }

  async create(opts: RemoteCreateOptions = {}): Promise<SandboxApi> {
    this.guard();
    const { placement, ...rest } = opts;
    const pool = opts.pool;
    const image = pool === undefined ? (opts.image ?? DEFAULT_IMAGE) : undefined;
    const { value, node } = await placeCreate(
      this.core,
      this.caller,
      {
        request: { pool, image, labels: placement?.labels },
        given: pool === undefined ? opts.name : undefined,
        standby: pool !== undefined,
      },
      (n, name) =>
        onNode(n, async () => (await this.remote(n).create(name === undefined ? rest : { ...rest, name })).toJSON()),
    );
    return this.placed(node, value);
  }

  async restore(snapshot: string, opts: LabRestoreOptions & Placement = {}): Promise<SandboxApi> {
    this.guard();
    const { placement, ...rest } = opts;
    const { value, node } = await placeCreate(
      this.core,
      this.caller,
      { request: { snapshot, labels: placement?.labels }, given: opts.name, standby: false },
      (n, name) => onNode(n, async () => (await this.remote(n).restore(snapshot, { ...rest, name })).toJSON()),
    );
    return this.placed(node, value);
  }

  async get(idOrName: string, opts: { check?: boolean } = {}): Promise<SandboxApi> {
    this.guard();
    const { view } = this.core;
    const r = view.resolve(idOrName);
    if (r?.entry && this.core.owns(this.caller, r.entry) && (r.entry.state === 'lost' || !view.live(r.node)))
      return new AbsentSandbox(this.core.store, r.entry, view.left.has(r.node));
    const node = await this.core.nodeOf(idOrName, this.caller);
    return this.placed(node, (await onNode(node, () => this.remote(node, true).get(idOrName, opts))).toJSON());
  }

  /**
   * Each node's answer (those that could not answer are logged and left out). `read` (the
   * default): a short read, whose answer has a deadline; false for a change that may take long.
   */
  async fromEach<T>(
    call: (lab: RemoteLab, n: NodeInfo) => Promise<T>,
    nodes = [...this.core.view.nodes.values()],
    read = true,
  ) {
    this.guard();
    const { done, refused } = await this.core.onNodes(nodes, (n) =>
      onNode(n.name, () => call(this.remote(n.name, read), n)),
    );
    for (const r of refused)
      if ((r.error as { status?: number }).status === undefined)
        this.core.log({ msg: 'a node did not answer a fan-out', node: r.node, error: (r.error as Error).message });
    return { done, refused };
  }

  async list(opts: ListOptions = {}): Promise<SandboxApi[]> {
    checkList(opts); // a bad page or filter is said here, not refused by every node
    const { done } = await this.fromEach((lab) => lab.list(opts));
    const out: SandboxApi[] = done.flatMap((d) => d.value.map((b) => this.placed(d.node, b.toJSON())));
    out.push(...this.absent(opts, new Set(done.map((d) => d.node))));
    // each node answered its own page: the merged page is the first of them all
    return pageOf(out, opts);
  }

  /**
   * The caller's sandboxes of the watched copy that no node's answer has (its node did not
   * answer, or it is lost: listed until its record is deleted, even once its node is back), as a
   * list with these filters shows them.
   */
  private absent(opts: CountOptions, answered: Set<string>): AbsentSandbox[] {
    const out: AbsentSandbox[] = [];
    // their metadata is their node's alone (the cluster's record has none): under a metadata
    // filter they are not known to pass, so none is shown (as `{}` they all passed a `null`, "not set")
    if (Object.keys(opts.metadata ?? {}).length) return out;
    const want = Object.entries(opts.labels ?? {});
    const passes = listFilter(opts);
    for (const e of this.core.view.sandboxes.values()) {
      if ((answered.has(e.node) && e.state !== 'lost') || e.state === 'forgotten' || !this.core.owns(this.caller, e))
        continue;
      if (opts.owner !== undefined && e.owner !== opts.owner) continue;
      if (!want.every(([k, v]) => e.labels[k] === v)) continue;
      const absent = new AbsentSandbox(this.core.store, e, this.core.view.left.has(e.node));
      if (passes(absent)) out.push(absent);
    }
    return out;
  }

  /** Each node's count summed (no node lists), with the absent ones its list would show. */
  async count(opts: CountOptions = {}): Promise<SandboxCount> {
    checkList(opts);
    const { done } = await this.fromEach((lab) => lab.count(opts));
    const sum = countOf(this.absent(opts, new Set(done.map((d) => d.node))));
    for (const { value } of done) {
      sum.total += value.total;
      for (const [st, n] of Object.entries(value.byState)) sum.byState[st] = (sum.byState[st] ?? 0) + n;
    }
    return sum;
  }

  /** A check pass on every node that answers (each needs the admin scope); what each removed. */
  async check(): Promise<CheckResult> {
    const { done } = await this.fromEach((lab) => lab.check(), undefined, false);
    return { removed: done.flatMap((d) => d.value.removed) };
  }

  /** Every node's stored traces, newest first (their ids are each node's own). */
  async traces(query: TraceQuery = {}): Promise<StoredTrace[]> {
    if (query.targets?.length === 0) return [];
    const { done } = await this.fromEach((lab) => lab.traces(query));
    const all = done.flatMap((d) => d.value.map((t) => ({ ...t, node: d.node })));
    return all.sort((a, b) => b.startedAt - a.startedAt).slice(0, query.limit ?? 20);
  }

  /** The trace of that id on the first node that has it. */
  async trace(operationId: string): Promise<StoredTrace | undefined> {
    const { done } = await this.fromEach((lab) => lab.trace(operationId));
    return done.find((d) => d.value !== undefined)?.value;
  }

  async snapshots(): Promise<SnapshotApi[]> {
    const { done } = await this.fromEach((lab) => lab.snapshots());
    return done.flatMap((d) => d.value.map((s) => snapshotOf({ ...s.toJSON(), node: d.node })));
  }

  /** The first node that has the snapshot (the nodes' own word first, then asked). */
  private async snapshotNode(name: string): Promise<{ node: string; snapshot?: SnapshotApi }> {
    const known = [...this.core.view.nodes.values()].find((n) => n.snapshots.includes(name));
    if (known) return { node: known.name };
    const [first] = (await this.fromEach((lab) => lab.snapshot(name))).done;
    if (!first)
      throw new SnaplabError(
        'SNAPSHOT_NOT_FOUND',
        `no snapshot named ${name} on any node`,
        'list them with GET /snapshots',
      );
    return { node: first.node, snapshot: first.value };
  }

  async snapshot(name: string): Promise<SnapshotApi> {
    const at = await this.snapshotNode(name);
    const s = at.snapshot ?? (await onNode(at.node, () => this.remote(at.node, true).snapshot(name)));
    return snapshotOf({ ...s.toJSON(), node: at.node });
  }

  async removeSnapshot(name: string): Promise<void> {
    const { node } = await this.snapshotNode(name);
    await onNode(node, () => this.remote(node).removeSnapshot(name));
  }

  /** Defined on every node, or those matching `placement.labels`; refused by one, refused. */
  async createPool(spec: PoolSpec & Placement): Promise<PoolApi> {
    const { placement, ...rest } = spec;
    const ok = eligible(this.core.view.nodes.values(), { labels: placement?.labels }, this.core.view.drained);
    if (!Array.isArray(ok))
      throw new SnaplabError('NODE_UNAVAILABLE', `no node to run it on: ${ok.reason}`, 'see `snaplab cluster nodes`');
    const { refused } = await this.fromEach((lab) => lab.createPool(rest), ok, false);
    if (refused.length) throw refusedBy(refused);
    return this.pool(spec.name);
  }

  pool(name: string): PoolApi {
    return new ClusterPool(this, name);
  }

  /** The caller the gateway checked, as its GET /whoami tells it (ceilings as the key was made: each node has its defaults). */
  async whoami(): Promise<CallerInfo> {
    this.guard();
    return { ...describeCaller(this.caller), ceilings: { ...this.caller.ceilings } };
  }

  /** Pools summed over the nodes that hold them. */
  async pools(): Promise<PoolStats[]> {
    return sumPools((await this.fromEach((lab) => lab.pools())).done);
  }

  /**
   * A capability beside LabApi, for a front that holds the raw request (the gateway's routes:
   * server/sandbox-calls.ts): a client's WebSocket joined to its sandbox's node byte for byte, or
   * (sandbox null) `/rpc` relayed call by call (streams.ts). `taken`: once it cannot be refused.
   */
  joinSocket(sandbox: string | null, req: IncomingMessage, upgrade: Upgrade, taken: () => void): Promise<void> {
    this.guard();
    return joinSocket(this.core, this.caller, sandbox, req, upgrade, taken);
  }

  /**
   * The same for a request on a sandbox: passed on to its node, body (the request's own, or
   * `body` when the route has read it) and answer streamed. `taken`: once its node is found.
   */
  forward(
    sandbox: string,
    req: IncomingMessage,
    res: ServerResponse,
    body?: Buffer,
    taken?: () => void,
  ): Promise<void> {
    this.guard();
    return forwardTo(this.core, this.caller, sandbox, req, res, body, taken);
  }

  close(): void {
    // LabApi's close is synchronous: the watch and the store end in the background
    if (this.owned) void this.core.close().catch(noted('close the cluster lab'));
  }
}
