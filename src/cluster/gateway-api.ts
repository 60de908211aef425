/**
 * What the gateway's event stream (events.ts) needs of the gateway: it is given this, not the
 * Gateway class, so that gateway.ts imports it and it does not import gateway.ts. The routes,
 * the daemon's own, are given the cluster as a RouteHost (gateway-host.ts).
 */
import type { IncomingMessage } from 'node:http';
import type { Caller } from '../server/keys.js';
import type { ClusterStore, SandboxEntry } from './store.js';
import type { ClusterView } from './view.js';

export interface GatewayApi {
  readonly store: ClusterStore;
  readonly view: ClusterView;
  /** the cluster token, with which the gateway speaks to nodes */
  readonly token: string;
  authenticate(req: IncomingMessage, scope: 'read' | 'exec' | 'admin', headerless?: boolean): Caller;
  owns(caller: Caller, e: { owner: string | null }): boolean;
  track(caller: Caller, close: () => void): () => void;
  nodeOf(idOrName: string, caller: Caller): Promise<string>;
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
