/**
 * The gateway's routes: the single daemon's API (docs/api.md), each call answered by the node
 * that holds what it names, or by every node and merged (docs/cluster.md, "What the gateway
 * does with each call").
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { SnaplabError } from '../errors.js';
import { NO_CEILINGS } from '../lab/ceilings.js';
import { keyValues } from '../lab/io/exec.js';
import type { Caller } from '../server/keys.js';
import { absentView, type GatewayApi } from './gateway-api.js';
import { ask, asSnaplab, errorBody, readJson, sendJson, upstreamPath } from './proxy.js';
import { statusOf } from '../server/http-errors.js';
import type { NodeInfo } from './store.js';
import { eligible } from './placement.js';
import { composite, type Parts } from './operations.js';

type Scope = 'read' | 'exec' | 'admin';
type Handler = (req: IncomingMessage, res: ServerResponse, m: RegExpExecArray, caller: Caller) => Promise<void> | void;

/** The request's query for a node, without `token=` (a client's key is not passed on). */
const query = (req: IncomingMessage): string => {
  const q = upstreamPath(req.url!).split('?')[1];
  return q ? `?${q}` : '';
};
const dec = decodeURIComponent;

/** Some nodes refused: the first refusal as the error (its status), with what the others did. */
function partial(res: ServerResponse, refused: Parts['refused'], done: Record<string, unknown>): void {
  const e = refused[0]!;
  sendJson(res, statusOf((e.error.code as SnaplabError['code']) ?? 'INTERNAL'), {
    ...e.error,
    message: `node ${e.node} refused it: ${String(e.error.message)}`,
    refused,
    ...done,
  });
}

/** Run a call on each node; what each answered, and which refused (with their errors). */
async function onNodes<T>(
  nodes: NodeInfo[],
  call: (n: NodeInfo) => Promise<T>,
): Promise<{ done: { node: string; value: T }[]; refused: Parts['refused'] }> {
  const each = await Promise.allSettled(nodes.map(async (n) => ({ node: n.name, value: await call(n) })));
  return {
    done: each.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : [])),
    refused: each.flatMap((r, i) =>
      r.status === 'rejected' ? [{ node: nodes[i]!.name, error: errorBody(asSnaplab(r.reason)) }] : [],
    ),
  };
}

type Route = [method: string, path: RegExp, scope: Scope | null, handler: Handler];

/** What several route groups share: a call on one sandbox, on each node, on the nodes that hold a thing. */
function helpers(g: GatewayApi) {
  /** A call on one sandbox: to its node, as it came. */
  const toSandbox: Handler = async (req, res, m, c) => g.forward(req, res, await g.nodeOf(dec(m[1]!), c), c);
  /** The nodes the body's `placement.labels` (or all) name, for calls made on each node. */
  const targets = (body: Record<string, unknown>): NodeInfo[] => {
    const p = body.placement as { labels?: Record<string, string> } | undefined;
    delete body.placement;
    const ok = eligible(g.view.nodes.values(), { labels: p?.labels }, g.view.drained);
    if (!Array.isArray(ok))
      throw new SnaplabError('NODE_UNAVAILABLE', `no node to run it on: ${ok.reason}`, 'see `snaplab cluster nodes`');
    return ok;
  };
  /** Start an operation on each node; one composite operation back. */
  const onEach = async (
    res: ServerResponse,
    c: Caller,
    nodes: NodeInfo[],
    method: string,
    path: string,
    body: unknown,
  ): Promise<void> => {
    const { done, refused } = await onNodes(
      nodes,
      async (n) => (await ask<{ id: string }>(n.url, n.name, g.token, c, method, path, body)).value.id,
    );
    // refused everywhere: the first node's error, as a single daemon would give it
    if (!done.length)
      throw Object.assign(
        new SnaplabError(
          (refused[0]!.error.code as SnaplabError['code']) ?? 'INTERNAL',
          String(refused[0]!.error.message),
          refused[0]!.error.hint as string | undefined,
        ),
      );
    // started on some: one operation, which fails at its end if any node refused (the error names it)
    const ops = done.map((d) => ({ node: d.node, id: d.value }));
    sendJson(res, 202, {
      id: composite({ ops, refused }),
      kind: `${method} ${path}`,
      state: 'running',
      progress: [],
      result: null,
      error: null,
      nodes: ops.map((o) => o.node),
      refused,
    });
  };
  /** Where a named thing lives: the nodes whose answer for `path` is not a 404. */
  const holders = async (c: Caller, path: string): Promise<NodeInfo[]> =>
    (await g.askAll<unknown>(c, path))
      .map((a) => g.view.nodes.get(a.node))
      .filter((n): n is NodeInfo => n !== undefined);
  const firstHolder = async (c: Caller, path: string, what: SnaplabError): Promise<NodeInfo> => {
    const [n] = await holders(c, path);
    if (!n) throw what;
    return n;
  };
  return { toSandbox, targets, onEach, holders, firstHolder };
}

