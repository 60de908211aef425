/**
 * The cluster as the server's routes see it (server/served-lab.ts, RouteHost): the gateway serves
 * the single daemon's own handlers, schemas and OpenAPI entries (server/routes-shared.ts) over a
 * GatewayLab bound to each request's caller. Whom a caller may see is the nodes' to decide (each
 * is told the caller, and keeps it to its own), so nothing is filtered here again; keys are the
 * cluster's, in etcd.
 */
import { SnaplabError } from '../errors.js';
import type { RouteHost } from '../server/served-lab.js';
import type { ClusterCore } from './core.js';
import { GatewayLab } from './gateway-lab.js';
import { createKeyEntry } from './keys.js';
import { clusterOperations } from './operations.js';
import { clusterAdmin } from './admin.js';
import { clusterScenarios } from './scenarios.js';

export function gatewayHost(core: ClusterCore): RouteHost {
  const { store } = core;
  return {
    labFor: (caller) => new GatewayLab(core, caller),
    // on every node that answers (each needs the admin scope: the caller's key is passed on)
    check: async (caller) => (await new GatewayLab(core, caller).check()).removed,
    ownedBy: () => undefined,
    snapshotVisible: () => true,
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
