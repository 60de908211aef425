/**
 * The cluster as the server's routes see it (server/served-lab.ts, RouteHost): the gateway serves
 * the single daemon's own routes, schemas and OpenAPI entries (server/routes-shared.ts and the
 * sandbox's own calls, server/sandbox-calls.ts) over a GatewayLab bound to each request's caller;
 * a sandbox's own calls it passes to the node that holds it. Whom a caller may see is the nodes'
 * to decide (each is told the caller, and keeps it to its own), so nothing is filtered here again;
 * keys are the cluster's, in etcd.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { Readable } from 'node:stream';
import { Type } from 'typebox';
import { SnaplabError } from '../errors.js';
import { errors } from '../server/schemas.js';
import type { PassToNode, RouteHost } from '../server/served-lab.js';
import type { ClusterCore } from './core.js';
import type { Caller } from '../server/keys.js';
import { GatewayLab } from './gateway-lab.js';
import { createKeyEntry } from './keys.js';
import { clusterOperations } from './operations.js';
import { clusterAdmin } from './admin.js';
import { clusterScenarios } from './scenarios.js';
import { clusterEvents } from './events.js';
import { runInPool } from './pool-run.js';
import { gatewayMetrics } from './metrics.js';
import { createOnNode, destroyOnNode, viewOnNode } from './sandboxes.js';
import { upgradeOf } from './streams.js';

export function gatewayHost(core: ClusterCore): RouteHost & { passToNode: PassToNode } {
  const { store } = core;
  return {
    labFor: (caller) => new GatewayLab(core, caller),
    // as the key was made (each node holds it to its own defaults where it names none)
    whoami: (c) => ({
      key: c.key,
      scopes: [...c.scopes],
      maxSandboxes: c.maxSandboxes,
      maxExecs: c.maxExecs,
      ceilings: c.ceilings,
      gateway: true,
    }),
    metricsText: async (_caller, recent) => gatewayMetrics(core, recent),
    createSandbox: (caller, body) => createOnNode(core, caller, body),
    sandboxView: (caller, id) => viewOnNode(core, caller, id),
    destroySandbox: (caller, id) => destroyOnNode(core, caller, id),
    // on every node that answers (each needs the admin scope: the caller's key is passed on)
    check: async (caller) => (await new GatewayLab(core, caller).check()).removed,
    ownedBy: () => undefined,
    snapshotVisible: () => true,
    runPool: (caller, pool, body, signal) => runInPool(core, caller, pool, body, signal),
    usage: async (caller, ids) =>
      (ids ? await usageOf(core, caller, ids) : await core.askAll<Record<string, unknown>[]>(caller, '/usage')).flatMap(
        (a) => a.value.map((u) => ({ ...u, node: a.node })),
      ),
    // one sandbox's stream is its node's (process events included); the cluster's is the store's
    streamEvents: (caller, req, res, q) =>
      q.sandbox ? new GatewayLab(core, caller).forward(q.sandbox, req, res) : clusterEvents(core, req, res, caller),
    passToNode: (req, reply, to) => passToNode(new GatewayLab(core, req.caller), req, reply, to),
    adminFor: (caller) => clusterAdmin(core, caller),
    scenariosFor: (caller) => clusterScenarios(core, caller),
    operationsFor: (caller) => clusterOperations(core, caller),
    keyAdmin: {
      list: async () => (await store.keys()).map(({ hash: _h, ...k }) => k),
      create: (name, opts) => createKeyEntry(store, name, opts),
      remove: async (name) => {
        if (!(await store.deleteKey(name)))
          throw new SnaplabError('KEY_NOT_FOUND', `no key named ${name}`, 'see GET /keys');
      },
    },
  };
}

/**
 * A sandbox's own call, its route's schema and scope checked here as a daemon checks them, served
 * by its node: an upgrade joined, a request passed on with the body the route took.
 */
async function passToNode(
  lab: GatewayLab,
  req: FastifyRequest,
  reply: FastifyReply,
  to: { sandbox: string | null; socket: boolean },
): Promise<void> {
  const upgrade = upgradeOf(req.raw);
  if (upgrade) {
    if (!to.socket)
      throw new SnaplabError('BAD_INPUT', `${req.routeOptions.url} is not a WebSocket route`, 'see docs/api.md');
    return lab.joinSocket(to.sandbox, req.raw, upgrade, () => reply.hijack());
  }
  // a WebSocket route asked without an upgrade: what a daemon answers (@fastify/websocket's)
  if (to.socket || to.sandbox === null) return void reply.code(404).send();
  return lab.forward(to.sandbox, req.raw, reply.raw, bodyOf(req), () => reply.hijack());
}

/**
 * What the route read of a request's body, to send on: none for a stream (an upload, piped as it
 * comes) or no body at all; a parsed one as its JSON (as the route's schema took it) or its text.
 */
function bodyOf(req: FastifyRequest): Buffer | undefined {
  const b = req.body;
  if (b === undefined || b instanceof Readable) return undefined;
  return Buffer.from(typeof b === 'string' ? b : JSON.stringify(b));
}

/** The routes a gateway has and a single daemon does not: the cluster's nodes. */
export function gatewayRoutes(app: FastifyInstance, core: ClusterCore): void {
  app.get(
    '/cluster/nodes',
    {
      schema: {
        tags: ['cluster'],
        summary: "The cluster's nodes, as `snaplab cluster nodes` shows them (a cluster gateway's)",
        response: { 200: Type.Array(Type.Object({}, { additionalProperties: true })), ...errors },
      },
    },
    async () => [...core.view.nodes.values()].map((n) => ({ ...n, drained: core.view.drained.has(n.name) })),
  );
  // a node's dashboard is its own (it reads the node's host): the gateway says where it is
  const dashboard = async (req: FastifyRequest): Promise<never> => {
    throw new SnaplabError(
      'BAD_INPUT',
      `${req.url.split('?')[0]} is a node's, not a gateway's`,
      'open the dashboard of a node (its --listen address)',
    );
  };
  for (const path of ['/', '/assets/*', '/bench', '/bench/*'])
    app.get(path, { config: { public: true }, schema: { hide: true } }, dashboard);
}

/**
 * The usage of these sandboxes: each asked of the node the cluster says holds it (an id it does not
 * know, of every node), so that a page's poll costs the page, not the page times the nodes.
 */
async function usageOf(
  core: ClusterCore,
  caller: Caller,
  ids: string[],
): Promise<{ node: string; value: Record<string, unknown>[] }[]> {
  const byNode = new Map<string, string[]>();
  const unknown: string[] = [];
  for (const id of ids) {
    const node = core.view.sandboxes.get(id)?.node;
    if (!node || !core.view.nodes.has(node)) unknown.push(id);
    else if (byNode.has(node)) byNode.get(node)!.push(id);
    else byNode.set(node, [id]);
  }
  const path = (some: string[]): string => `/usage?id=${some.map(encodeURIComponent).join(',')}`;
  const asked = await Promise.all([
    ...[...byNode].map(([node, some]) =>
      core.askAll<Record<string, unknown>[]>(caller, path(some), [core.view.nodes.get(node)!]),
    ),
    unknown.length ? core.askAll<Record<string, unknown>[]>(caller, path(unknown)) : [],
  ]);
  return asked.flat();
}
