import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { mountFs } from '../mounts.js';
import { unmountAll } from '../../storage/mounts.js';
import { probeUserns } from './probe.js';

describe('the user namespace probe', () => {
  it('says yes where a directory can be idmapped, and no, with the fix, where it cannot (an overlay mount)', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'snaplab-test-userns-'));
    try {
      expect(await probeUserns(dir)).toMatchObject({ ok: true });
      for (const d of ['l', 'u', 'w', 'm']) await mkdir(join(dir, d));
      await mountFs('overlay', join(dir, 'm'), 'overlay', `lowerdir=${dir}/l,upperdir=${dir}/u,workdir=${dir}/w`);
      expect(await probeUserns(join(dir, 'm'))).toMatchObject({
        ok: false,
        reason: expect.stringMatching(/does not support idmapped mounts/),
        fix: expect.any(String),
      });
      expect(await probeUserns(join(dir, 'nope'))).toMatchObject({ ok: false });
    } finally {
      await unmountAll(dir);
      await rm(dir, { recursive: true, force: true });
    }
  });
});
