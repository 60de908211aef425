/**
 * How a gateway serves a sandbox's own calls (server/sandbox-calls.ts): the routes are the
 * daemon's, with its schemas and scopes, and their handlers hand each request over to this. A
 * request is passed to the sandbox's node, its body as the route took it (an upload streamed as
 * it comes, a JSON body as its schema checked it) and the answer streamed back; a WebSocket (an
 * exec stream, a process's attach) is joined to its node's byte for byte once the node has
 * switched protocols; `/rpc` is relayed call by call (its calls name different sandboxes). A
 * capability of the GatewayLab (`joinSocket`, `forward`), not a router.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { SnaplabError } from '../errors.js';
import type { Caller } from '../server/keys.js';
import type { ClusterCore } from './core.js';
import { asSnaplab, forward, forwardUpgrade } from './proxy.js';
import { relayRpc } from './rpc-relay.js';

/** A client's WebSocket upgrade, not yet answered: its socket and what came after the headers. */
export interface Upgrade {
  socket: Duplex;
  head: Buffer;
}

const UPGRADE = Symbol('snaplab.upgrade');
type Upgrading = IncomingMessage & { [UPGRADE]?: Upgrade };

/** Keep an upgrade with its request while the app routes it (gateway.ts: the route's handler joins it). */
export function holdUpgrade(req: IncomingMessage, up: Upgrade): void {
  (req as Upgrading)[UPGRADE] = up;
}

/** The upgrade a request asks for, if it is one. */
export function upgradeOf(req: IncomingMessage): Upgrade | undefined {
  return (req as Upgrading)[UPGRADE];
}

/** The node that holds a sandbox; the store not answering is CLUSTER_UNAVAILABLE, not a bug. */
async function nodeOf(core: ClusterCore, sandbox: string, caller: Caller): Promise<string> {
  try {
    return await core.nodeOf(sandbox, caller);
  } catch (e) {
    throw asSnaplab(e);
  }
}

/**
 * Join a client's WebSocket to where it goes, for `caller`: a sandbox's to its node's, `/rpc`
 * (sandbox null) to the relay. Rejects, before anything is switched, with the error a single
 * daemon would give; `taken` is called once it can no longer be refused.
 */
export async function joinSocket(
  core: ClusterCore,
  caller: Caller,
  sandbox: string | null,
  req: IncomingMessage,
  up: Upgrade,
  taken: () => void,
): Promise<void> {
  if (sandbox === null) {
    taken();
    core.wss.handleUpgrade(req, up.socket, up.head, (ws) => relayRpc(core, ws, caller));
    return;
  }
  const untrack = core.track(caller, () => up.socket.destroy());
  up.socket.once('close', untrack);
  const node = await nodeOf(core, sandbox, caller);
  // its key removed while its node was looked up: refused as if it had come a moment later
  if (!core.stillValid(caller))
    throw new SnaplabError(
      'UNAUTHORIZED',
      'the API key is not known (any more)',
      'make a new one with `snaplab key create NAME --cluster …`',
    );
  taken();
  forwardUpgrade(req, up.socket, up.head, core.node(node).url, node, core.token, caller);
}

/**
 * Pass a request on a sandbox to its node, and the answer back, streamed; `body`: what the route
 * read of it (none: the request's own, piped as it comes). `taken` is called once the node is
 * found, before a byte is written.
 */
export async function forwardTo(
  core: ClusterCore,
  caller: Caller,
  sandbox: string,
  req: IncomingMessage,
  res: ServerResponse,
  body?: Buffer,
  taken?: () => void,
): Promise<void> {
  const node = await nodeOf(core, sandbox, caller);
  taken?.();
  forward(req, res, core.node(node).url, node, core.token, caller, body);
}
