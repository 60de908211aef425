/**
 * The gateway's routes that are not yet the daemon's own (server/routes-shared.ts serves the
 * rest, over the cluster): each call answered by the node that holds what it names, or by every
 * node and merged (docs/cluster.md, "What the gateway does with each call").
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

/** Health, the API document, the caller and the nodes. */
function serviceRoutes(g: GatewayApi): Route[] {
  return [
    ['GET', /^\/healthz$/, null, (_q, res) => sendJson(res, 200, g.health())],
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
    [
      'GET',
      /^\/whoami$/,
      'read',
      (_q, res, _m, c) =>
        sendJson(res, 200, {
          key: c.key,
          scopes: [...c.scopes],
          maxSandboxes: c.maxSandboxes,
          maxExecs: c.maxExecs,
          ceilings: c.ceilings,
          gateway: true,
        }),
    ],
    [
      'GET',
      /^\/cluster\/nodes$/,
      'read',
      (_q, res) =>
        sendJson(
          res,
          200,
          [...g.view.nodes.values()].map((n) => ({ ...n, drained: g.view.drained.has(n.name) })),
        ),
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

/** The gateway's own metrics. */
function observeRoutes(g: GatewayApi): Route[] {
  return [
    [
      'GET',
      /^\/metrics$/,
      'read',
      (req, res) => {
        // ?recent=N: the quantiles of the last N placements only (a bench reads its own)
        const recent = Number(new URL(req.url!, 'http://x').searchParams.get('recent') ?? 0);
        const t = (recent > 0 ? g.placements.slice(-recent) : [...g.placements]).sort((a, b) => a - b);
        const q = (p: number): number => (t.length ? t[Math.min(t.length - 1, Math.floor(p * t.length))]! : 0);
        const text = [
          '# HELP snaplab_gateway_nodes Nodes up in the cluster',
          '# TYPE snaplab_gateway_nodes gauge',
          `snaplab_gateway_nodes ${g.view.nodes.size}`,
          '# HELP snaplab_gateway_sandboxes Sandboxes recorded in the cluster, by state',
          '# TYPE snaplab_gateway_sandboxes gauge',
          ...Object.entries(
            [...g.view.sandboxes.values()].reduce<Record<string, number>>((a, e) => {
              a[e.state] = (a[e.state] ?? 0) + 1;
              return a;
            }, {}),
          ).map(([s, n]) => `snaplab_gateway_sandboxes{state="${s}"} ${n}`),
          '# HELP snaplab_gateway_placement_ms Time to choose a node (recent placements)',
          '# TYPE snaplab_gateway_placement_ms summary',
          `snaplab_gateway_placement_ms{quantile="0.5"} ${q(0.5)}`,
          `snaplab_gateway_placement_ms{quantile="0.99"} ${q(0.99)}`,
          `snaplab_gateway_placement_ms_count ${t.length}`,
        ];
        res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(`${text.join('\n')}\n`);
      },
    ],
  ];
}

/**
 * The gateway's own routes, not yet the daemon's shared ones: what answers the request, or
 * undefined when none of them is for it (the shared routes' app answers it then: gateway.ts).
 */
export function clusterRoutes(
  g: GatewayApi,
): (req: IncomingMessage, res: ServerResponse) => (() => Promise<void>) | undefined {
  const routes: Route[] = [...serviceRoutes(g), ...sandboxRoutes(g), ...observeRoutes(g)];
  return (req, res) => {
    const path = new URL(req.url!, 'http://x').pathname;
    for (const [method, re, scope, handler] of routes) {
      if (method !== '*' && method !== req.method) continue;
      const m = re.exec(path);
      if (!m) continue;
      // every GET but the keys' needs read; other methods the route's scope (the node checks its own again)
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
