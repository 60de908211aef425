/**
 * `snaplab serve --gateway --cluster etcd://…`: one API in front of many node daemons, the same
 * API a single daemon serves (docs/api.md), so the remote library and the CLI work against it
 * unchanged. A gateway keeps no state of its own: keys, nodes and where each sandbox lives are in
 * etcd (view.ts keeps a watched copy), so several can run at once and any can serve any call.
 *
 * - A create is placed (placement.ts), its name taken in the store for that node before it
 *   starts, then sent on; one that never reached its node is placed once more, elsewhere.
 * - A call on a sandbox goes to the node that holds it; its body and answer are streamed, and
 *   WebSockets (exec streams, terminals) are joined byte for byte (proxy.ts).
 * - Lists are asked of every node and merged; a sandbox whose node lapsed is listed `lost`.
 * - Long operations that ran on several nodes (a pool defined on each) have one id that names
 *   them all (`c.` + their node and id), so any gateway can answer for it.
 */
import { randomUUID, timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { WebSocketServer } from 'ws';
import { SnaplabError } from '../errors.js';
import { defaultName, newId } from '../lab/names.js';
import { clusterOwner, hashKey, requireScope, type Caller } from '../server/keys.js';
import { QuotaError } from '../server/http-errors.js';
import { VERSION } from '../version.js';
import type { GatewayApi } from './gateway-api.js';
import { clusterRoutes } from './gateway-routes.js';
import { ask, asSnaplab, errorBody, forward, forwardUpgrade, readJson, sendError, sendJson } from './proxy.js';
import { statusOf } from '../server/http-errors.js';
import { relayRpc } from './rpc-relay.js';
import { ClusterStore, type Claim, type NodeInfo, type SandboxEntry } from './store.js';
import { bestOfK, eligible, score, type PlacementRequest } from './placement.js';
import { ClusterView } from './view.js';
import { clusterEvents } from './events.js';
import { noted } from '../cleanup.js';
import type { Socket } from 'node:net';
import { ConnectionGuard, resolveLimits, type ConnectionLimits } from '../server/limits.js';

export interface GatewayOptions {
  cluster: string;
  /** host:port (127.0.0.1 unless another address is meant) */
  listen: string;
  /** K of power-of-K placement (default 2) */
  choices?: number;
  log?: (line: Record<string, unknown>) => void;
  /** the daemon's connection caps and timeouts (server/limits.ts); no request timeout here */
  limits?: Partial<ConnectionLimits>;
}

/** a node's create is bounded by its own limit (300 s, then cleaned); the gateway waits a little longer */
const CREATE_TIMEOUT_MS = 330_000;
/** a create's claim in the store lapses after this, whatever became of the gateway that made it */
const CLAIM_TTL_S = 360;

export class Gateway implements GatewayApi {
  readonly choices: number;
  /** pool runs sent to each node and not answered, by pool: ready standbys not to count twice */
  private readonly runs = new Map<string, number>();
  readonly placements: number[] = [];
  private server: Server | undefined;
  /** the TCP connection caps (server/limits.ts), told when a request carried a valid key */
  private guard: ConnectionGuard | undefined;
  private readonly wss = new WebSocketServer({ noServer: true, maxPayload: 64 << 20 });
  readonly log: (line: Record<string, unknown>) => void;
  url = '';

  /** long-lived connections (joined sockets, /rpc, event streams) by key hash: closed when the key is removed */
  private readonly conns = new Map<string, Set<() => void>>();

  private constructor(
    readonly store: ClusterStore,
    readonly view: ClusterView,
    readonly token: string,
    opts: GatewayOptions,
  ) {
    this.choices = opts.choices ?? 2;
    this.log = opts.log ?? (() => {});
    view.on('keyRemoved', (hash: string) => {
      for (const close of this.conns.get(hash) ?? []) close();
      this.conns.delete(hash);
    });
  }

  /** Close `close` when the caller's key is removed, or the gateway stops; the result forgets it. */
  track(caller: Caller, close: () => void): () => void {
    const k = caller.hash ?? '';
    let set = this.conns.get(k);
    if (!set) this.conns.set(k, (set = new Set()));
    set.add(close);
    return () => set!.delete(close);
  }

  static async start(opts: GatewayOptions): Promise<Gateway> {
    const store = await ClusterStore.open(opts.cluster);
    const log = opts.log ?? (() => {});
    const view = new ClusterView(store, log);
    try {
      const g = new Gateway(store, view, await store.token(), opts);
      await view.start();
      await g.listen(opts.listen, opts.limits);
      return g;
    } catch (e) {
      await view.close();
      store.close();
      throw e;
    }
  }

  private async listen(listen: string, given: Partial<ConnectionLimits> = {}): Promise<void> {
    const { parseListen } = await import('../server/serve.js');
    const { host, port } = parseListen(listen);
    const routes = clusterRoutes(this);
    // long uploads (archives, stdin) are streamed: no overall deadline on a request, as on a node
    const limits = resolveLimits({ requestTimeoutMs: 0, ...given });
    const timeouts = { headersTimeout: limits.headersTimeoutMs, connectionsCheckingInterval: 1000 };
    this.server = createServer(timeouts, (req, res) => {
      const t0 = performance.now();
      res.once('finish', () =>
        this.log({
          method: req.method,
          url: req.url?.split('?')[0],
          status: res.statusCode,
          ms: Math.round((performance.now() - t0) * 10) / 10,
        }),
      );
      void routes(req, res).catch((e: unknown) => sendError(res, e));
    });
    this.server.on('upgrade', (req, socket, head) => this.upgrade(req, socket, head));
    this.server.requestTimeout = 0;
    this.server.keepAliveTimeout = limits.keepAliveTimeoutMs;
    this.guard = new ConnectionGuard(limits, this.log);
    this.guard.attach(this.server);
    await new Promise<void>((resolve, reject) => {
      this.server!.once('error', reject);
      this.server!.listen(port, host, () => resolve());
    });
    const a = this.server.address() as { address: string; port: number; family: string };
    this.url = `http://${a.family === 'IPv6' ? `[${a.address}]` : a.address}:${a.port}`;
  }

  /** The caller a request's key stands for (keys live in the store: `snaplab key create --cluster`). */
  authenticate(req: IncomingMessage, scope: 'read' | 'exec' | 'admin', headerless = false): Caller {
    const m = /^Bearer\s+(\S+)$/i.exec(req.headers.authorization ?? '');
    const q = headerless ? new URL(req.url!, 'http://x').searchParams.get('token') : null;
    const token = m?.[1] ?? q ?? undefined;
    if (!token)
      throw new SnaplabError(
        'UNAUTHORIZED',
        'no API key given',
        'send `Authorization: Bearer KEY` (make one with `snaplab key create NAME --cluster …`)',
      );
    const hash = hashKey(token);
    const k = this.view.keyByHash(hash);
    if (!k || !timingSafeEqual(Buffer.from(k.hash, 'hex'), Buffer.from(hash, 'hex'))) {
      throw new SnaplabError(
        'UNAUTHORIZED',
        'the API key is not known',
        'check the key, or make a new one with `snaplab key create NAME --cluster …`',
      );
    }
    const caller: Caller = {
      key: k.name,
      hash: k.hash,
      scopes: new Set(k.scopes),
      maxSandboxes: k.maxSandboxes,
      maxExecs: k.maxExecs,
    };
    requireScope(caller, scope);
    this.guard?.authenticated(req.socket as Socket);
    return caller;
  }

  /** May this caller see this sandbox (admin keys see all; others the sandboxes they made)? */
  owns(caller: Caller, e: { owner: string | null }): boolean {
    return caller.scopes.has('admin') || e.owner === clusterOwner(caller.key);
  }

  stillValid(caller: Caller): boolean {
    return caller.hash !== undefined && this.view.keyByHash(caller.hash) !== undefined;
  }

  node(name: string): NodeInfo {
    const n = this.view.live(name);
    if (!n)
      throw new SnaplabError(
        'NODE_UNAVAILABLE',
        `node ${name} is not up`,
        this.view.left.has(name)
          ? 'it was stopped; its sandboxes are served again when it restarts'
          : 'see `snaplab cluster nodes`',
      );
    return n;
  }

  /**
   * The node holding a sandbox the caller may see, or the error a single daemon would give. The
   * watched copy first; a sandbox it does not know yet (made a moment ago through another
   * gateway, or outside any) is looked up in the store, then asked of the nodes.
   */
  async nodeOf(idOrName: string, caller: Caller): Promise<string> {
    let r = this.view.resolve(idOrName);
    if (!r) {
      const e =
        (await this.store.sandbox(idOrName)) ??
        (await this.store.name(idOrName).then((n) => (n?.id ? this.store.sandbox(n.id) : undefined)));
      if (e) r = { entry: e, node: e.node };
    }
    if (!r) {
      const found = await this.askAll<{ id: string; owner?: string | null }>(
        caller,
        `/sandboxes/${encodeURIComponent(idOrName)}`,
      );
      if (found[0]) r = { node: found[0].node };
    }
    if (!r || (r.entry && (!this.owns(caller, r.entry) || r.entry.state === 'forgotten'))) {
      throw new SnaplabError(
        'SANDBOX_NOT_FOUND',
        `no sandbox named ${JSON.stringify(idOrName)} in the cluster`,
        'list them with `snaplab ls` (SNAPLAB_HOST=the gateway)',
      );
    }
    if (r.entry?.state === 'lost') throw lostError(r.entry);
    return r.node;
  }

  /** Where a create goes: best of K among the nodes that can take it. */
  async place(req: PlacementRequest): Promise<NodeInfo> {
    const t0 = performance.now();
    let ok = eligible(this.view.nodes.values(), req, this.view.drained);
    if (
      !Array.isArray(ok) &&
      (req.pool !== undefined || req.snapshot !== undefined || req.image !== undefined) &&
      this.view.nodes.size
    ) {
      // the nodes' last word may be older than the pool, snapshot or image (made a moment ago): ask them
      let have: Set<string>;
      if (req.pool !== undefined || req.snapshot !== undefined) {
        const path =
          req.pool !== undefined
            ? `/pools/${encodeURIComponent(req.pool)}`
            : `/snapshots/${encodeURIComponent(req.snapshot!)}`;
        have = new Set((await this.askAll(SYSTEM, path)).map((a) => a.node));
      } else {
        have = new Set(
          (await this.askAll<{ name: string }[]>(SYSTEM, '/images'))
            .filter((a) => a.value.some((i) => i.name === req.image))
            .map((a) => a.node),
        );
      }
      const found = eligible(
        [...this.view.nodes.values()].filter((n) => have.has(n.name)),
        { ...req, pool: undefined, snapshot: undefined, image: undefined },
        this.view.drained,
      );
      if (Array.isArray(found)) ok = found;
      // what a single daemon says of a thing it does not have, when no node has it
      else if (!have.size) {
        if (req.pool !== undefined)
          throw new SnaplabError(
            'POOL_NOT_FOUND',
            `no pool named ${JSON.stringify(req.pool)} on any node`,
            'define one: POST /pools',
          );
        if (req.snapshot !== undefined)
          throw new SnaplabError(
            'SNAPSHOT_NOT_FOUND',
            `no snapshot named ${JSON.stringify(req.snapshot)} on any node`,
            'list them with GET /snapshots',
          );
        throw new SnaplabError(
          'IMAGE_NOT_FOUND',
          `no node has image ${JSON.stringify(req.image)}`,
          'import or build it on the nodes: POST /images/import, /images/build',
        );
      }
    }
    if (!Array.isArray(ok))
      throw new SnaplabError(
        'NODE_UNAVAILABLE',
        `no node can take this sandbox: ${ok.reason}`,
        'see `snaplab cluster nodes` (labels, pools, snapshots, drains)',
      );
    const load = this.view.load();
    const best = bestOfK(ok, this.choices, (n) =>
      score(n, req, load.get(n.name) ?? 0, req.pool ? (this.runs.get(`${n.name}/${req.pool}`) ?? 0) : 0),
    );
    this.placements.push(performance.now() - t0);
    if (this.placements.length > 10_000) this.placements.splice(0, 5000);
    return best.node;
  }

  /** A pool run placed: counted against that node's ready standbys until it is answered. */
  async placeRun(pool: string, exclude: Set<string>): Promise<string> {
    const n = (await this.place({ pool, exclude })).name;
    this.runs.set(`${n}/${pool}`, (this.runs.get(`${n}/${pool}`) ?? 0) + 1);
    return n;
  }

  runDone(node: string, pool: string): void {
    const k = `${node}/${pool}`;
    const v = (this.runs.get(k) ?? 1) - 1;
    if (v > 0) this.runs.set(k, v);
    else this.runs.delete(k);
  }

  /** POST /sandboxes: quota, placement, the create recorded in the store for its node, then the node's create. */
  async create(req: IncomingMessage, res: ServerResponse, caller: Caller): Promise<void> {
    const body = await readJson(req);
    const placement = body.placement as { labels?: Record<string, string> } | undefined;
    delete body.placement;
    const pool = typeof body.pool === 'string' ? body.pool : undefined;
    const snapshot = typeof body.snapshot === 'string' ? body.snapshot : undefined;
    const image = pool || snapshot ? undefined : typeof body.image === 'string' ? body.image : 'busybox';
    const request: PlacementRequest = { pool, snapshot, image, labels: placement?.labels };
    const given = pool === undefined && typeof body.name === 'string' ? body.name : undefined;
    const owner = clusterOwner(caller.key);
    const id = newId();
    let node = (await this.place(request)).name;
    // a pool standby keeps its own name; any other create's name is taken cluster-wide first
    let c: Claim | null = null;
    while (!c) {
      c = await this.store.claimCreate(
        id,
        node,
        owner,
        pool !== undefined ? undefined : (given ?? defaultName(newId())),
        CLAIM_TTL_S,
      );
      if (!c && given)
        throw new SnaplabError(
          'SANDBOX_EXISTS',
          `a sandbox named ${given} exists in the cluster`,
          'pick another name, or remove that one',
        );
    }
    const claim = c;
    if (claim.name) body.name = claim.name;
    // a key's quota holds cluster-wide: its sandboxes and the creates claimed before this one
    if (caller.maxSandboxes !== null) {
      const q = await this.store.withinQuota(claim, caller.maxSandboxes);
      if (!q.ok) {
        await this.store.endCreate(claim, 'refused');
        throw new QuotaError(
          'maxSandboxes',
          `key ${caller.key} has ${q.have} of its ${caller.maxSandboxes} sandboxes in the cluster`,
          5,
        );
      }
    }
    for (let attempt = 0; ; attempt++) {
      let made = false;
      try {
        // a node gone since it was placed is one the create never reached
        const url = this.view.live(node)?.url;
        if (!url)
          throw Object.assign(
            new SnaplabError('NODE_UNAVAILABLE', `node ${node} left the cluster`, 'see `snaplab cluster nodes`'),
            { connect: true },
          );
        const r = await ask<Record<string, unknown>>(
          url,
          node,
          this.token,
          caller,
          'POST',
          '/sandboxes',
          body,
          CREATE_TIMEOUT_MS,
        );
        made = true;
        await this.record(r.value, node, caller);
        await this.store.endCreate(claim, 'made').catch(noted("end the create's claim"));
        return sendJson(res, r.status, { ...r.value, node });
      } catch (e) {
        // refused at connect: it never reached the node, which made nothing; placed once more,
        // elsewhere, the claim (its name and its place in the quota's order) moved with it
        if (!made && (e as { connect?: boolean }).connect === true && attempt === 0) {
          const from = node;
          const next = await this.place({ ...request, exclude: new Set([from]) }).catch(async (err: unknown) => {
            await this.store.endCreate(claim, 'refused').catch(noted("end the create's claim"));
            throw err;
          });
          if (await this.store.moveCreate(claim, next.name)) {
            node = next.name;
            await this.note('create.retried', {
              from,
              to: node,
              name: claim.name ?? null,
              reason: (e as Error).message,
            });
            this.log({ msg: 'create retried on another node', from, to: node, error: (e as Error).message });
            continue;
          }
        }
        // the node said no: nothing was made, the claim and name go. Made, or gone during it:
        // they stay on their lease (the node's own entries take over if it made the sandbox)
        const answered = (e as { status?: number }).status !== undefined;
        await this.store
          .endCreate(claim, made ? 'made' : answered || (e as { connect?: boolean }).connect ? 'refused' : 'unknown')
          .catch(noted("end the create's claim"));
        throw e;
      }
    }
  }

  /**
   * Where a new sandbox is, written before its create is answered: the client's next call may
   * come through another gateway before its node has written it (the node's own entry, when it
   * comes, is the same). Never over an entry the node has written already.
   */
  private async record(v: Record<string, unknown>, node: string, caller: Caller): Promise<void> {
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
    this.view.sandboxes.set(e.id, e);
    this.view.names.set(e.name, { node, id: e.id, owner: e.owner, at: e.createdAt });
    await this.store.putSandboxIfAbsent(e);
  }

  /** A note on the event stream (create retried…), kept 10 minutes. */
  async note(type: string, data: Record<string, unknown>): Promise<void> {
    const lease = this.store.client.lease(600, { autoKeepAlive: false });
    await lease
      .put(this.store.key('notes', `${Date.now()}-${randomUUID()}`))
      .value(JSON.stringify({ type, at: Date.now(), ...data }))
      .catch(noted(`store a cluster note (${type})`));
    lease.release();
  }

  /** Ask every node that is up; the answers of those that answered, and which did not. */
  async askAll<T>(
    caller: Caller,
    path: string,
    nodes: Iterable<NodeInfo> = this.view.nodes.values(),
  ): Promise<{ node: string; value: T }[]> {
    const all = await Promise.all(
      [...nodes].map(async (n) => {
        try {
          return { node: n.name, value: (await ask<T>(n.url, n.name, this.token, caller, 'GET', path)).value };
        } catch (e) {
          // a node that answered (a 404: it has no such thing) is simply not among the answers
          if ((e as { status?: number }).status === undefined)
            this.log({
              msg: 'a node did not answer a fan-out',
              node: n.name,
              path: path.split('?')[0],
              error: (e as Error).message,
            });
          return undefined;
        }
      }),
    );
    return all.filter((x): x is { node: string; value: T } => x !== undefined);
  }

  forward(req: IncomingMessage, res: ServerResponse, node: string, caller: Caller): void {
    forward(req, res, this.node(node).url, node, this.token, caller);
  }

  private upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void {
    // a client that resets the connection must not become an uncaught exception
    socket.on('error', () => socket.destroy());
    const refuse = (e: unknown): void => {
      const err = asSnaplab(e);
      const body = JSON.stringify(errorBody(err));
      if (socket.writable)
        socket.end(
          `HTTP/1.1 ${statusOf(err.code)} Refused\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
        );
    };
    try {
      const path = new URL(req.url!, 'http://x').pathname;
      const caller = this.authenticate(req, 'exec', true);
      if (path === '/rpc') {
        this.wss.handleUpgrade(req, socket, head, (ws) => relayRpc(this, ws, caller));
        return;
      }
      const m = /^\/sandboxes\/([^/]+)\/(exec|processes\/[^/]+\/attach)$/.exec(path);
      if (!m) throw new SnaplabError('BAD_INPUT', `no WebSocket route ${path}`, 'see docs/api.md');
      const untrack = this.track(caller, () => socket.destroy());
      socket.once('close', untrack);
      void this.nodeOf(decodeURIComponent(m[1]!), caller)
        .then((node) => {
          // its key removed while its node was looked up: refused as if it had come a moment later
          if (!this.stillValid(caller))
            throw new SnaplabError(
              'UNAUTHORIZED',
              'the API key is not known (any more)',
              'make a new one with `snaplab key create NAME --cluster …`',
            );
          forwardUpgrade(req, socket, head, this.node(node).url, node, this.token, caller);
        })
        .catch(refuse);
    } catch (e) {
      refuse(e);
    }
  }

  events(req: IncomingMessage, res: ServerResponse, caller: Caller): Promise<void> {
    return clusterEvents(this, req, res, caller);
  }

  health(): Record<string, unknown> {
    return { ok: true, version: VERSION, pid: process.pid, role: 'gateway', nodes: this.view.nodes.size };
  }

  async close(): Promise<void> {
    for (const c of this.wss.clients) c.terminate();
    for (const set of this.conns.values()) for (const close of set) close();
    // event streams and joined sockets never end by themselves: closed, not waited for
    const closed = new Promise<void>((r) => (this.server ? this.server.close(() => r()) : r()));
    this.server?.closeAllConnections();
    await closed;
    await this.view.close();
    this.store.close();
  }
}

/** The gateway's own lookups on nodes (where a pool or snapshot is): it reads, as an administrator would. */
const SYSTEM: Caller = { key: 'gateway', scopes: new Set(['read']), maxSandboxes: null, maxExecs: null };

export function lostError(e: SandboxEntry): SnaplabError {
  return new SnaplabError(
    'SANDBOX_LOST',
    `sandbox ${e.name} is lost: ${e.reason ?? `node ${e.node} is gone`}`,
    'create a new one; `DELETE /sandboxes/{id}` removes this record',
  );
}
