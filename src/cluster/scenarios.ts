/**
 * A cluster's scenarios (server/served-lab.ts, ScenariosApi): a scenario's machines share
 * networks, so it is raised on one node (placed like a create, the emptiest of K), and each of
 * its later calls goes to the node that holds it. A list asks every node, each item with its node.
 */
import { SnaplabError } from '../errors.js';
import type { Caller } from '../server/keys.js';
import type { ScenariosApi } from '../server/served-lab.js';
import type { ClusterCore } from './core.js';
import { composite } from './operations.js';
import { ask } from './proxy.js';

const enc = encodeURIComponent;

export function clusterScenarios(core: ClusterCore, caller: Caller): ScenariosApi {
  /** The first node that has the scenario, and its status there. */
  const holder = async (name: string): Promise<{ node: string; status: unknown }> => {
    const [first] = await core.askAll<unknown>(caller, `/scenarios/${enc(name)}`);
    if (!first)
      throw new SnaplabError(
        'SCENARIO_NOT_FOUND',
        `no scenario named ${name} on any node`,
        'list them with GET /scenarios',
      );
    return { node: first.node, status: first.value };
  };
  /** A change of the scenario, on its node: as long as it takes (the node's own bounds). */
  const onHolder = async (name: string, method: string, sub: string, body?: unknown): Promise<unknown> => {
    const n = core.node((await holder(name)).node);
    return (await ask(n.url, n.name, core.token, caller, method, `/scenarios/${enc(name)}${sub}`, body, 0)).value;
  };
  return {
    list: async () =>
      (await core.askAll<Record<string, unknown>[]>(caller, '/scenarios')).flatMap((a) =>
        a.value.map((v) => ({ ...v, node: a.node })),
      ),
    status: async (name) => (await holder(name)).status,
    up: async ({ placement, ...body }) => {
      const n = await core.place({ labels: placement?.labels });
      const op = (await ask<{ id: string }>(n.url, n.name, core.token, caller, 'POST', '/scenarios', body)).value;
      return { ...op, id: composite({ ops: [{ node: n.name, id: op.id }], refused: [] }), node: n.name };
    },
    down: (name) => onHolder(name, 'DELETE', ''),
    snapshot: (name, snapshot, opts) => onHolder(name, 'POST', '/snapshot', { name: snapshot, ...opts }),
    reset: (name, to, opts) => onHolder(name, 'POST', '/reset', { ...(to === undefined ? {} : { to }), ...opts }),
    net: async (name, fault) => {
      await onHolder(name, 'POST', '/net', fault);
    },
  };
}
