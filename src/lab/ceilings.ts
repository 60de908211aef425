/**
 * What an API key may ask of the host: ceilings on each sandbox it makes (memory, pids, CPUs,
 * disk), on all of its sandboxes at once (memory, disk), and whether they may have egress (a
 * key made with --no-egress: none, docs/egress.md). Without them a key with the exec
 * scope chose its own limits: 64 GiB of memory, 4 M pids, and an overlay sandbox writing to the
 * host's root filesystem uncapped were all accepted. A key made without ceilings gets the
 * defaults below; an admin lifts one with `none` (`--max-memory none`). The Unix socket (root on
 * the host already) has none. The daemon checks a create against them (limitsUnder) before
 * anything is made.
 */
import { availableParallelism, totalmem } from 'node:os';
import { LimitError, SnaplabError } from '../errors.js';
import type { Ceilings, Limits } from '../store/records.js';
import { withDefaults } from './lifecycle/limits.js';

export type { Ceilings };
import { DEFAULT_DISK_BYTES } from '../defaults.js';
import { formatBytes } from './sizes.js';

export const CEILING_NAMES: readonly (keyof Ceilings)[] = [
  'memoryBytes',
  'pids',
  'cpus',
  'diskBytes',
  'totalMemoryBytes',
  'totalDiskBytes',
  'snapshots',
  'egress',
];

export const NO_CEILINGS: Readonly<Ceilings> = {
  memoryBytes: null,
  pids: null,
  cpus: null,
  diskBytes: null,
  totalMemoryBytes: null,
  totalDiskBytes: null,
  snapshots: null,
  egress: true,
};

const GiB = 1024 ** 3;

/**
 * The ceilings of a key made without them, from this host: 4 GiB of memory, 4096 pids, every CPU
 * and 16 GiB of disk per sandbox; half the host's memory and 64 GiB of disk over all of them; 50
 * snapshots; egress allowed (keys made before this ceiling had it: forbidding it by default would
 * have taken it from them).
 */
export function defaultCeilings(): Ceilings {
  return {
    memoryBytes: 4 * GiB,
    pids: 4096,
    cpus: availableParallelism(),
    diskBytes: 16 * GiB,
    totalMemoryBytes: Math.max(4 * GiB, Math.floor(totalmem() / 2)),
    totalDiskBytes: 64 * GiB,
    snapshots: 50,
    egress: true,
  };
}

/** A key's ceilings: what it was made with (null there: lifted), the defaults for the rest. */
export function resolveCeilings(given: Partial<Ceilings> | null | undefined): Ceilings {
  return { ...defaultCeilings(), ...given };
}

/** Checked on the way in: each a whole number ≥ 1 (cpus: a number > 0), or null; egress true or false. */
export function checkCeilings(given: Partial<Ceilings>): Partial<Ceilings> {
  const out: Partial<Ceilings> = {};
  for (const [k, v] of Object.entries(given)) {
    if (!CEILING_NAMES.includes(k as keyof Ceilings))
      throw new SnaplabError(
        'BAD_INPUT',
        `unknown ceiling ${JSON.stringify(k)}`,
        `ceilings are ${CEILING_NAMES.join(', ')}`,
      );
    if (v === undefined) continue;
    if (k === 'egress') {
      if (typeof v !== 'boolean')
        throw new SnaplabError('BAD_INPUT', `invalid egress ceiling ${JSON.stringify(v)}`, 'give true or false');
      out.egress = v;
      continue;
    }
    const ok = v === null || (typeof v === 'number' && (k === 'cpus' ? v > 0 : Number.isSafeInteger(v) && v >= 1));
    if (!ok)
      throw new SnaplabError('BAD_INPUT', `invalid ${k} ceiling ${JSON.stringify(v)}`, 'give a number > 0, or none');
    out[k as Exclude<keyof Ceilings, 'egress'>] = v as number | null;
  }
  return out;
}

/**
 * A refusal of egress to a key made without it (FORBIDDEN, 403, limit `egress`): `what` is what
 * would have had it (`a sandbox with egress`, `new egress lists`).
 */
export function egressRefused(key: string, what: string): LimitError {
  return new LimitError(
    'FORBIDDEN',
    'egress',
    `${what} refused: key ${key} may not have egress (it was made with --no-egress)`,
    'leave out egress (a machine without it has loopback only), or have an admin make a key without --no-egress',
  );
}

/** What the key's sandboxes hold now (their limits), creates under way included. */
export interface Held {
  memoryBytes: number;
  diskBytes: number;
}

/** What a key's recorded sandboxes hold: how many (its sandbox quota) and their limits (its totals). */
export interface Owned extends Held {
  sandboxes: number;
}

/**
 * What these sandboxes of a key hold: every recorded one counts toward its quota; the limits of
 * those that hold room (the driver's defaults where none was set) toward its totals. A dead one
 * holds room only when it was stopped (it keeps its volume: its start must not take the key past
 * its ceilings). Each row stands for `count` alike (Store.ownedLimits groups them).
 */