/** Health, the API document, the caller, the nodes and the event stream. */
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
    [
      'GET',
      /^\/events$/,
      'read',
      (req, res, _m, c) => {
        const sandbox = new URL(req.url!, 'http://x').searchParams.get('sandbox');
        // one sandbox's stream is its node's (process events included); the cluster's is the store's
        return sandbox ? g.nodeOf(sandbox, c).then((n) => g.forward(req, res, n, c)) : g.events(req, res, c);
      },
    ],
  ];
}

function sandboxRoutes(g: GatewayApi): Route[] {
  const { toSandbox } = helpers(g);
  return [
    ['POST', /^\/sandboxes$/, 'exec', (req, res, _m, c) => g.create(req, res, c)],
    [
      'GET',
      /^\/sandboxes$/,
      'read',
      async (req, res, _m, c) => {
        const q = new URL(req.url!, 'http://x').searchParams;
        const labels = keyValues(q.getAll('label'), 'label');
        const owner = q.get('owner');
        const boxes = await g.lab(c).list({
          labels,
          ...(owner === null ? {} : { owner: owner || null }),
          ...(q.get('check') === 'false' ? { check: false } : {}),
        });
        sendJson(
          res,
          200,
          boxes.map((b) => b.toJSON()),
        );
      },
    ],
    [
      'GET',
      /^\/sandboxes\/([^/]+)$/,
      'read',
      async (_q, res, m, c) => {
        const r = g.view.resolve(dec(m[1]!));
        if (r?.entry && g.owns(c, r.entry) && (r.entry.state === 'lost' || !g.view.live(r.node))) {
          return sendJson(res, 200, absentView(r.entry, g.view.left.has(r.node)));
        }
        const node = await g.nodeOf(dec(m[1]!), c);
        const v = await ask<Record<string, unknown>>(g.node(node).url, node, g.token, c, 'GET', `/sandboxes/${m[1]}`);
        sendJson(res, 200, { ...v.value, node });
      },
    ],
    [
      'DELETE',
      /^\/sandboxes\/([^/]+)$/,
      'exec',
      async (req, res, m, c) => {
        const r = g.view.resolve(dec(m[1]!));
        // a lost sandbox's record is all there is of it here: removing it is the delete (its node,
        // if it comes back, still destroys it: the record stays as a tombstone for a day)
        if (r?.entry?.state === 'lost' && g.owns(c, r.entry) && (await g.store.forget(r.entry))) {
          res.writeHead(204).end();
          return;
        }
        g.forward(req, res, await g.nodeOf(dec(m[1]!), c), c);
      },
    ],
    ['*', /^\/sandboxes\/([^/]+)(\/.+)?$/, 'exec', toSandbox],
    // a check pass on every node (each needs admin: the gateway's key is passed on)
    ['POST', /^\/check$/, 'admin', async (_q, res, _m, c) => sendJson(res, 200, await g.lab(c).check())],
  ];
}

