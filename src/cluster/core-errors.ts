/** The errors a gateway gives as a single daemon would, and how it reads a node's. */
import { SnaplabError } from '../errors.js';
import { statusOf } from '../server/http-errors.js';
import { nodeUnavailable, neverConnected } from './proxy.js';
import type { PlacementRequest } from './placement.js';
import type { SandboxEntry } from './store.js';

export function lostError(e: SandboxEntry): SnaplabError {
  return new SnaplabError(
    'SANDBOX_LOST',
    `sandbox ${e.name} is lost: ${e.reason ?? `node ${e.node} is gone`}`,
    'create a new one; `DELETE /sandboxes/{id}` removes this record',
  );
}

export function notFound(idOrName: string): SnaplabError {
  return new SnaplabError(
    'SANDBOX_NOT_FOUND',
    `no sandbox named ${JSON.stringify(idOrName)} in the cluster`,
    'list them with `snaplab ls` (SNAPLAB_HOST=the gateway)',
  );
}

/** What a single daemon says of a pool, snapshot or image it does not have, when no node has it. */
export function unplaceable(req: PlacementRequest): SnaplabError {
  if (req.pool !== undefined)
    return new SnaplabError(
      'POOL_NOT_FOUND',
      `no pool named ${JSON.stringify(req.pool)} on any node`,
      'define one: POST /pools',
    );
  if (req.snapshot !== undefined)
    return new SnaplabError(
      'SNAPSHOT_NOT_FOUND',
      `no snapshot named ${JSON.stringify(req.snapshot)} on any node`,
      'list them with GET /snapshots',
    );
  return new SnaplabError(
    'IMAGE_NOT_FOUND',
    `no node has image ${JSON.stringify(req.image)}`,
    'import or build it on the nodes: POST /images/import, /images/build',
  );
}

/**
 * A remote lab's error on a node, as the gateway's own requests mark theirs: not reached at all
 * (`connect`: nothing was started there), or answered (`status`: the node said no). Anything else
 * (the connection lost mid-call) has neither: its outcome is unknown.
 */
export function fromNode(node: string, e: unknown): Error {
  if (!(e instanceof SnaplabError)) return e as Error;
  if (e.code === 'DAEMON_UNREACHABLE') {
    // the system's error (ECONNREFUSED, ETIMEDOUT…) says why; else (no answer in time) the client's own does
    const cause = (e as { cause?: NodeJS.ErrnoException }).cause;
    const errno = /^E[A-Z0-9]+$/.test(String(cause?.code)) ? cause : undefined;
    return Object.assign(nodeUnavailable(node, errno ?? e), { connect: neverConnected(errno) });
  }
  if (e.code === 'ABORTED') return e;
  return Object.assign(e, { status: statusOf(e.code) });
}

/** Call a node through its remote lab, its errors read as fromNode says. */
export async function onNode<T>(node: string, call: () => Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (e) {
    throw fromNode(node, e);
  }
}

/** A node's refusal named, as one error (its code, the node in its message, the first cause). */
export function refusedBy(refused: { node: string; error: unknown }[]): SnaplabError {
  const { node, error } = refused[0]!;
  const e = error instanceof SnaplabError ? error : new SnaplabError('INTERNAL', String(error));
  return new SnaplabError(e.code, `node ${node} refused it: ${e.message}`, e.hint, { cause: error });
}
