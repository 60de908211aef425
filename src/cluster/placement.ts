/**
 * Where a new sandbox goes (docs/cluster.md, "Placement"). The candidates are the nodes that are
 * up, not drained, carry every label asked for, and can serve the request (hold the pool, the
 * snapshot or the image). K of them are drawn at random (power of K choices: E2B places its
 * sandboxes this way) and the best score wins:
 *
 *   score = 10 × (a ready standby of the pool, or the image already on the node)
 *         + min(free memory / memory, free disk / disk) / (1 + sandboxes + creates in flight)
 *
 * so a warm standby beats any amount of free capacity, and among equals the emptier node wins.
 * Sampling K instead of scoring all keeps placement flat in the cluster's size and keeps several
 * gateways, each with a slightly old view, from all picking the same node.
 */
import { BUILTIN_IMAGE } from '../defaults.js';
import type { NodeInfo } from './store.js';

export interface PlacementRequest {
  pool?: string;
  snapshot?: string;
  image?: string;
  labels?: Record<string, string>;
  /** nodes not to use (a create that failed to start on one is tried once elsewhere) */
  exclude?: Set<string>;
}

export interface Candidate {
  node: NodeInfo;
  score: number;
}

/** Why no node qualified, for the error. */
export interface NoPlacement {
  reason: string;
}

export function eligible(
  nodes: Iterable<NodeInfo>,
  req: PlacementRequest,
  drained: Set<string>,
): NodeInfo[] | NoPlacement {
  let up = [...nodes];
  if (!up.length) return { reason: 'no node is in the cluster' };
  up = up.filter((n) => !drained.has(n.name) && !req.exclude?.has(n.name));
  if (!up.length) return { reason: 'every node is drained or was tried' };
  const want = Object.entries(req.labels ?? {});
  up = up.filter((n) => want.every(([k, v]) => n.labels[k] === v));
  if (!up.length) return { reason: `no node has the labels ${want.map(([k, v]) => `${k}=${v}`).join(',')}` };
  if (req.pool !== undefined) {
    up = up.filter((n) => n.pools[req.pool!]);
    if (!up.length) return { reason: `no node holds pool ${req.pool}` };
  } else if (req.snapshot !== undefined) {
    up = up.filter((n) => n.snapshots.includes(req.snapshot!));
    if (!up.length) return { reason: `no node holds snapshot ${req.snapshot}` };
  } else if (req.image !== undefined && req.image !== BUILTIN_IMAGE) {
    // an image is imported or built on nodes, one by one; the built-in one every node makes for itself on first use
    up = up.filter((n) => n.images.includes(req.image!));
    if (!up.length)
      return {
        reason: `no node has image ${req.image} (import or build it on the nodes: POST /images/import, /images/build)`,
      };
  }
  return up;
}

export function score(n: NodeInfo, req: PlacementRequest, load: number, inflightPool = 0): number {
  const c = n.capacity;
  const warm =
    req.pool !== undefined
      ? (n.pools[req.pool]?.ready ?? 0) - inflightPool > 0
      : req.image !== undefined && n.images.includes(req.image);
  const free = Math.min(
    c.memoryBytes ? c.memoryFreeBytes / c.memoryBytes : 0,
    c.diskBytes ? c.diskFreeBytes / c.diskBytes : 1,
  );
  return (warm ? 10 : 0) + Math.max(0, free) / (1 + load);
}

/** Best of K drawn at random (all of them when there are K or fewer). */
export function bestOfK(
  nodes: NodeInfo[],
  k: number,
  rate: (n: NodeInfo) => number,
  random: () => number = Math.random,
): Candidate {
  const pool = [...nodes];
  const drawn: NodeInfo[] = [];
  while (drawn.length < Math.max(1, k) && pool.length)
    drawn.push(pool.splice(Math.floor(random() * pool.length), 1)[0]!);
  let best: Candidate | undefined;
  for (const node of drawn) {
    const s = rate(node);
    if (!best || s > best.score) best = { node, score: s };
  }
  return best!;
}
