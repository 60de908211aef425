/**
 * A create's inputs, checked and given their defaults (src/defaults.ts) once for every front: the
 * embedded Lab, the daemon and the cluster gateway call resolveCreate before they make anything,
 * so that a default is applied in one place and a bad combination is refused the same way by all.
 */
import { DEFAULT_DRIVER, DEFAULT_IMAGE } from '../defaults.js';
import { SnaplabError } from '../errors.js';
import { withDefaults } from '../lab/lifecycle/limits.js';
import type { StorageKind } from '../storage/backend.js';
import type { Limits } from '../store/records.js';
import type { EgressRequest, LabCreateOptions } from './api.js';
import { checkLists, type EgressLists } from '../host/net/egress-rules.js';
import { checkRangeSize } from '../host/userns/registry.js';

/** A create's inputs as a daemon's request carries them: also a snapshot to restore. */
export type CreateInputs = LabCreateOptions & { snapshot?: string };

/** What every create has: its lifetime (s; undefined: none), and its egress lists (undefined: none). */
interface Resolved {
  timeoutS?: number;
  egress?: EgressLists;
}

/** A machine raised from an image: every choice made. */
export interface ImageCreate extends Resolved {
  from: 'image';
  image: string;
  driver: string;
  /** undefined: the best backend this host has (LabContext.defaultStorage, probed) */
  storage?: StorageKind;
  /** as asked, over the driver's own defaults, over the lab's */
  limits: Limits;
  userns?: boolean;
  /** ids of its user namespace (checked: checkRangeSize); undefined: 65536 */
  ids?: number;
  /** as asked; undefined: the image's own (machineInit, once the image is known) */
  init?: 'agent' | 'systemd';
}

/** A ready standby of a pool: the pool's image, storage, driver and limits. */
export interface PoolCreate extends Resolved {
  from: 'pool';
  pool: string;
}

/** A new machine from a snapshot: its limits are the snapshot's unless others are given. */
export interface SnapshotCreate extends Resolved {
  from: 'snapshot';
  snapshot: string;
  limits?: Limits;
  userns?: boolean;
  /** undefined: the snapshot's sandbox's */
  ids?: number;
}

export type ResolvedCreate = ImageCreate | PoolCreate | SnapshotCreate;

/**
 * Check a create's inputs and give each its default. `defaults.timeoutS` is the lifetime of a
 * create that asks none: a daemon's --default-timeout; the embedded lab gives none (nothing of it
 * would end the sandbox).
 */
export function resolveCreate(o: CreateInputs, defaults: { timeoutS?: number } = {}): ResolvedCreate {
  checkSources(o);
  if (o.timeoutS !== undefined && (!Number.isSafeInteger(o.timeoutS) || o.timeoutS < 0))
    throw new SnaplabError('BAD_INPUT', `invalid timeoutS ${o.timeoutS}`, 'give whole seconds ≥ 0 (0: no timeout)');
  const timeoutS = o.timeoutS ?? defaults.timeoutS;
  const egress = resolveEgress(o.egress);
  const life = { ...(timeoutS === undefined ? {} : { timeoutS }), ...(egress ? { egress } : {}) };
  if (o.pool !== undefined) return { from: 'pool', pool: o.pool, ...life };
  const ids = o.ids === undefined ? {} : { ids: checkRangeSize(o.ids) };
  if (o.snapshot !== undefined)
    return { from: 'snapshot', snapshot: o.snapshot, limits: o.limits, userns: o.userns, ...ids, ...life };
  const driver = o.driver ?? DEFAULT_DRIVER;
  return {
    from: 'image',
    image: o.image ?? DEFAULT_IMAGE,
    driver,
    storage: o.storage,
    limits: withDefaults(o.limits, driver),
    userns: o.userns,
    init: o.init,
    ...ids,
    ...life,
  };
}

/** A create's egress: off (undefined), or on with its lists checked. */
export function resolveEgress(e: boolean | EgressRequest | undefined): EgressLists | undefined {
  if (e === undefined || e === false) return undefined;
  if (e === true) return { allow: [], deny: [] };
  if (typeof e !== 'object' || e === null)
    throw new SnaplabError('BAD_INPUT', 'egress must be true, false or { allow, deny }', 'see docs/egress.md');
  return checkLists(e);
}

function checkSources(o: CreateInputs): void {
  const sources = [o.image, o.snapshot, o.pool].filter((x) => x !== undefined).length;
  if (sources > 1)
    throw new SnaplabError(
      'BAD_INPUT',
      'give one of image, snapshot and pool',
      `a sandbox comes from an image (default ${DEFAULT_IMAGE}), a snapshot, or a pool standby`,
    );
  if (o.pool !== undefined && (o.name !== undefined || o.limits || o.storage || o.driver || o.egress || o.ids)) {
    throw new SnaplabError(
      'BAD_INPUT',
      'a pool standby takes no name, limits, storage, driver, ids or egress',
      "they are the pool's; give labels, metadata and a timeout only",
    );
  }
}

/** A machine's init once its image is known (the rule is lab/lifecycle/init.ts's, for pools too). */
export { initFor as machineInit } from '../lab/lifecycle/init.js';
