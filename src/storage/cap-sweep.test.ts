/**
 * gc's sweep of a storage root's `.disks`: a seed directory a create was filling a cap's
 * filesystem from (mke2fs -d), left by a create killed meanwhile, is removed once no create can be
 * making it (a minute old); a young one is left to the create that may still be making it.
 */
import { existsSync, mkdirSync, mkdtempSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { sweepCaps } from './cap-fs.js';

let root: string;
afterEach(() => rmSync(root, { recursive: true, force: true }));

describe('sweepCaps', () => {
  it('removes a seed directory a killed create left, once it is a minute old, and only then', async () => {
    root = mkdtempSync(join(tmpdir(), 'snaplab-test-caps-'));
    const seed = (id: string, ageS: number): string => {
      const dir = join(root, '.disks', `${id}.img.seed`);
      mkdirSync(join(dir, 'upper'), { recursive: true });
      writeFileSync(join(dir, 'meta.json'), '{}');
      const t = Date.now() / 1000 - ageS;
      utimesSync(dir, t, t);
      return dir;
    };
    const old = seed('0123456789ab', 120);
    const young = seed('ba9876543210', 5);
    const removed = await sweepCaps(
      root,
      (id) => join(root, id),
      (fn) => fn(),
    );
    expect(removed).toEqual([`removed ${old}`]);
    expect([existsSync(old), existsSync(young)]).toEqual([false, true]);
  });
});
