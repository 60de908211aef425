/**
 * The streams a gateway joins instead of relaying (docs/cluster.md): a sandbox's WebSocket (an
 * exec stream, a process's attach) joined to its node's byte for byte once the node has switched
 * protocols, a request on a sandbox passed on as it comes (body and answer streamed), and `/rpc`
 * relayed call by call (its calls name different sandboxes). A capability of the GatewayLab
 * (`joinUpgrade`, `forward`), not a router: a front that holds the raw request hands it over.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { SnaplabError } from '../errors.js';
import type { Caller } from '../server/keys.js';
import type { ClusterCore } from './core.js';
import { forward, forwardUpgrade } from './proxy.js';
import { relayRpc } from './rpc-relay.js';

/** the WebSocket routes of a sandbox (docs/api.md) */
const SANDBOX_SOCKET = /^\/sandboxes\/([^/]+)\/(exec|processes\/[^/]+\/attach)$/;

/**
 * Join a client's WebSocket upgrade (`/rpc`, a sandbox's exec or attach) to where it goes, for
 * `caller`; rejects, before anything is switched, with the error a single daemon would give.
 */
export async function joinUpgrade(
  core: ClusterCore,
  caller: Caller,
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer,
): Promise<void> {
  const path = new URL(req.url!, 'http://x').pathname;
  if (path === '/rpc') {
    core.wss.handleUpgrade(req, socket, head, (ws) => relayRpc(core, ws, caller));
    return;
  }
  const m = SANDBOX_SOCKET.exec(path);
  if (!m) throw new SnaplabError('BAD_INPUT', `no WebSocket route ${path}`, 'see docs/api.md');
  const untrack = core.track(caller, () => socket.destroy());
  socket.once('close', untrack);
  const node = await core.nodeOf(decodeURIComponent(m[1]!), caller);
  // its key removed while its node was looked up: refused as if it had come a moment later
  if (!core.stillValid(caller))
    throw new SnaplabError(
      'UNAUTHORIZED',
      'the API key is not known (any more)',
      'make a new one with `snaplab key create NAME --cluster …`',
    );
  forwardUpgrade(req, socket, head, core.node(node).url, node, core.token, caller);
}

/** Pass a request on a sandbox to its node as it comes, and the answer back, both streamed. */
export async function forwardTo(
  core: ClusterCore,
  caller: Caller,
  sandbox: string,
  req: IncomingMessage,
  res: ServerResponse,
): Promise<void> {
  const node = await core.nodeOf(sandbox, caller);
  forward(req, res, core.node(node).url, node, core.token, caller);
}
