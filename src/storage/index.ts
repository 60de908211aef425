import { SnaplabError } from '../errors.js';
import type { Availability } from '../host/probe-types.js';
import type { StorageBackend, StorageKind } from './backend.js';
import { BtrfsBackend } from './btrfs/btrfs-backend.js';
import { DirBackend } from './dir/dir-backend.js';
import { OverlayBackend } from './overlay/overlay-backend.js';

export type { StorageBackend, StorageKind, Usage, Volume } from './backend.js';
export { BtrfsBackend } from './btrfs/btrfs-backend.js';
export { unmountPool } from './btrfs/pool.js';
export { DirBackend } from './dir/dir-backend.js';
export { OverlayBackend } from './overlay/overlay-backend.js';

/** Best first: constant-time clones, then copy-on-write on any fs, then full copies. */
export const KIND_PREFERENCE: readonly StorageKind[] = ['btrfs', 'overlay', 'dir'];

export function createBackend(kind: StorageKind, home: string): StorageBackend {
  switch (kind) {
    case 'btrfs':
      return new BtrfsBackend(home);
    case 'overlay':
      return new OverlayBackend(home);
    case 'dir':
      return new DirBackend(home);
    default:
      throw new SnaplabError(
        'BAD_INPUT',
        `unknown storage kind ${String(kind)}`,
        `use one of ${KIND_PREFERENCE.join(', ')}`,
      );
  }
}

export function allBackends(home: string): StorageBackend[] {
  return KIND_PREFERENCE.map((k) => createBackend(k, home));
}

export interface DefaultChoice {
  kind: StorageKind;
  /** why this kind: its probe's reason, and why each better kind was passed over */
  reason: string;
  /** every probe's answer, best kind first */
  probes: Partial<Record<StorageKind, Availability>>;
}

/** The best kind whose probe is ok on this host (dir always is, unless cp is missing). */
export async function pickDefault(home: string): Promise<DefaultChoice> {
  const probes: Partial<Record<StorageKind, Availability>> = {};
  const skipped: string[] = [];
  for (const b of allBackends(home)) {
    const a = await b.probe();
    probes[b.kind] = a;
    if (a.ok) {
      const why = skipped.length > 0 ? ` (not ${skipped.join('; not ')})` : '';
      return { kind: b.kind, reason: `${b.kind}: ${a.reason}${why}`, probes };
    }
    skipped.push(`${b.kind}: ${a.reason}${a.fix ? ` → ${a.fix}` : ''}`);
  }
  throw new SnaplabError(
    'STORAGE_UNAVAILABLE',
    `no storage backend works here: ${skipped.join('; ')}`,
    probes.dir?.fix ?? 'apt-get install coreutils',
  );
}
