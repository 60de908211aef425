import { resolveImage } from '../images/templates.js';
import { resolveEgress } from '../../sdk/create-options.js';
import type { EgressRequest } from '../../sdk/api.js';
import { SnaplabError } from '../../errors.js';
import type { StorageKind } from '../../storage/backend.js';
import { POOL_WARMS, type Limits, type PoolRecord, type PoolWarm, type SandboxRecord } from '../../store/records.js';
import type { LabContext } from '../context.js';
import { DEFAULT_DISK_BYTES, DEFAULT_DRIVER } from '../../defaults.js';
import { capRefused } from '../lifecycle/raise.js';
import { withDefaults } from '../lifecycle/limits.js';
import { checkName } from '../names.js';
import { me, ownerAlive } from '../lifecycle/owner.js';
import { reconcile } from '../lifecycle/reconcile.js';
import { destroyRecord } from '../lifecycle/teardown.js';
import { removeSnapshot } from '../lifecycle/removals.js';
import { Trace } from '../../timing/trace.js';
import { join } from 'node:path';
import { withLock } from '../../host/lock.js';
import { noted } from '../../cleanup.js';
import { interpreterVersion } from '../../interpreter/start.js';

export interface PoolSpec {
  name: string;
  image: string;
  size: number;
  limits: Limits;
  storage?: StorageKind;
  recycle?: boolean;
  /** default namespaces; a VM driver's standbys are restored from a memory snapshot, paused */
  driver?: string;
  /** false: standbys without a user namespace (as create's userns) */
  userns?: boolean;
  /** its standbys' egress (as create's): a standby handed back is given these lists again */
  egress?: boolean | EgressRequest;
  /**
   * what each standby starts before it waits, so a take finds it running: 'interpreter', the code
   * interpreter's server and its default kernel (docs/pools.md). Such standbys are never recycled.
   */
  warm?: PoolWarm;
}

export interface PoolStats extends PoolRecord {
  ready: number;
  inUse: number;
  raising: number;
  dead: number;
  /**
   * the disk cap its standbys hold, ready or being raised (the smallest; a storage's default cap
   * included, which the pool's own limits do not name), or null when one of them has none; with
   * none, the pool's own
   */
  standbyDiskBytes: number | null;
}

export function getPool(ctx: LabContext, name: string): PoolRecord {
  const p = ctx.store.getPool(name);
  if (!p) {
    const known = ctx.store.listPools().map((x) => x.name);
    throw new SnaplabError(
      'POOL_NOT_FOUND',
      `no pool named ${JSON.stringify(name)}`,
      known.length
        ? `known pools: ${known.join(', ')}`
        : `create one with \`snaplab pool create ${name} --image busybox --size 4\``,
    );
  }
  return p;
}

export async function definePool(ctx: LabContext, spec: PoolSpec): Promise<PoolRecord> {
  checkName('pool', spec.name);
  if (ctx.store.getPool(spec.name)) {
    throw new SnaplabError(
      'POOL_EXISTS',
      `a pool named ${spec.name} already exists`,
      `resize it with \`snaplab pool resize ${spec.name} N\`, or remove it first`,
    );
  }
  if (!Number.isSafeInteger(spec.size) || spec.size < 0)
    throw new SnaplabError('BAD_INPUT', `invalid pool size ${spec.size}`, 'give a whole number ≥ 0');
  const driver = ctx.driver(spec.driver ?? DEFAULT_DRIVER);
  if (driver.capabilities.memorySnapshot) {
    // a VM's clean check would need the guest's word for its own state: every use gets a fresh restore
    if (spec.recycle)
      throw new SnaplabError(
        'BAD_INPUT',
        `standbys of the ${driver.name} driver are not recycled: each execution gets a fresh restore`,
        'drop --recycle',
      );
  }
  if (spec.warm !== undefined) checkWarm(spec, driver.capabilities.memorySnapshot, driver.name);
  await resolveImage(ctx, spec.image);
  const rec: PoolRecord = {
    name: spec.name,
    image: spec.image,
    storage: spec.storage ?? (await ctx.defaultStorage()),
    limits: withDefaults(spec.limits, driver.name),
    target: spec.size,
    // a warm standby's kernel carries what its execution left there, which no clean check can see
    recycle: driver.capabilities.memorySnapshot || spec.warm ? false : (spec.recycle ?? true),
    hits: 0,
    misses: 0,
    recycled: 0,
    refusedDirty: 0,
    leaks: 0,
    createdAt: Date.now(),
    driver: driver.name,
    template: null,
    userns: spec.userns === false ? false : null,
    egress: resolveEgress(spec.egress) ?? null,
    warm: spec.warm ?? null,
  };
  ctx.store.insertPool(rec);
  return rec;
}

