/**
 * What the daemon serves: a LabApi (sdk/api.ts), and the few things a server needs beside it.
 * The routes and the Daemon call this interface only, never lab/ or the store, so any
 * implementation can be served by the same routes: the embedded Lab on a node; a cluster gateway
 * serves the same routes over a RouteHost (below), passing a sandbox's own calls to its node. Everything a client can do
 * is in LabApi (and held to the contract suite); what is here is a server's own: the home it runs
 * on, its API keys, the journal its event stream is kept in, and the host's images, scenarios and
 * gc, which only the embedded Lab has so far (not yet on the remote Lab).
 */
import type {
  BufferOutput,
  CheckResult,
  LabApi,
  LabCreateOptions,
  LabRestoreOptions,
  PoolApi,
  SandboxApi,
  SnapshotApi,
} from '../sdk/api.js';
import type { Lab } from '../sdk/lab.js';
import type { Text } from '../sdk/output.js';
import type { PoolSpec } from '../lab/pools/admin.js';
import type { RunOutcome, RunSpec } from '../lab/pools/run.js';
import type { TraceSummary } from '../timing/trace.js';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { ApiKeyRecord, EventRecord, SessionRows } from '../store/records.js';
import type { WatchMark } from '../store/store.js';
import type { KeyOptions } from '../lab/keys.js';
import type { DebianSpec } from '../image/debian.js';
import type { Caller } from './keys.js';
import type { CreateBody } from './schemas.js';

export type { EventRecord } from '../store/records.js';

/** The daemon's event log, kept where the lab keeps its state: `GET /events` resumes across restarts. */
export interface EventJournal {
  append(e: Omit<EventRecord, 'id'>): EventRecord;
  after(id: number, limit?: number): EventRecord[];
  lastId(): number;
  /** where the log's watcher got to in the lab's changes (Lab.changes), kept with the log */
  watched(): WatchMark | undefined;
  setWatched(m: WatchMark): void;
}

/** Who a server makes a sandbox for (the caller's key), and a bound on how long it may take. */
export interface Served {
  owner?: string;
  signal?: AbortSignal;
  /**
   * Did the caller ask for the disk cap in `limits` (a key's creates carry the cap its ceilings
   * give, asked or not)? One not asked is 'server': dropped where the storage says no cap can hold
   * (as the library's own default is), not refused as an asked one is; a failure to set it fails
   * the create (the key's ceilings stand on it).
   */
  diskAsked?: boolean | 'server';
}

export interface ServedRestore extends Served, LabRestoreOptions {}

/**
 * A pool as a server keeps it: filled and resized with progress, kept at its target in the
 * background while the server runs (`start`), and each run's trace where the lab has it.
 */
export interface ServedPool extends PoolApi {
  run(argv: string[], spec: RunSpec & BufferOutput): Promise<RunOutcome & { trace?: TraceSummary }>;
  run(argv: string[], spec?: RunSpec): Promise<Text<RunOutcome> & { trace?: TraceSummary }>;
  resize(size: number, onProgress?: (ready: number, target: number) => void): Promise<void>;
  start(): void;
}

export interface ServedLab
  extends LabApi,
    Pick<
      Lab,
      | 'home'
      | 'keys'
      | 'gc'
      | 'images'
      | 'importImage'
      | 'buildImage'
      | 'removeImage'
      | 'up'
      | 'scenario'
      | 'scenarios'
      | 'capabilities'
      | 'egressTotals'
      | 'held'
      | 'diskCapHolds'
      | 'ownedSnapshots'
      | 'changes'
      | 'expired'
      | 'holdPools'
      | 'sweepEgress'
    > {
  create(opts?: LabCreateOptions & Served): Promise<SandboxApi>;
  restore(snapshot: string, opts?: ServedRestore): Promise<SandboxApi>;
  createPool(spec: PoolSpec, onProgress?: (ready: number, target: number) => void): Promise<ServedPool>;
  pool(name: string): ServedPool;
  readonly journal: EventJournal;
  /** where the E2B front keeps its sessions (a daemon's store; a gateway has none) */
  readonly e2bSessions?: SessionRows;
}

/** The API keys a server checks requests against: a daemon's (its store), a gateway's (the cluster's, in etcd). */
export interface KeyAdmin {
  list(): Promise<Omit<ApiKeyRecord, 'hash'>[]>;
  /** the token is shown this once; the key keeps its hash only */
  create(name: string, opts: KeyOptions): Promise<{ token: string; key: ApiKeyRecord }>;
  /** KEY_NOT_FOUND when there is none of that name */
  remove(name: string): Promise<void>;
}

/** Long operations (docs/api.md): a daemon's own, or a cluster's made of a part on each node. */
export interface OperationsApi {
  list(): Promise<unknown[]>;
  /** its state, waiting up to `waitS` seconds for its end; OPERATION_NOT_FOUND when there is none */
  get(id: string, waitS?: number): Promise<unknown>;
}

/** `POST /pools/{name}/run`'s body (schemas.ts, RunBody). */
export interface PoolRunBody {
  argv: string[];
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
  timeoutMs?: number;
  stdin?: string;
  encoding?: 'utf8' | 'base64';
}

/** What `GET /events` asks for: resume after an id (Last-Event-ID or ?after=), one sandbox's. */
export interface EventQuery {
  after?: number;
  sandbox?: string;
}

/** Where a cluster gateway runs a change made on each node (a single daemon refuses it). */
export interface Placement {
  placement?: { labels?: Record<string, string> };
}

