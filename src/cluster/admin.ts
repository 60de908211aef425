/**
 * A cluster's AdminApi (server/served-lab.ts): pools and images are each node's, so a change is
 * made on each node it names (those of `placement.labels`, or those that hold the thing) and
 * answered as one: a long change as one operation made of each node's (operations.ts), a removal
 * with what each node removed. A node that refused is named in the answer.
 */
import { SnaplabError } from '../errors.js';
import type { Caller } from '../server/keys.js';
import type { AdminApi, Placement } from '../server/served-lab.js';
import type { ClusterCore } from './core.js';
import { composite, type Parts } from './operations.js';
import { eligible } from './placement.js';
import { ask, asSnaplab, errorBody } from './proxy.js';
import type { NodeInfo } from './store.js';

const enc = encodeURIComponent;

/** Some nodes refused, others did it: the first refusal as the error (its status), with what the others did. */
class PartlyDone extends SnaplabError {
  constructor(
    private readonly refused: Parts['refused'],
    private readonly done: Record<string, unknown>,
  ) {
    const e = refused[0]!.error;
    super(
      (e.code as SnaplabError['code']) ?? 'INTERNAL',
      `node ${refused[0]!.node} refused it: ${String(e.message)}`,
      e.hint as string | undefined,
    );
  }

  override toJSON(): ReturnType<SnaplabError['toJSON']> {
    return { ...super.toJSON(), refused: this.refused, ...this.done } as ReturnType<SnaplabError['toJSON']>;
  }
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

export function clusterAdmin(core: ClusterCore, caller: Caller): AdminApi {
  /** The nodes `placement.labels` (or all) name, for a change made on each node. */
  const targets = (p: Placement['placement']): NodeInfo[] => {
    const ok = eligible(core.view.nodes.values(), { labels: p?.labels }, core.view.drained);
    if (!Array.isArray(ok))
      throw new SnaplabError('NODE_UNAVAILABLE', `no node to run it on: ${ok.reason}`, 'see `snaplab cluster nodes`');
    return ok;
  };
  /** Start an operation on each node; one composite operation back. */
  const onEach = async (nodes: NodeInfo[], method: string, path: string, body: unknown): Promise<unknown> => {
    const { done, refused } = await onNodes(
      nodes,
      async (n) => (await ask<{ id: string }>(n.url, n.name, core.token, caller, method, path, body)).value.id,
    );
    // refused everywhere: the first node's error, as a single daemon would give it
    const first = refused[0]?.error;
    if (!done.length && first)
      throw new SnaplabError(
        (first.code as SnaplabError['code']) ?? 'INTERNAL',
        String(first.message),
        first.hint as string | undefined,
      );
    // started on some: one operation, which fails at its end if any node refused (the error names it)
    const ops = done.map((d) => ({ node: d.node, id: d.value }));
    return {
      id: composite({ ops, refused }),
      kind: `${method} ${path}`,
      state: 'running',
      progress: [],
      result: null,
      error: null,
      nodes: ops.map((o) => o.node),
      refused,
    };
  };
  /** The nodes that hold the pool (whose answer for it is not a 404). */
  const poolHolders = async (name: string): Promise<NodeInfo[]> => {
    const nodes = (await core.askAll<unknown>(caller, `/pools/${enc(name)}`))
      .map((a) => core.view.nodes.get(a.node))
      .filter((n): n is NodeInfo => n !== undefined);
    if (!nodes.length)
      throw new SnaplabError('POOL_NOT_FOUND', `no pool named ${name} on any node`, 'list them with GET /pools');
    return nodes;
  };
  return {
    createPool: ({ placement, ...spec }) => onEach(targets(placement), 'POST', '/pools', spec),
    resizePool: async (name, size) => onEach(await poolHolders(name), 'PATCH', `/pools/${enc(name)}`, { size }),
    removePool: async (name) => {
      // removing many standbys takes a while: no deadline but the node's own
      const { done, refused } = await onNodes(
        await poolHolders(name),
        async (n) =>
          (
            await ask<{ removed: number }>(
              n.url,
              n.name,
              core.token,
              caller,
              'DELETE',
              `/pools/${enc(name)}`,
              undefined,
              0,
            )
          ).value.removed,
      );
      const answer = { removed: done.reduce((a, d) => a + d.value, 0), nodes: done.map((d) => d.node) };
      if (refused.length) throw new PartlyDone(refused, answer);
      return answer;
    },
    images: async () => {
      const by = new Map<string, Record<string, unknown> & { nodes: string[] }>();
      for (const a of await core.askAll<Record<string, unknown>[]>(caller, '/images'))
        for (const i of a.value) {
          const had = by.get(i.name as string);
          if (had) had.nodes.push(a.node);
          else by.set(i.name as string, { ...i, nodes: [a.node] });
        }
      return [...by.values()];
    },
    importImage: ({ placement, ...b }) => onEach(targets(placement), 'POST', '/images/import', b),
    buildImage: ({ placement, ...b }) => onEach(targets(placement), 'POST', '/images/build', b),
    removeImage: async (name, force) => {
      const nodes = [...core.view.nodes.values()].filter((n) => n.images.includes(name));
      if (!nodes.length)
        throw new SnaplabError('IMAGE_NOT_FOUND', `no image named ${name} on any node`, 'list them with GET /images');
      const path = `/images/${enc(name)}${force ? '?force=true' : ''}`;
      const { done, refused } = await onNodes(
        nodes,
        async (n) =>
          (await ask<Record<string, unknown>>(n.url, n.name, core.token, caller, 'DELETE', path, undefined, 0)).value,
      );
      const answer = { nodes: done.map((d) => ({ node: d.node, ...d.value })) };
      if (refused.length) throw new PartlyDone(refused, answer);
      return answer;
    },
  };
}