export function heldBy(rows: readonly { driver: string; limits: Limits; holdsRoom: boolean; count: number }[]): Owned {
  const held: Owned = { sandboxes: 0, memoryBytes: 0, diskBytes: 0 };
  for (const r of rows) {
    held.sandboxes += r.count;
    if (!r.holdsRoom) continue;
    const l = withDefaults(r.limits, r.driver);
    held.memoryBytes += r.count * (l.memoryBytes ?? 0);
    held.diskBytes += r.count * (l.diskBytes ?? 0);
  }
  return held;
}

const show = (k: 'memoryBytes' | 'pids' | 'cpus' | 'diskBytes', n: number): string =>
  k === 'memoryBytes' || k === 'diskBytes' ? formatBytes(n) : String(n);
const FLAG = { memoryBytes: '--max-memory', pids: '--max-pids', cpus: '--max-cpus', diskBytes: '--max-disk' };
const WHAT = { memoryBytes: 'memory', pids: 'pids', cpus: 'CPUs', diskBytes: 'disk' };

/**
 * The limits a sandbox of this key is made with: what was asked, refused (ABOVE_CEILING, 403)
 * where it is above a ceiling; what was not asked, the default lowered to the ceiling. Disk is
 * always capped where a cap holds (`diskCapHolds`: the machine's root is its volume), so that no
 * sandbox of a key writes to the host's filesystem unbounded; 0 (no cap) is refused under a disk
 * ceiling. Where no cap holds (`diskCapHolds` false: a VM, btrfs without simple quotas) none is
 * given, and the disk ceilings do not apply. Then the totals: over them is QUOTA_EXCEEDED (429), naming the limit.
 */
export function limitsUnder(
  key: string,
  c: Ceilings,
  asked: Limits | undefined,
  defaults: Limits,
  diskCapHolds: boolean,
  held: Held,
): Limits {
  const out: Limits = { ...defaults, ...asked };
  for (const k of ['memoryBytes', 'pids', 'cpus', 'diskBytes'] as const) {
    const ceiling = c[k];
    if (ceiling === null) continue;
    const want = asked?.[k];
    if (want !== undefined && (want > ceiling || (k === 'diskBytes' && want === 0)))
      throw new LimitError(
        'ABOVE_CEILING',
        k,
        `${WHAT[k]} ${want === 0 ? 'without a cap' : show(k, want)} is above key ${key}'s ceiling of ${show(k, ceiling)} per sandbox`,
        `ask for at most ${show(k, ceiling)}, or have an admin make a key with a higher ${FLAG[k]}`,
      );
    if (want === undefined && k !== 'diskBytes' && out[k] !== undefined) out[k] = Math.min(out[k], ceiling);
    // a cap carried from a snapshot is not lowered (what it holds may not fit): it is refused
    if (want === undefined && k === 'diskBytes' && diskCapHolds && (out.diskBytes ?? 0) > ceiling)
      throw new LimitError(
        'ABOVE_CEILING',
        k,
        `the disk cap of ${show(k, out.diskBytes!)} it would carry is above key ${key}'s ceiling of ${show(k, ceiling)} per sandbox`,
        `ask for a disk of at most ${show(k, ceiling)} (limits.diskBytes), or have an admin raise the key's --max-disk`,
      );
  }
  if (diskCapHolds && !out.diskBytes) out.diskBytes = Math.min(DEFAULT_DISK_BYTES, c.diskBytes ?? DEFAULT_DISK_BYTES);
  // where none holds, a cap it was not asked for is dropped; one asked for stays, and the create
  // refuses it (raise.ts capDisk), as it refuses `--disk` there: never accepted and not held
  if (!diskCapHolds && asked?.diskBytes === undefined) delete out.diskBytes;
  overTotal(key, 'totalMemoryBytes', c.totalMemoryBytes, held.memoryBytes, out.memoryBytes ?? 0);
  overTotal(key, 'totalDiskBytes', c.totalDiskBytes, held.diskBytes, out.diskBytes ?? 0);
  return out;
}

function overTotal(
  key: string,
  limit: 'totalMemoryBytes' | 'totalDiskBytes',
  ceiling: number | null,
  held: number,
  more: number,
): void {
  if (ceiling === null || held + more <= ceiling) return;
  const [what, flag] = limit === 'totalMemoryBytes' ? ['memory', '--max-total-memory'] : ['disk', '--max-total-disk'];
  throw new LimitError(
    'QUOTA_EXCEEDED',
    limit,
    `key ${key}'s sandboxes hold ${formatBytes(held)} of ${what}; ${formatBytes(more)} more is over its total of ${formatBytes(ceiling)}`,
    `remove a sandbox of this key, ask for less, or have an admin raise the key's ${flag}`,
  );
}
