/**
 * What `lab.check` and `lab.traces` read for the public API (sdk/api.ts): the check pass a server
 * runs on its tick, and stored traces. (`lab.list` reads its page in one query: Store.pageSandboxes.)
 */
import type { TraceSummary } from '../../timing/trace.js';
import type { LabContext } from '../context.js';
import { reconcile } from './reconcile.js';
import { thawOrphans } from './inflight.js';
import { destroyRecord } from './teardown.js';
import { noted, orElse } from '../../cleanup.js';
import { pidThere } from '../../host/procs.js';
import type { SandboxRecord } from '../../store/records.js';

/** (sdk/api.ts's CheckResult: the lab does not import the API it is under) */
export interface Checked {
  removed: { id: string; name: string; reason: string | null; owner: string | null }[];
}

/**
 * Every record checked against the host (a pool's paused standbys are its pool's to check), then
 * what a create that died half-way left (dead, its owner's step 'create') removed. `reconciled`:
 * the records were checked against the host just now (a daemon's start, after its gc): only the
 * removal, not a second probe of every machine. `quick`: a machine whose process is there (one
 * kill(pid, 0), not a read of its /proc stat) is taken as running; only the others are
 * reconciled. A machine's record names the process whose life is the machine's (its init, its
 * QEMU: each driver's inspect reads that one), so a death is seen by a quick pass as by a full
 * one; what only a full pass sees is a pid taken since by another process (or a zombie nobody
 * reaps). A daemon's tick makes every twelfth pass a full one.
 */
export async function checkSandboxes(
  ctx: LabContext,
  opts: { reconciled?: boolean; quick?: boolean } = {},
): Promise<Checked> {
  if (!opts.reconciled) await reconcileUnsettled(ctx, opts.quick ?? false);
  await thawOrphans(ctx);
  const removed: Checked['removed'] = [];
  // read after the reconcile: a change made meanwhile is seen as it is now, not as it was (those
  // rows alone: a daemon's start reads every record once, in gc's pass)
  for (const r of ctx.store.interruptedCreates()) {
    const owner = ctx.store.getMeta(r.id)?.owner ?? null;
    await destroyRecord(ctx, r).catch(noted(`remove ${r.name}, left by an interrupted create`));
    removed.push({ id: r.id, name: r.name, reason: r.reason, owner });
  }
  return { removed };
}

/**
 * The records a reconcile has something to ask of, reconciled (a dead one has nothing; thousands
 * of stopped machines are not read): each, or with `quick` those whose process is not there.
 */
export async function reconcileUnsettled(ctx: LabContext, quick: boolean): Promise<void> {
  const due = quick
    ? ctx.store
        .unsettledProbes()
        .filter((p) => !poolsToCheck(p) && !processThere(p))
        .map((p) => ctx.store.getSandbox(p.id))
    : ctx.store.unsettledSandboxes().filter((r) => !poolsToCheck(r));
  await Promise.all(due.map((r) => r && reconcile(ctx, r).catch(orElse(r, `reconcile ${r.name}`))));
}

/** A pool's paused standby: its pool checks it. */
const poolsToCheck = (r: Pick<SandboxRecord, 'pool' | 'state'>): boolean => r.pool !== null && r.state === 'paused';

/**
 * A running or paused machine whose recorded process is there. Always asked about: creating and
 * removing ones (their owner's life is the question), and a pool's template (it lives only while
 * the process making it does: reconcile asks that too).
 */
function processThere(p: Pick<SandboxRecord, 'state' | 'pid' | 'templateOf'>): boolean {
  if (p.templateOf !== null) return false;
  return (p.state === 'running' || p.state === 'paused') && p.pid !== null && p.pid > 0 && pidThere(p.pid);
}

/** Stored traces, newest first: `targets` keeps those of these sandboxes, scenarios or pools. */
export function storedTraces(
  ctx: LabContext,
  q: { limit?: number; targets?: string[] },
): (TraceSummary & { details: unknown })[] {
  return ctx.store.listOperations(q.limit ?? 20, q.targets);
}

/**
 * A pool's takes from the stored traces (takes by the CLI and the library count as well as a
 * daemon's own): those stored after a cursor, or that started in the last `since` ms.
 */
export function poolTakes(
  ctx: LabContext,
  pool: string,
  from: { after?: number; since?: number },
): { now: number; next: number; takes: { id: string; at: number; kind: string; ms: number | null; hit: boolean }[] } {
  const now = Date.now();
  const { next, ops } = ctx.store.operationsStored(
    pool,
    ['run', 'take'],
    from.after !== undefined ? { cursor: from.after } : { since: now - (from.since ?? 60_000) },
  );
  // a pool's runs and takes say hit or miss; a one-shot run traced with an image of the same name does not
  const takes = ops
    .filter((t) => typeof (t.details as { hit?: unknown } | null)?.hit === 'boolean')
    .map((t) => {
      const take = t.kind === 'take' ? t.totalMs : t.phases.find((p) => p.name === 'take' && p.parent === null);
      const ms = typeof take === 'number' ? take : take ? take.endMs - take.startMs : null;
      return { id: t.id, at: t.startedAt, kind: t.kind, ms, hit: (t.details as { hit: boolean }).hit };
    });
  return { now, next, takes };
}
