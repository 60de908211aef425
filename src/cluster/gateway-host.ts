/**
 * The cluster as the server's routes see it (server/served-lab.ts, RouteHost): the gateway serves
 * the single daemon's own handlers, schemas and OpenAPI entries (server/routes-shared.ts) over a
 * GatewayLab bound to each request's caller. Whom a caller may see is the nodes' to decide (each
 * is told the caller, and keeps it to its own), so nothing is filtered here again; keys are the
 * cluster's, in etcd.
 */
import type { FastifyInstance } from 'fastify';
import { Type } from 'typebox';
import { SnaplabError } from '../errors.js';
import { errors } from '../server/schemas.js';
import type { RouteHost } from '../server/served-lab.js';
import type { ClusterCore } from './core.js';
import { GatewayLab } from './gateway-lab.js';
import { createKeyEntry } from './keys.js';
import { clusterOperations } from './operations.js';
import { clusterAdmin } from './admin.js';
import { clusterScenarios } from './scenarios.js';
import { clusterEvents } from './events.js';
import { runInPool } from './pool-run.js';
import { gatewayMetrics } from './metrics.js';
import { createOnNode, destroyOnNode, viewOnNode } from './sandboxes.js';

export function gatewayHost(core: ClusterCore): RouteHost {
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
    runPool: (caller, pool, body) => runInPool(core, caller, pool, body),
    usage: async (caller) =>
      (await core.askAll<Record<string, unknown>[]>(caller, '/usage')).flatMap((a) =>
        a.value.map((u) => ({ ...u, node: a.node })),
      ),
    // one sandbox's stream is its node's (process events included); the cluster's is the store's
    streamEvents: (caller, req, res, q) =>
      q.sandbox ? new GatewayLab(core, caller).forward(q.sandbox, req, res) : clusterEvents(core, req, res, caller),
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

/** The routes a gateway has and a single daemon does not: the cluster's nodes. */
export function gatewayRoutes(app: FastifyInstance, core: ClusterCore): void {
  app.get(
    '/cluster/nodes',
    {
      config: { scope: 'read' },
      schema: {
        tags: ['cluster'],
        summary: "The cluster's nodes, as `snaplab cluster nodes` shows them (a cluster gateway's)",
        response: { 200: Type.Array(Type.Object({}, { additionalProperties: true })), ...errors },
      },
    },
    async () => [...core.view.nodes.values()].map((n) => ({ ...n, drained: core.view.drained.has(n.name) })),
  );
}
