/**
 * What a gateway is without its HTTP: the store, its watched copy, the cluster token, placement,
 * and where each sandbox is. The HTTP gateway (gateway.ts) and the in-process GatewayLab
 * (gateway-lab.ts) both stand on it, so a create is placed and claimed one way whichever asks.
 */
import { NO_CEILINGS } from '../lab/ceilings.js';
import { timingSafeEqual } from 'node:crypto';
import { WebSocketServer } from 'ws';
import { SnaplabError } from '../errors.js';
import { RemoteLab } from '../client/remote.js';
import { clusterOwner, hashKey, keyCaller, type Caller } from '../server/keys.js';
import { ask, ASK_TIMEOUT_MS, callerHeader, CONNECT_TIMEOUT_MS } from './proxy.js';
import { ClusterStore, type NodeInfo } from './store.js';
import { bestOfK, eligible, score, type PlacementRequest } from './placement.js';
import { ClusterView } from './view.js';
import { CALLER_HEADER } from '../server/keys.js';
import { lostError, notFound, unplaceable } from './core-errors.js';

export interface ClusterParts {
  store: ClusterStore;
  view: ClusterView;
  /** the cluster token, with which the gateway speaks to nodes */
  token: string;
}

export interface CoreOptions {
  /** K of power-of-K placement (default 2) */
  choices?: number;
  log?: (line: Record<string, unknown>) => void;
  /** a node that does not accept a connection in this is not answering (default CONNECT_TIMEOUT_MS, 10 s) */
  connectTimeoutMs?: number;
  /** a node's answer to a read (a list, a lookup) not come in this is no answer (default ASK_TIMEOUT_MS, 15 s) */
  answerTimeoutMs?: number;
}

/** The store opened and its copy watched; closed again if either fails. */
export async function openCluster(
  cluster: string,
  log: (line: Record<string, unknown>) => void = () => {},
): Promise<ClusterParts> {
  const store = await ClusterStore.open(cluster);
  const view = new ClusterView(store, log);
  try {
    const token = await store.token();
    await view.start();
    return { store, view, token };
  } catch (e) {
    await view.close();
    store.close();
    throw e;
  }
}

/** The gateway's own lookups on nodes (where a pool or snapshot is): it reads, as an administrator would. */
export const SYSTEM: Caller = {
  key: 'gateway',
  scopes: new Set(['read']),
  maxSandboxes: null,
  maxExecs: null,
  ceilings: NO_CEILINGS,
};

export class ClusterCore {
  readonly store: ClusterStore;
  readonly view: ClusterView;
  readonly token: string;
  readonly choices: number;
  readonly log: (line: Record<string, unknown>) => void;
  private readonly connectTimeoutMs: number;
  private readonly answerTimeoutMs: number;
  /** recent placement times (ms), for /metrics */
  readonly placements: number[] = [];
  /** pool runs sent to each node and not answered, by pool: ready standbys not to count twice */
  private readonly runs = new Map<string, number>();
  /** the WebSockets joined or relayed here (/rpc): ended with the core */
  readonly wss = new WebSocketServer({ noServer: true, maxPayload: 64 << 20 });
  /** long-lived connections (joined sockets, /rpc, event streams) by key hash: closed when the key is removed */
  private readonly conns = new Map<string, Set<() => void>>();
  /** a remote lab per node and caller, kept for their connections (keep-alive, /rpc) */
  private readonly remotes = new Map<string, { lab: RemoteLab; hash: string | undefined }>();

  constructor(parts: ClusterParts, opts: CoreOptions) {
    this.store = parts.store;
    this.view = parts.view;
    this.token = parts.token;
    this.choices = opts.choices ?? 2;
    this.log = opts.log ?? (() => {});
    this.connectTimeoutMs = opts.connectTimeoutMs ?? CONNECT_TIMEOUT_MS;
    this.answerTimeoutMs = opts.answerTimeoutMs ?? ASK_TIMEOUT_MS;
    this.view.on('keyRemoved', (hash: string) => {
      for (const close of this.conns.get(hash) ?? []) close();
      this.conns.delete(hash);
      for (const [k, r] of this.remotes)
        if (r.hash === hash) {
          r.lab.close();
          this.remotes.delete(k);
        }
    });
  }

  /** Close `close` when the caller's key is removed, or the core ends; the result forgets it. */
  track(caller: Caller, close: () => void): () => void {
    const k = caller.hash ?? '';
    let set = this.conns.get(k);
    if (!set) this.conns.set(k, (set = new Set()));
    set.add(close);
    return () => set!.delete(close);
  }

  /** The streams joined or relayed here, ended (they never end by themselves). */
  endStreams(): void {
    for (const c of this.wss.clients) c.terminate();
    for (const set of this.conns.values()) for (const close of set) close();
    this.conns.clear();
  }