/**
 * An admin's changes beside LabApi, which run long or (in a cluster) on each node: pools defined,
 * resized and removed, images imported, built and removed. A long one answers an operation
 * (OperationsApi follows it); a cluster's is one made of a part on each node.
 */
export interface AdminApi {
  createPool(spec: PoolSpec & Placement): Promise<unknown>;
  resizePool(name: string, size: number): Promise<unknown>;
  /** how many standbys were removed (a cluster's: and on which nodes) */
  removePool(name: string): Promise<{ removed: number }>;
  images(): Promise<unknown[]>;
  importImage(b: { source: string; name: string } & Placement): Promise<unknown>;
  buildImage(b: { spec: DebianSpec; name?: string } & Placement): Promise<unknown>;
  removeImage(name: string, force?: boolean): Promise<unknown>;
}

/** A scenario's network fault (POST /scenarios/{name}/net). */
export interface NetFault {
  action: 'block' | 'unblock' | 'partition' | 'heal';
  machines?: string[];
  groups?: string[][];
}

/**
 * Scenarios on the server's host (a cluster's: each on one node, its machines sharing networks).
 * `up` answers an operation; the others the scenario's own answers.
 */
export interface ScenariosApi {
  list(): Promise<unknown[]>;
  status(name: string): Promise<unknown>;
  up(b: { file: string; name?: string; driver?: string } & Placement): Promise<unknown>;
  down(name: string): Promise<unknown>;
  /** `standby` 0: no standby raised after it (scenario/standby.ts) */
  snapshot(name: string, snapshot: string, opts?: { standby?: 0 | 1 }): Promise<unknown>;
  /** `standby` 0: the machines raised again, no standby used nor raised */
  reset(name: string, to?: string, opts?: { standby?: 0 | 1 }): Promise<unknown>;
  net(name: string, fault: NetFault): Promise<void>;
}

/**
 * A gateway's way of serving a sandbox's own calls: the request, its body checked by the route's
 * schema, handed to the node that holds `sandbox` (null: /rpc, whose calls name their own) and the
 * answer streamed back; an upgrade to a WebSocket route (`socket`) joined to the node's byte for
 * byte (cluster/streams.ts).
 */
export type PassToNode = (
  req: FastifyRequest,
  reply: FastifyReply,
  to: { sandbox: string | null; socket: boolean },
) => Promise<void>;

/**
 * What the routes that a single daemon and a cluster gateway both serve (the same handlers,
 * schemas and OpenAPI entries) need of the server: the Daemon over its embedded Lab, the
 * gateway over a GatewayLab bound to each caller (cluster/gateway-host.ts).
 */
export interface RouteHost {
  /** the lab a request acts through: the daemon's one lab, or the cluster acting for this caller */
  labFor(caller: Caller): LabApi;
  /**
   * A sandbox made for the caller (a cluster's: placed, claimed, then made by its node), as the
   * API shows it, and the operation it traced
   */
  createSandbox(caller: Caller, body: CreateBody): Promise<{ view: Record<string, unknown>; opId: string | null }>;
  /** a sandbox the caller may see, as the API shows it (a cluster's: with its node, or lost or unreachable) */
  sandboxView(caller: Caller, idOrName: string): Promise<Record<string, unknown>>;
  destroySandbox(caller: Caller, idOrName: string): Promise<void>;
  /** a check pass now (a daemon's tells each removal as an event; a cluster's runs on every node) */
  check(caller: Caller): Promise<CheckResult['removed']>;
  /** what `list` is asked for a caller: undefined for everything the caller's lab shows */
  ownedBy(caller: Caller): string | undefined;
  /** may the caller see (or, `remove`, remove) this snapshot of what its lab lists? */
  snapshotVisible(caller: Caller, snap: SnapshotApi, remove?: boolean): boolean;
  /**
   * A command in a fresh sandbox of the pool, its result as the API answers it (a cluster's: on
   * the node placement picks, with its node); `signal`: its client went, the command is killed
   */
  runPool(caller: Caller, pool: string, run: PoolRunBody, signal?: AbortSignal): Promise<Record<string, unknown>>;
  /** GET /whoami: the caller, its scopes and quotas, and what this server holds it to */
  whoami(caller: Caller): Record<string, unknown>;
  /** GET /metrics, Prometheus text (a gateway's own; `recent`: its last N placements only) */
  metricsText(caller: Caller, recent?: number): Promise<string>;
  /** every visible machine's memory, pids and CPU time now (a cluster's: each with its node) */
  /** with `ids`: of those machines only (the others that name nothing visible are left out) */
  usage(caller: Caller, ids?: string[]): Promise<unknown[]>;
  /**
   * The event stream for this request, written as server-sent events to `res` until the client
   * goes (a daemon's journal; a cluster's from etcd, or one sandbox's from its node); `after`:
   * resume after that event id.
   */
  streamEvents(caller: Caller, req: IncomingMessage, res: ServerResponse, q: EventQuery): void | Promise<void>;
  /** an admin's changes (the routes require the admin scope) */
  adminFor(caller: Caller): AdminApi;
  /** scenarios (the routes require the admin scope for changes) */
  scenariosFor(caller: Caller): ScenariosApi;
  /** the long operations the caller may ask about */
  operationsFor(caller: Caller): OperationsApi;
  readonly keyAdmin: KeyAdmin;
  /**
   * A sandbox's own calls (sandbox-calls.ts), served by passing them to the node that holds it
   * (a gateway's); a daemon has none and serves them itself.
   */
  passToNode?: PassToNode;
}
