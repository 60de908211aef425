/**
 * What the gateway's routes, its event stream and its /rpc relay need of the gateway: they are
 * given this, not the Gateway class, so that gateway.ts imports them and none of them imports it.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { LabApi } from '../sdk/api.js';
import type { Caller } from '../server/keys.js';
import type { PlacementRequest } from './placement.js';
import type { ClusterStore, NodeInfo, SandboxEntry } from './store.js';
import type { ClusterView } from './view.js';

export interface GatewayApi {
  readonly store: ClusterStore;
  readonly view: ClusterView;
  /** the cluster token, with which the gateway speaks to nodes */
  readonly token: string;
  /** recent placement times (ms), for /metrics */
  readonly placements: number[];
  authenticate(req: IncomingMessage, scope: 'read' | 'exec' | 'admin', headerless?: boolean): Caller;
  owns(caller: Caller, e: { owner: string | null }): boolean;
  stillValid(caller: Caller): boolean;
  track(caller: Caller, close: () => void): () => void;
  node(name: string): NodeInfo;
  nodeOf(idOrName: string, caller: Caller): Promise<string>;
  place(req: PlacementRequest): Promise<NodeInfo>;
  placeRun(pool: string, exclude: Set<string>): Promise<string>;
  runDone(node: string, pool: string): void;
  askAll<T>(caller: Caller, path: string, nodes?: Iterable<NodeInfo>): Promise<{ node: string; value: T }[]>;
  forward(req: IncomingMessage, res: ServerResponse, node: string, caller: Caller): void;
  health(): Record<string, unknown>;
  /** the cluster as a LabApi acting for this caller (the GatewayLab): routes answer through it */
  lab(caller: Caller): LabApi;
}

/** What a list shows for a sandbox its node cannot answer for. */
export function absentView(e: SandboxEntry, left: boolean): Record<string, unknown> {
  return {
    id: e.id,
    name: e.name,
    image: e.image,
    state: e.state === 'lost' ? 'lost' : 'unreachable',
    node: e.node,
    owner: e.owner,
    labels: e.labels,
    // what the node alone knows is unknown here: the fields a view has, empty
    metadata: {},
    storage: null,
    driver: null,
    limits: {},
    origin: null,
    pid: null,
    timeoutS: 0,
    onTimeout: 'kill',
    expiresAt: null,
    createdAt: new Date(e.createdAt).toISOString(),
    reason:
      e.state === 'lost'
        ? e.reason
        : left
          ? `its node ${e.node} was stopped; it serves its sandboxes again when it restarts`
          : `its node ${e.node} is not answering`,
  };
}