  /** The caller an API key stands for (keys live in the store: `snaplab key create --cluster`). */
  callerOf(token: string): Caller {
    const hash = hashKey(token);
    const k = this.view.keyByHash(hash);
    if (!k || !timingSafeEqual(Buffer.from(k.hash, 'hex'), Buffer.from(hash, 'hex'))) {
      throw new SnaplabError(
        'UNAUTHORIZED',
        'the API key is not known',
        'check the key, or make a new one with `snaplab key create NAME --cluster …`',
      );
    }
    return keyCaller(k);
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
   * The node's remote lab, acting for `caller`: the cluster token as its key and the caller named
   * in CALLER_HEADER, as the gateway's own requests to nodes (the node applies that key's scopes
   * and ownership). Kept per node and caller, dropped when the key is removed. `read`: one for
   * short reads, whose answers have a deadline (a node that accepts and does not answer is left
   * out of a fan-out, as ask() does), not for creates, uploads or operations.
   */
  remote(node: string, caller: Caller, read = false): RemoteLab {
    const { url } = this.node(node);
    const header = callerHeader(caller);
    const k = `${node} ${url} ${read} ${header}`;
    let r = this.remotes.get(k);
    if (!r) {
      const lab = new RemoteLab({
        url,
        token: this.token,
        headers: { [CALLER_HEADER]: header },
        connectTimeoutMs: this.connectTimeoutMs,
        ...(read ? { answerTimeoutMs: this.answerTimeoutMs } : {}),
      });
      this.remotes.set(k, (r = { lab, hash: caller.hash }));
    }
    return r.lab;
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
      const found = await this.askAll<{ id: string }>(caller, `/sandboxes/${encodeURIComponent(idOrName)}`);
      if (found[0]) r = { node: found[0].node };
    }
    if (!r || (r.entry && (!this.owns(caller, r.entry) || r.entry.state === 'forgotten'))) throw notFound(idOrName);
    if (r.entry?.state === 'lost') throw lostError(r.entry);
    return r.node;
  }

  /** Where a create goes: best of K among the nodes that can take it. */
  /** `caller`: whom the nodes are asked for, where they must be (a snapshot is its key's own) */
  async place(req: PlacementRequest, caller: Caller = SYSTEM): Promise<NodeInfo> {
    const t0 = performance.now();
    let ok = eligible(this.view.nodes.values(), req, this.view.drained);
    if (
      !Array.isArray(ok) &&
      (req.pool !== undefined || req.snapshot !== undefined || req.image !== undefined) &&
      this.view.nodes.size
    ) {
      // the nodes' last word may be older than the pool, snapshot or image (made a moment ago): ask them
      const have = await this.holdersOf(req, caller);
      const found = eligible(
        [...this.view.nodes.values()].filter((n) => have.has(n.name)),
        { ...req, pool: undefined, snapshot: undefined, image: undefined },
        this.view.drained,
      );
      if (Array.isArray(found)) ok = found;
      // what a single daemon says of a thing it does not have, when no node has it
      else if (!have.size) throw unplaceable(req);
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

  /** The nodes that say they hold the request's pool, snapshot or image. */
  private async holdersOf(req: PlacementRequest, caller: Caller): Promise<Set<string>> {
    if (req.pool !== undefined || req.snapshot !== undefined) {
      const path =
        req.pool !== undefined
          ? `/pools/${encodeURIComponent(req.pool)}`
          : `/snapshots/${encodeURIComponent(req.snapshot!)}`;
      return new Set((await this.askAll(caller, path)).map((a) => a.node));
    }
    return new Set(
      (await this.askAll<{ name: string }[]>(SYSTEM, '/images'))
        .filter((a) => a.value.some((i) => i.name === req.image))
        .map((a) => a.node),
    );
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

  /** Ask every node that is up; the answers of those that answered, and which did not. */
  async askAll<T>(
    caller: Caller,
    path: string,
    nodes: Iterable<NodeInfo> = this.view.nodes.values(),
  ): Promise<{ node: string; value: T }[]> {
    const all = await this.onNodes([...nodes], async (n) => {
      try {
        return (await ask<T>(n.url, n.name, this.token, caller, 'GET', path)).value;
      } catch (e) {
        // a node that answered (a 404: it has no such thing) is simply not among the answers
        if ((e as { status?: number }).status === undefined)
          this.log({
            msg: 'a node did not answer a fan-out',
            node: n.name,
            path: path.split('?')[0],
            error: (e as Error).message,
          });
        throw e;
      }
    });
    return all.done;
  }

  /** Run a call on each node; what each answered, and which refused (with their errors). */
  async onNodes<T>(
    nodes: NodeInfo[],
    call: (n: NodeInfo) => Promise<T>,
  ): Promise<{ done: { node: string; value: T }[]; refused: { node: string; error: unknown }[] }> {
    const each = await Promise.allSettled(nodes.map(async (n) => ({ node: n.name, value: await call(n) })));
    return {
      done: each.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : [])),
      refused: each.flatMap((r, i) => (r.status === 'rejected' ? [{ node: nodes[i]!.name, error: r.reason }] : [])),
    };
  }

  /** The core alone (a GatewayLab's own): the remote labs, the watch and the store. */
  async close(): Promise<void> {
    this.endStreams();
    for (const r of this.remotes.values()) r.lab.close();
    this.remotes.clear();
    await this.view.close();
    this.store.close();
  }
}
