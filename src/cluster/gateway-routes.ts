/**
 * The gateway's routes that are not yet the daemon's own (server/routes-shared.ts serves the
 * rest, over the cluster): a sandbox's own calls, passed on to the node that holds it as they
 * came, and the API document (docs/cluster.md, "What the gateway does with each call").
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { SnaplabError } from '../errors.js';
import { NO_CEILINGS } from '../lab/ceilings.js';
import type { Caller } from '../server/keys.js';
import type { GatewayApi } from './gateway-api.js';
import { ask, sendJson } from './proxy.js';

type Scope = 'read' | 'exec' | 'admin';
type Handler = (req: IncomingMessage, res: ServerResponse, m: RegExpExecArray, caller: Caller) => Promise<void> | void;

const dec = decodeURIComponent;

type Route = [method: string, path: RegExp, scope: Scope | null, handler: Handler];

/** A call on one sandbox: to its node, as it came. */
const toSandbox =
  (g: GatewayApi): Handler =>
  async (req, res, m, c) =>
    g.forward(req, res, await g.nodeOf(dec(m[1]!), c), c);

/** The API document: a node's, the whole API (the gateway's app serves the shared routes only). */
function serviceRoutes(g: GatewayApi): Route[] {
  return [
    [
      'GET',
      /^\/openapi\.json$/,
      null,
      async (_q, res) => {
        const n = [...g.view.nodes.values()][0];
        if (!n)
          throw new SnaplabError(
            'NODE_UNAVAILABLE',
            'no node is in the cluster',
            'start one: `snaplab serve --node --cluster …`',
          );
        sendJson(
          res,
          200,
          (
            await ask(
              n.url,
              n.name,
              g.token,
              { key: 'gateway', scopes: new Set(['read']), maxSandboxes: null, maxExecs: null, ceilings: NO_CEILINGS },
              'GET',
              '/openapi.json',
            )
          ).value,
        );
      },
    ],
  ];
}

/** A sandbox's own calls: to its node, as they came (its create, view and destroy: sandboxes.ts). */
function sandboxRoutes(g: GatewayApi): Route[] {
  return [
    ['PATCH', /^\/sandboxes\/([^/]+)$/, 'exec', toSandbox(g)],
    ['*', /^\/sandboxes\/([^/]+)\/.+$/, 'exec', toSandbox(g)],
  ];
}

/**
 * The gateway's own routes, not yet the daemon's shared ones: what answers the request, or
 * undefined when none of them is for it (the shared routes' app answers it then: gateway.ts).
 */
export function clusterRoutes(
  g: GatewayApi,
): (req: IncomingMessage, res: ServerResponse) => (() => Promise<void>) | undefined {
  const routes: Route[] = [...serviceRoutes(g), ...sandboxRoutes(g)];
  return (req, res) => {
    const path = new URL(req.url!, 'http://x').pathname;
    for (const [method, re, scope, handler] of routes) {
      if (method !== '*' && method !== req.method) continue;
      const m = re.exec(path);
      if (!m) continue;
      // a GET needs read; other methods the route's scope (the node checks its own again)
      const need: Scope | null = scope === null ? null : req.method === 'GET' ? 'read' : scope;
      return async () => handler(req, res, m, need ? g.authenticate(req, need) : ANONYMOUS);
    }
    if (path === '/' || path.startsWith('/assets/') || path.startsWith('/bench'))
      return async () => {
        throw new SnaplabError(
          'BAD_INPUT',
          `${path} is a node's, not a gateway's`,
          'open the dashboard of a node (its --listen address)',
        );
      };
    return undefined;
  };
}

const ANONYMOUS: Caller = {
  key: 'anonymous',
  scopes: new Set(),
  maxSandboxes: null,
  maxExecs: null,
  ceilings: NO_CEILINGS,
};
