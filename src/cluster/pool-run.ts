/**
 * A pool run in a cluster (server/served-lab.ts, RouteHost.runPool): on the node placement picks
 * (a ready standby first), once more elsewhere if that node could not be reached; the node's
 * answer, with its node.
 */
import type { Caller } from '../server/keys.js';
import type { PoolRunBody } from '../server/served-lab.js';
import type { ClusterCore } from './core.js';
import { ask } from './proxy.js';

export async function runInPool(
  core: ClusterCore,
  caller: Caller,
  pool: string,
  body: PoolRunBody,
  signal?: AbortSignal,
): Promise<Record<string, unknown>> {
  const tried = new Set<string>();
  for (;;) {
    const node = await core.placeRun(pool, tried);
    try {
      // as long as the command may run (its own deadline, or the daemon's 60 s default), and a margin
      const ms = body.timeoutMs ?? 60_000;
      const path = `/pools/${encodeURIComponent(pool)}/run`;
      const r = await ask<Record<string, unknown>>(
        core.node(node).url,
        node,
        core.token,
        caller,
        'POST',
        path,
        body,
        ms > 0 ? ms + 30_000 : 0,
        signal,
      );
      return { ...r.value, node };
    } catch (e) {
      if (!(e as { connect?: boolean }).connect || tried.size) throw e;
      tried.add(node);
    } finally {
      core.runDone(node, pool);
    }
  }
}
