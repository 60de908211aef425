import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { allBackends, createBackend, pickDefault } from './index.js';
import { readMounts } from './mounts.js';

describe('storage index', () => {
  let home: string;
  beforeAll(async () => {
    home = await mkdtemp(join(tmpdir(), 'snaplab-test-index-'));
  });
  afterAll(async () => {
    await rm(home, { recursive: true, force: true });
    expect((await readMounts()).some((m) => m.target.startsWith(home))).toBe(false);
  });

  it('lists the backends best first and creates each kind', () => {
    expect(allBackends(home).map((b) => b.kind)).toEqual(['btrfs', 'overlay', 'dir']);
    expect(createBackend('overlay', home).kind).toBe('overlay');
    expect(() => createBackend('zfs' as never, home)).toThrow(/unknown storage kind/);
  });

  it('picks the best kind whose probe is ok, with the reason, and probes leave nothing behind', async () => {
    const choice = await pickDefault(home);
    // on the development hosts btrfs-progs are installed and the kernel has btrfs
    expect(choice.kind).toBe('btrfs');
    expect(choice.reason).toMatch(/^btrfs: /);
    for (const b of allBackends(home)) {
      const a = await b.probe();
      expect(a.ok, `${b.kind}: ${a.reason}`).toBe(true);
      expect(a.reason.length).toBeGreaterThan(0);
    }
    expect((await readMounts()).some((m) => m.target.startsWith(home))).toBe(false);
  });
});