function checkWarm(spec: PoolSpec, vm: boolean, driver: string): void {
  if (!(POOL_WARMS as readonly string[]).includes(spec.warm!))
    throw new SnaplabError(
      'BAD_INPUT',
      `a pool cannot warm ${JSON.stringify(spec.warm)}`,
      `give one of: ${POOL_WARMS.join(', ')}`,
    );
  if (spec.recycle)
    throw new SnaplabError(
      'BAD_INPUT',
      'standbys with a warm interpreter are not recycled: its kernel keeps what an execution left in it, which no clean check sees',
      'drop --recycle (each take gets a standby of its own, and the pool raises another)',
    );
  if (vm)
    throw new SnaplabError(
      'BAD_INPUT',
      `a pool of the ${driver} driver cannot warm an interpreter yet (its standbys are restores of one memory snapshot)`,
      'use the namespaces driver for a warm pool, or drop --warm (the first runCode then starts the kernel)',
    );
}

/** The pool's counters and its members by state, reconciled with the host (dead ones counted). */
export async function poolStats(ctx: LabContext, name: string): Promise<PoolStats> {
  getPool(ctx, name);
  // each member checked once (a take's ceilings ask for these: twice was ~0.9 ms a take at 12)
  const checked = await Promise.all(ctx.store.poolMembers(name).map((s) => reconcile(ctx, s)));
  const { reaped, tried } = await reapFrom(ctx, name, checked);
  const p = getPool(ctx, name);
  // one it tried to reap and did not (another reaper claimed it, its removal failed) as it is now
  const members = checked.flatMap((m) =>
    reaped.has(m.id) ? [] : tried.has(m.id) ? (ctx.store.getSandbox(m.id) ?? []) : [m],
  );
  const count = (st: string): number => members.filter((m) => m.state === st).length;
  // a warm pool's standbys another build warmed are no standbys to this one (runner.ts dropStale)
  const stale = new Set(p.warm ? ctx.store.poolStale(name, warmedAs(p)).map((m) => m.id) : []);
  const ready = members.filter((m) => m.state === 'paused' && !stale.has(m.id));
  // the cap a take gets: its standbys' (another build's too, and those being raised, whose cap is
  // set before they run: each was raised as a miss would be); with none of them (all taken, the
  // refill not yet running), the one a miss will get: the pool's own, else the storage's default
  const made = members.filter((m) => m.state === 'paused' || m.state === 'running');
  const caps = made.length ? made.map((m) => m.limits.diskBytes ?? 0) : [p.limits.diskBytes ?? missCap(ctx, p)];
  const standbyDiskBytes = Math.min(...caps) || null;
  return {
    ...p,
    ready: ready.length,
    inUse: count('running'),
    raising: count('creating'),
    dead: count('dead'),
    standbyDiskBytes,
  };
}

/**
 * How this build warms a standby of `pool`, as its standbys record it (sandboxes.warm_version): the
 * code interpreter's server and start command (interpreterVersion), or null for a pool that warms
 * nothing. A take claims only these (runner.ts).
 */
export function warmedAs(pool: { warm?: string | null }): string | null {
  return pool.warm === 'interpreter' ? interpreterVersion() : null;
}

/** The default disk cap a pool's miss is raised with, where its storage and driver hold one (raise.ts capDisk), else 0. */
function missCap(ctx: LabContext, p: PoolRecord): number {
  return capRefused(ctx.backend(p.storage), ctx.driver(p.driver), false) === null ? DEFAULT_DISK_BYTES : 0;
}

/** The reason a taken pool member carries, for people: its holder is the record's owner (me('hold')). */
export const takenBy = (): string => `taken by pid ${process.pid}`;