/** Define, resize and remove a pool: on each node it is (to be) on. */
function poolChangeRoutes(g: GatewayApi): Route[] {
  const { targets, onEach, holders } = helpers(g);
  return [
    [
      'POST',
      /^\/pools$/,
      'admin',
      async (req, res, _m, c) => {
        const body = await readJson(req);
        await onEach(res, c, targets(body), 'POST', '/pools', body);
      },
    ],
    [
      'PATCH',
      /^\/pools\/([^/]+)$/,
      'admin',
      async (req, res, m, c) => {
        const body = await readJson(req);
        const nodes = await holders(c, `/pools/${m[1]}`);
        if (!nodes.length)
          throw new SnaplabError(
            'POOL_NOT_FOUND',
            `no pool named ${dec(m[1]!)} on any node`,
            'define one: POST /pools',
          );
        await onEach(res, c, nodes, 'PATCH', `/pools/${m[1]}`, body);
      },
    ],
    [
      'DELETE',
      /^\/pools\/([^/]+)$/,
      'admin',
      async (_q, res, m, c) => {
        const nodes = await holders(c, `/pools/${m[1]}`);
        if (!nodes.length)
          throw new SnaplabError(
            'POOL_NOT_FOUND',
            `no pool named ${dec(m[1]!)} on any node`,
            'list them with GET /pools',
          );
        // removing many standbys takes a while: no deadline but the node's own
        const { done, refused } = await onNodes(
          nodes,
          async (n) =>
            (await ask<{ removed: number }>(n.url, n.name, g.token, c, 'DELETE', `/pools/${m[1]}`, undefined, 0)).value
              .removed,
        );
        const removed = done.reduce((a, d) => a + d.value, 0);
        if (refused.length) return partial(res, refused, { removed, nodes: done.map((d) => d.node) });
        sendJson(res, 200, { removed, nodes: done.map((d) => d.node) });
      },
    ],
  ];
}

/** A pool run: on the node placement chooses, once more elsewhere if that node could not be reached. */
function poolRunRoute(g: GatewayApi): Route[] {
  return [
    [
      'POST',
      /^\/pools\/([^/]+)\/run$/,
      'exec',
      async (req, res, m, c) => {
        const body = await readJson(req);
        const tried = new Set<string>();
        for (;;) {
          const node = await g.placeRun(dec(m[1]!), tried);
          try {
            // as long as the command may run (its own deadline, or the daemon's 60 s default), and a margin
            const ms = typeof body.timeoutMs === 'number' ? body.timeoutMs : 60_000;
            const r = await ask<Record<string, unknown>>(
              g.node(node).url,
              node,
              g.token,
              c,
              'POST',
              `/pools/${m[1]}/run`,
              body,
              ms > 0 ? ms + 30_000 : 0,
            );
            return sendJson(res, 200, { ...r.value, node });
          } catch (e) {
            if (!(e as { connect?: boolean }).connect || tried.size) throw e;
            tried.add(node);
          } finally {
            g.runDone(node, dec(m[1]!));
          }
        }
      },
    ],
  ];
}

