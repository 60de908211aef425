/**
 * Disk caps (--disk): on btrfs, simple quotas charge each machine's writes to it; a write past the
 * cap fails inside with EDQUOT while the machine, the others and the pool go on. Where the storage
 * cannot cap (overlay, dir) an explicit --disk is refused and nothing is left.
 */
import { spawnSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Lab } from '../src/sdk/lab.js';
import { disposeLab, testLab } from './helpers.js';
import { cli } from './daemon-helpers.js';

let lab: Lab;
const MiB = 1024 ** 2;

beforeAll(async () => {
  lab = await testLab();
});

afterAll(async () => {
  await disposeLab(lab);
});

const qgroups = (): string => spawnSync('btrfs', ['qgroup', 'show', '--raw', `${lab.home}/btrfs`], { encoding: 'utf8' }).stdout;

describe('disk caps', () => {
  it('btrfs: a write past --disk fails inside with EDQUOT; the machine runs on, another writes freely, df shows use against the cap', async () => {
    const small = await lab.create({ name: 'small', storage: 'btrfs', limits: { diskBytes: 64 * MiB } });
    const other = await lab.create({ name: 'other', storage: 'btrfs' });
    expect(small.info.limits.diskBytes).toBe(64 * MiB);
    expect(other.info.limits.diskBytes).toBe(4 * 1024 ** 3); // the default where it holds

    const r = await small.exec(['sh', '-c', 'dd if=/dev/zero of=/root/big bs=1M count=100 conv=fsync']);
    expect(r.exitCode).not.toBe(0);
    expect(r.stderr).toMatch(/Disk quota exceeded/);
    expect((await small.exec(['sh', '-c', 'echo x > /root/more'])).stderr).toMatch(/Disk quota exceeded/);
    // still running and usable: reading, and writing once space is freed
    expect((await small.exec(['echo', 'alive'])).stdout).toBe('alive\n');
    expect((await small.exec(['sh', '-c', 'rm /root/big && sync && echo freed > /root/more && cat /root/more'])).stdout).toBe('freed\n');
    // the other machine is not held by the first one's cap
    expect((await other.exec(['sh', '-c', 'dd if=/dev/zero of=/root/f bs=1M count=80 conv=fsync 2>/dev/null && echo ok'])).stdout).toBe('ok\n');

    await small.exec(['sh', '-c', 'dd if=/dev/zero of=/root/half bs=1M count=32 conv=fsync 2>/dev/null']);
    const df = JSON.parse(cli(lab.home, ['df', '--json']).out) as { items: { name: string; writtenBytes?: number; diskBytes?: number }[] };
    const row = df.items.find((i) => i.name === 'small')!;
    expect(row.diskBytes).toBe(64 * MiB);
    expect(row.writtenBytes).toBeGreaterThan(32 * MiB);
    expect(row.writtenBytes).toBeLessThan(40 * MiB);
    await small.destroy();
    await other.destroy();
  });

  it('a restore keeps the cap of its snapshot and counts only what it writes itself', async () => {
    const a = await lab.create({ name: 'src', storage: 'btrfs', limits: { diskBytes: 48 * MiB } });
    await a.exec(['sh', '-c', 'dd if=/dev/zero of=/root/d bs=1M count=40 conv=fsync 2>/dev/null']);
    await a.snapshot('capped');
    const b = await lab.restore('capped', { name: 'copy' });
    expect(b.info.limits.diskBytes).toBe(48 * MiB);
    // 40 MiB came with the snapshot: the copy may still write 40 more of its own, not 100
    expect((await b.exec(['sh', '-c', 'dd if=/dev/zero of=/root/e bs=1M count=40 conv=fsync 2>/dev/null && echo ok'])).stdout).toBe('ok\n');
    expect((await b.exec(['sh', '-c', 'dd if=/dev/zero of=/root/f bs=1M count=20 conv=fsync'])).stderr).toMatch(/Disk quota exceeded/);
    await a.destroy();
    await b.destroy();
    await lab.removeSnapshot('capped');
    // what the deleted volumes' qgroups held goes with them; gc removes the empty ones the kernel kept
    // (a commit now, so the cleaner drops the deleted subvolumes' extents without the 30 s wait)
    const t0 = Date.now();
    while (/<stale>\s*$/m.test(qgroups()) && Date.now() - t0 < 60_000) {
      spawnSync('btrfs', ['filesystem', 'sync', `${lab.home}/btrfs`]);
      await lab.gc();
      await new Promise((r) => setTimeout(r, 200));
    }
    expect(qgroups()).not.toMatch(/<stale>/);
  });

  it('--disk 0 is no cap; where the storage cannot cap, --disk is refused with a hint and leaves nothing, and no default is recorded', async () => {
    const free = await lab.create({ name: 'free', storage: 'btrfs', limits: { diskBytes: 0 } });
    expect(free.info.limits.diskBytes).toBe(0);
    await free.destroy();
    for (const storage of ['overlay', 'dir'] as const) {
      await expect(lab.create({ name: `capped-${storage}`, storage, limits: { diskBytes: 64 * MiB } })).rejects.toMatchObject({ code: 'BAD_INPUT', message: expect.stringMatching(/cannot be enforced/), hint: expect.stringMatching(/btrfs/) });
      const plain = await lab.create({ name: `plain-${storage}`, storage });
      expect(plain.info.limits.diskBytes).toBeUndefined();
      await plain.destroy();
    }
    // a VM's disk is an image file: an explicit cap is refused before it boots, none is recorded by default
    await expect(lab.create({ name: 'vm-capped', driver: 'qemu', limits: { diskBytes: 64 * MiB } })).rejects.toMatchObject({ code: 'BAD_INPUT', message: expect.stringMatching(/qemu driver/) });
    expect((await lab.list()).map((b) => b.name)).toEqual([]);
    const r = cli(lab.home, ['create', '--name', 'x', '--storage', 'overlay', '--disk', '64M']);
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/error\[BAD_INPUT\]: --disk cannot be enforced here/);
    expect(cli(lab.home, ['create', '--name', 'y', '--disk', 'lots']).err).toMatch(/error\[BAD_SIZE\]|error\[BAD_INPUT\]/);
  });
});