/**
 * Destroy pool members nobody can use any more: dead standbys, and members taken by a process
 * that has exited without giving them back. Each counts as a leak.
 */
export async function reapLeaks(ctx: LabContext, name: string): Promise<number> {
  const members: SandboxRecord[] = [];
  for (const s of ctx.store.poolMembers(name)) members.push(await reconcile(ctx, s));
  return (await reapFrom(ctx, name, members)).reaped.size;
}

/** reapLeaks on members already checked: the ids it removed, and those it found to remove (`tried`). */
async function reapFrom(
  ctx: LabContext,
  name: string,
  checked: SandboxRecord[],
): Promise<{ reaped: Set<string>; tried: Set<string> }> {
  const reaped = new Set<string>();
  const tried = new Set<string>();
  for (const r of checked) {
    const orphaned = r.state === 'running' && r.owner?.op === 'hold' && !(await ownerAlive(r.owner));
    if (r.state !== 'dead' && !orphaned) continue;
    tried.add(r.id);
    // a removal that failed (dead, its remover's step kept): counted when found; `gc` or `rm` finishes it
    if (r.state === 'dead' && r.owner?.op === 'remove') continue;
    // reapers run at once (the refill timer, `pool ls`, a stats call): the one that claims it counts it
    if (!ctx.store.claimRemoval(r, me('remove'))) continue;
    ctx.store.countPool(name, 'leaks');
    // one whose removal failed is still recorded: a stats call counts it dead, as it is
    const removed = await destroyRecord(ctx, r).then(
      () => true,
      (e: unknown) => {
        noted(`remove ${r.name}`)(e);
        return false;
      },
    );
    if (removed) reaped.add(r.id);
  }
  return { reaped, tried };
}

/** Remove standbys beyond `keep` (paused ones only: taken ones belong to whoever took them). */
export async function trimPool(ctx: LabContext, name: string, keep: number): Promise<number> {
  let removed = 0;
  await reapLeaks(ctx, name);
  for (const r of ctx.store.poolMembers(name)) {
    if (r.state !== 'paused') continue;
    if (keep > 0) {
      keep--;
      continue;
    }
    const claimed = ctx.store.claimStandby(name, takenBy(), me('hold')); // claim, so that no taker gets it meanwhile
    if (!claimed) break;
    await destroyRecord(ctx, claimed);
    removed++;
  }
  return removed;
}

/** Destroy the pool's standbys and forget it; sandboxes taken from it are destroyed on release. */
export async function removePool(ctx: LabContext, name: string): Promise<number> {
  const pool = getPool(ctx, name);
  const removed = await trimPool(ctx, name, 0);
  // under the pool's lock: a template being made meanwhile is finished (and then removed here)
  await withLock(
    poolLock(ctx, name),
    async () => {
      ctx.store.deletePool(name);
      // a template still in use (overlay storage under a member someone holds) stays: gc removes it later
      if (ctx.store.getSnapshot(templateName(pool)))
        await removeSnapshot(ctx, templateName(pool), new Trace('pool rm', name)).catch(
          noted(`remove template ${templateName(pool)}`, 'SNAPSHOT_NOT_FOUND', 'SNAPSHOT_EXISTS'),
        );
    },
    300_000,
  );
  return removed;
}

/**
 * The name of the memory snapshot a VM pool's standbys are restored from: this pool's, not a
 * later pool's of the same name (it carries the pool's creation time). It starts with "_", which
 * names given by users cannot (checkName), so it never collides with theirs.
 */
export const templateName = (pool: PoolRecord): string => `_pool.${pool.name}.${pool.createdAt.toString(36)}`;

/** Templates whose pool is gone (or was made again). */
export function orphanTemplates(ctx: LabContext): string[] {
  const live = new Set(ctx.store.listPools().map(templateName));
  return ctx.store
    .listSnapshots()
    .map((s) => s.name)
    .filter((n) => n.startsWith('_pool.') && !live.has(n));
}

/** The lock held while a pool's template is made or removed. */
export const poolLock = (ctx: LabContext, pool: string): string => join(ctx.home, 'run', `pool-${pool}.lock`);
