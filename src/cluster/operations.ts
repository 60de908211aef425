/**
 * Long operations in a cluster: a node's own, or one that ran on several nodes (a pool defined on
 * each, an image built on each). The gateway keeps none: an operation's id names its parts (`c.`
 * and, encoded, each node's operation id, and the nodes that refused to start it with their
 * errors), so any gateway, asked later, answers for it by asking those nodes.
 */
import { SnaplabError } from '../errors.js';
import type { Caller } from '../server/keys.js';
import type { OperationsApi } from '../server/served-lab.js';
import type { ClusterCore } from './core.js';
import { ask } from './proxy.js';

/** The nodes' parts of an operation, and the nodes that refused to start it (with their errors). */
export interface Parts {
  ops: { node: string; id: string }[];
  refused: { node: string; error: Record<string, unknown> }[];
}

export const composite = (p: Parts): string =>
  `c.${Buffer.from(JSON.stringify([p.ops.map((o) => [o.node, o.id]), p.refused])).toString('base64url')}`;

export function parts(id: string): Parts {
  try {
    if (!id.startsWith('c.')) throw new Error('not composite');
    const [ops, refused] = JSON.parse(Buffer.from(id.slice(2), 'base64url').toString()) as [
      [string, string][],
      Parts['refused'],
    ];
    return { ops: ops.map(([node, i]) => ({ node, id: i })), refused: refused ?? [] };
  } catch (e) {
    throw new SnaplabError(
      'OPERATION_NOT_FOUND',
      `no operation ${id} in the cluster`,
      'operation ids a gateway gives start with c.',
      { cause: e },
    );
  }
}

/** One view of an operation from its parts' views: running while any runs, failed if any failed or was refused. */
function merged(id: string, refused: Parts['refused'], views: Record<string, unknown>[]): Record<string, unknown> {
  const running = views.some((v) => v.state === 'running');
  const failedView = views.find((v) => v.state === 'failed');
  const failed = failedView
    ? { ...(failedView.error as Record<string, unknown>), node: failedView.node }
    : !running && refused.length
      ? {
          ...refused[0]!.error,
          message: `node ${refused[0]!.node} refused it: ${String(refused[0]!.error.message)}`,
          node: refused[0]!.node,
        }
      : undefined;
  return {
    id,
    state: running ? 'running' : failed ? 'failed' : 'done',
    error: failed ?? null,
    refused,
    result: running || failed ? null : (views[0]?.result ?? null),
    progress: views.flatMap((v) => (v.progress as string[]).map((l) => `${v.node}: ${l}`)),
    nodes: views,
  };
}

/** The cluster's operations, as a caller sees them (each node applies the caller's key). */
export function clusterOperations(core: ClusterCore, caller: Caller): OperationsApi {
  return {
    list: async () =>
      (await core.askAll<Record<string, unknown>[]>(caller, '/operations')).flatMap((a) =>
        a.value.map((o) => ({ ...o, id: composite({ ops: [{ node: a.node, id: o.id as string }], refused: [] }) })),
      ),
    // every node's part waited on at once: the answer comes when all have ended, or at the wait
    get: async (id, waitS = 0) => {
      const { ops, refused } = parts(id);
      const views = await Promise.all(
        ops.map(async (p) => {
          const n = core.node(p.node);
          const path = `/operations/${encodeURIComponent(p.id)}${waitS ? `?wait=${waitS}` : ''}`;
          const r = await ask<Record<string, unknown>>(
            n.url,
            n.name,
            core.token,
            caller,
            'GET',
            path,
            undefined,
            waitS * 1000 + 15_000,
          );
          return { ...r.value, node: p.node };
        }),
      );
      return merged(id, refused, views);
    },
  };
}