function imageRoutes(g: GatewayApi): Route[] {
  const { targets, onEach } = helpers(g);
  return [
    [
      'GET',
      /^\/images$/,
      'read',
      async (_q, res, _m, c) => {
        const by = new Map<string, Record<string, unknown> & { nodes: string[] }>();
        for (const a of await g.askAll<Record<string, unknown>[]>(c, '/images')) {
          for (const i of a.value) {
            const had = by.get(i.name as string);
            if (had) had.nodes.push(a.node);
            else by.set(i.name as string, { ...i, nodes: [a.node] });
          }
        }
        sendJson(res, 200, [...by.values()]);
      },
    ],
    [
      'POST',
      /^\/images\/(import|build)$/,
      'admin',
      async (req, res, m, c) => {
        const body = await readJson(req);
        await onEach(res, c, targets(body), 'POST', `/images/${m[1]}`, body);
      },
    ],
    [
      'DELETE',
      /^\/images\/([^/]+)$/,
      'admin',
      async (req, res, m, c) => {
        const q = query(req);
        const nodes = [...g.view.nodes.values()].filter((n) => n.images.includes(dec(m[1]!)));
        if (!nodes.length)
          throw new SnaplabError(
            'IMAGE_NOT_FOUND',
            `no image named ${dec(m[1]!)} on any node`,
            'list them with GET /images',
          );
        const { done, refused } = await onNodes(
          nodes,
          async (n) =>
            (
              await ask<Record<string, unknown>>(
                n.url,
                n.name,
                g.token,
                c,
                'DELETE',
                `/images/${m[1]}${q}`,
                undefined,
                0,
              )
            ).value,
        );
        if (refused.length) return partial(res, refused, { nodes: done.map((d) => ({ node: d.node, ...d.value })) });
        sendJson(res, 200, { nodes: done.map((d) => ({ node: d.node, ...d.value })) });
      },
    ],
  ];
}

function scenarioRoutes(g: GatewayApi): Route[] {
  const { firstHolder } = helpers(g);
  return [
    [
      'GET',
      /^\/scenarios$/,
      'read',
      async (_q, res, _m, c) =>
        sendJson(
          res,
          200,
          (await g.askAll<Record<string, unknown>[]>(c, '/scenarios')).flatMap((a) =>
            a.value.map((v) => ({ ...v, node: a.node })),
          ),
        ),
    ],
    [
      'POST',
      /^\/scenarios$/,
      'admin',
      async (req, res, _m, c) => {
        // a scenario's machines share networks: all on one node, the emptiest of K
        const body = await readJson(req);
        const p = body.placement as { labels?: Record<string, string> } | undefined;
        delete body.placement;
        const n = await g.place({ labels: p?.labels });
        const op = (await ask<{ id: string }>(n.url, n.name, g.token, c, 'POST', '/scenarios', body)).value;
        sendJson(res, 202, { ...op, id: composite({ ops: [{ node: n.name, id: op.id }], refused: [] }), node: n.name });
      },
    ],
    [
      '*',
      /^\/scenarios\/([^/]+)(\/(snapshot|reset|net))?$/,
      'admin',
      async (req, res, m, c) => {
        const n = await firstHolder(
          c,
          `/scenarios/${m[1]}`,
          new SnaplabError(
            'SCENARIO_NOT_FOUND',
            `no scenario named ${dec(m[1]!)} on any node`,
            'list them with GET /scenarios',
          ),
        );
        g.forward(req, res, n.name, c);
      },
    ],
  ];
}

/** Usage and the gateway's own metrics. */
function observeRoutes(g: GatewayApi): Route[] {
  return [
    [
      'GET',
      /^\/usage$/,
      'read',
      async (_q, res, _m, c) =>
        sendJson(
          res,
          200,
          (await g.askAll<Record<string, unknown>[]>(c, '/usage')).flatMap((a) =>
            a.value.map((u) => ({ ...u, node: a.node })),
          ),
        ),
    ],
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
  const routes: Route[] = [
    ...serviceRoutes(g),
    ...sandboxRoutes(g),
    ...poolChangeRoutes(g),
    ...poolRunRoute(g),
    ...imageRoutes(g),
    ...scenarioRoutes(g),
    ...observeRoutes(g),
  ];
  return (req, res) => {
    const path = new URL(req.url!, 'http://x').pathname;
    for (const [method, re, scope, handler] of routes) {
      if (method !== '*' && method !== req.method) continue;
      const m = re.exec(path);
      if (!m) continue;
      // every GET but the keys' needs read; other methods the route's scope (the node checks its own again)
      const need: Scope | null = scope === null ? null : req.method === 'GET' ? 'read' : scope;
      return async () => handler(req, res, m, need ? g.authenticate(req, need, path === '/events') : ANONYMOUS);
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
