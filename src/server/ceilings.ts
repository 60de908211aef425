/**
 * A key's ceilings at the daemon's door (lab/ceilings.ts has the rules): before a create, restore
 * or standby take starts, the limits it will have are checked against the caller's key, and the
 * key's total is counted with what its other sandboxes hold and its creates under way here hold.
 * A key made with --no-egress is refused a machine with egress, and new egress lists.
 * The Unix socket's caller (root on the host already) gets what it asks, as the library does.
 */
import { LimitError, SnaplabError, isSnaplabError } from '../errors.js';
import { DEFAULT_DRIVER } from '../defaults.js';
import { egressRefused, limitsUnder, resolveCeilings, type Held } from '../lab/ceilings.js';
import { withDefaults } from '../lab/lifecycle/limits.js';
import type { LabApi } from '../sdk/api.js';
import type { ServedLab } from './served-lab.js';
import type { Limits } from '../store/records.js';
import type { StorageKind } from '../storage/backend.js';
import { LOCAL, type Caller } from './keys.js';
import type { CreateBody } from './schemas.js';

export interface CeilingAsk {
  /** what the request asked (undefined: nothing) */
  asked: Limits | undefined;
  /** what the machine gets where nothing is asked (a driver's, a snapshot's) */
  base: Limits;
  driver: string;
  /** the limits come with the machine (a standby, a memory snapshot): checked, never lowered */
  fixed?: boolean;
  /** false: the machine has no user namespace (a pool defined so): for admin keys only */
  userns?: boolean | null;
  /** what the machine is, for an error (`pool web`) */
  what?: string;
  /** the machine will have egress (asked for, or a pool's standbys have it): what, for a refusal */
  egress?: string;
  /** the storage it is made on (undefined: the default; a standby's is its pool's) */
  storage?: StorageKind;
}

export class CeilingGuard {
  /** what creates under way here hold, by key */
  private readonly making = new Map<string, Set<Held>>();
  /** snapshots under way here, by key */
  private readonly snapshotting = new Map<string, number>();

  constructor(private readonly lab: LabApi & Pick<ServedLab, 'held' | 'ownedSnapshots' | 'diskCapHolds'>) {}

  /**
   * The limits to make the machine with (undefined: as asked, the Unix socket's) and a release to
   * call when the create has ended, however it ended.
   */
  async claim(caller: Caller, body: CreateBody): Promise<{ limits: Limits | undefined; release: () => void }> {
    // the Unix socket gets what it asks: nothing to look up for it
    if (caller.key === LOCAL.key) return { limits: body.limits, release: () => {} };
    const ask = await askOf(this.lab, body);
    if (ask.egress) requireEgress(caller, ask.egress);
    // (a driver unknown here, or storage that does not work, is refused here as the create would be)
    const capHolds = await this.lab.diskCapHolds(ask.driver, ask.storage);
    const held = await this.listed(caller.key);
    // from here to the claim nothing awaits: two creates of one key each count the other's
    for (const m of this.making.get(caller.key) ?? []) {
      held.memoryBytes += m.memoryBytes;
      held.diskBytes += m.diskBytes;
    }
    refuseMade(caller, ask, capHolds);
    // what comes made is checked as it is, but for a disk cap where none can hold (a pool's miss
    // would be raised with the default: not a cap a key can be refused for)
    const asked = ask.fixed ? (capHolds ? ask.base : withoutDisk(ask.base)) : ask.asked;
    const limits = limitsUnder(caller.key, resolveCeilings(caller.ceilings), asked, ask.base, capHolds, held);
    const mine: Held = { memoryBytes: limits.memoryBytes ?? 0, diskBytes: limits.diskBytes ?? 0 };
    const set = this.making.get(caller.key) ?? new Set();
    this.making.set(caller.key, set.add(mine));
    return {
      limits,
      release: () => {
        set.delete(mine);
        if (!set.size) this.making.delete(caller.key);
      },
    };
  }

  /**
   * A slot for one more snapshot of this key's (taken of its sandbox), held until the snapshot
   * has ended: over its ceiling is QUOTA_EXCEEDED (429, limit `snapshots`).
   */
  async claimSnapshot(caller: Caller): Promise<() => void> {
    if (caller.key === LOCAL.key) return () => {};
    const ceiling = resolveCeilings(caller.ceilings).snapshots;
    if (ceiling === null) return () => {};
    const have = await this.lab.ownedSnapshots(caller.key);
    const making = this.snapshotting.get(caller.key) ?? 0;
    if (have + making >= ceiling)
      throw new LimitError(
        'QUOTA_EXCEEDED',
        'snapshots',
        `key ${caller.key} has ${have} of its ${ceiling} snapshots`,
        "remove one of its snapshots, or have an admin raise the key's --max-snapshots",
      );
    this.snapshotting.set(caller.key, making + 1);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      this.snapshotting.set(caller.key, (this.snapshotting.get(caller.key) ?? 1) - 1);
    };
  }

  /** What the key's machines hold: their limits (not their use), as recorded (a create must not wait for every machine to be checked). */
  private async listed(key: string): Promise<Held> {
    const { memoryBytes, diskBytes } = await this.lab.held(key);
    return { memoryBytes, diskBytes };
  }
}

