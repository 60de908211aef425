import { readFile, rename, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SnaplabError } from '../errors.js';
import type { StorageKind, Volume } from './backend.js';
import { isVolumeId } from './tree.js';
import { orElse } from '../cleanup.js';

/**
 * Each dir/overlay volume directory holds meta.json beside the tree: what the volume is, so that
 * init() (after a reboot) and gc() (after a crash) can act on it without the caller's records.
 */
export async function writeMeta(volDir: string, meta: object): Promise<void> {
  const tmp = join(volDir, 'meta.json.tmp');
  await writeFile(tmp, JSON.stringify(meta));
  await rename(tmp, join(volDir, 'meta.json'));
}

export async function readMeta<T>(volDir: string): Promise<T | undefined> {
  const text = await readFile(join(volDir, 'meta.json'), 'utf8').catch(
    orElse(undefined, `read ${volDir}/meta.json`, 'ENOENT', 'ENOTDIR'),
  );
  if (text === undefined) return undefined;
  try {
    return JSON.parse(text) as T;
  } catch {
    return undefined;
  }
}

/** A volume handed back by a caller must be ours and have an id we made: we rm -rf paths from it. */
export function checkVolume(v: Volume, kind: StorageKind): void {
  if (v.kind !== kind || !isVolumeId(v.id)) {
    throw new SnaplabError(
      'BAD_INPUT',
      `volume ${JSON.stringify(v.id)} of kind ${v.kind} is not a ${kind} volume`,
      'pass the Volume record this backend returned, unchanged',
    );
  }
}