function withoutDisk(l: Limits): Limits {
  const { diskBytes: _, ...rest } = l;
  return rest;
}

/** What a create body asks, and what its machine gets where it asks nothing. */
export async function askOf(lab: LabApi, body: CreateBody): Promise<CeilingAsk> {
  if (body.pool !== undefined) {
    // a standby comes made: its pool's limits are checked; an unknown pool fails in the take
    // this pool's stats alone (every pool's would check every standby of the host on a take)
    const pool = await lab
      .pool(body.pool)
      .stats()
      .catch((e: unknown) => {
        if (isSnaplabError(e, 'POOL_NOT_FOUND')) return undefined;
        throw e;
      });
    const what = `pool ${body.pool}`;
    return {
      asked: undefined,
      // what its standbys hold: a storage's default cap is theirs, not in the pool's own limits
      base: { ...pool?.limits, ...(pool?.standbyDiskBytes ? { diskBytes: pool.standbyDiskBytes } : {}) },
      driver: pool?.driver ?? DEFAULT_DRIVER,
      fixed: true,
      userns: pool?.userns,
      storage: pool?.storage,
      what,
      ...(pool?.egress ? { egress: `a standby of pool ${body.pool} (its standbys have egress)` } : {}),
    };
  }
  // anything but false or nothing is egress (an empty list too: resolveEgress)
  const asks = body.egress !== undefined && body.egress !== false;
  const egress = asks ? `a ${body.snapshot === undefined ? 'sandbox' : 'restore'} with egress` : undefined;
  if (body.snapshot !== undefined) {
    // a memory snapshot continues a machine of a fixed size; a filesystem one carries its disk cap
    // this one alone (every snapshot of the host was listed for it); an unknown one fails in the restore
    const snap = await lab.snapshot(body.snapshot).then(
      (s) => s.toJSON(),
      (e: unknown) => {
        if (isSnaplabError(e, 'SNAPSHOT_NOT_FOUND')) return undefined;
        throw e;
      },
    );
    const driver = typeof snap?.driver === 'string' ? snap.driver : DEFAULT_DRIVER;
    const limits = (snap?.limits as Limits | undefined) ?? {};
    if (snap?.kind === 'memory')
      return { asked: undefined, base: limits, driver, fixed: true, what: `snapshot ${body.snapshot}`, egress };
    const base = withDefaults(limits.diskBytes === undefined ? {} : { diskBytes: limits.diskBytes }, driver);
    const storage = typeof snap?.storage === 'string' ? (snap.storage as StorageKind) : undefined;
    return { asked: body.limits, base, driver, egress, storage };
  }
  const driver = body.driver ?? DEFAULT_DRIVER;
  return { asked: body.limits, base: withDefaults(undefined, driver), driver, egress, storage: body.storage };
}

/**
 * A key made with --no-egress may have no machine with egress nor change a machine's lists:
 * FORBIDDEN (403, limit `egress`). The Unix socket's caller may.
 */
export function requireEgress(caller: Caller, what: string): void {
  if (caller.key === LOCAL.key || resolveCeilings(caller.ceilings).egress) return;
  throw egressRefused(caller.key, what);
}

/**
 * What a machine that comes made (a pool's standby, a memory snapshot's machine) must already be
 * for a key: in a user namespace unless the key is an admin's, and with a disk cap where one holds
 * and the key has a disk ceiling (it cannot be given one now).
 */
function refuseMade(caller: Caller, ask: CeilingAsk, capHolds: boolean): void {
  if (ask.userns === false && !caller.scopes.has('admin'))
    throw new SnaplabError(
      'FORBIDDEN',
      `${ask.what ?? 'it'} has no user namespace (root inside is root on the host): key ${caller.key} may not have one`,
      'this needs a key with the admin scope',
    );
  if (ask.fixed && capHolds && !ask.base.diskBytes && resolveCeilings(caller.ceilings).diskBytes !== null)
    throw new LimitError(
      'ABOVE_CEILING',
      'diskBytes',
      `${ask.what ?? 'it'} has no disk cap, and key ${caller.key}'s sandboxes must have one`,
      'an admin gives the pool a disk cap (`snaplab pool create … --disk SIZE`)',
    );
}
