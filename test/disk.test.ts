/**
 * Disk caps (--disk): on btrfs, simple quotas charge each machine's writes to it; a write past the
 * cap fails inside with EDQUOT while the machine, the others and the pool go on. On overlay the
 * machine's upper dir is on an ext4 loop file of the cap's size (ENOSPC past it), made only when
 * asked. Where the storage cannot cap (dir) an explicit --disk is refused and nothing is left.
 */
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { SNAPLAB } from './cli-command.js';
import Database from 'better-sqlite3';
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

const qgroups = (): string =>
  spawnSync('btrfs', ['qgroup', 'show', '--raw', `${lab.home}/btrfs`], { encoding: 'utf8' }).stdout;

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
    expect(
      (await small.exec(['sh', '-c', 'rm /root/big && sync && echo freed > /root/more && cat /root/more'])).stdout,
    ).toBe('freed\n');
    // the other machine is not held by the first one's cap
    expect(
      (await other.exec(['sh', '-c', 'dd if=/dev/zero of=/root/f bs=1M count=80 conv=fsync 2>/dev/null && echo ok']))
        .stdout,
    ).toBe('ok\n');

    await small.exec(['sh', '-c', 'dd if=/dev/zero of=/root/half bs=1M count=32 conv=fsync 2>/dev/null']);
    const df = JSON.parse(cli(lab.home, ['df', '--json']).out) as {
      items: { name: string; writtenBytes?: number; diskBytes?: number }[];
    };
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
    expect(
      (await b.exec(['sh', '-c', 'dd if=/dev/zero of=/root/e bs=1M count=40 conv=fsync 2>/dev/null && echo ok']))
        .stdout,
    ).toBe('ok\n');
    expect((await b.exec(['sh', '-c', 'dd if=/dev/zero of=/root/f bs=1M count=20 conv=fsync'])).stderr).toMatch(
      /Disk quota exceeded/,
    );
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
    // a sweep that found none marks the pool clean: the next gc asks no `qgroup show` (it reads
    // every subvolume) until a delete takes the mark away first
    await lab.gc();
    const clean = join(lab.home, 'btrfs', '.qgroups-clean');
    expect(existsSync(clean)).toBe(true);
    await (await lab.create({ name: 'again', storage: 'btrfs' })).destroy();
    expect(existsSync(clean)).toBe(false);
  });

  it('--disk 0 is no cap; where it cannot hold (a VM), --disk is refused with a hint and leaves nothing; overlay and dir record no default', async () => {
    const free = await lab.create({ name: 'free', storage: 'btrfs', limits: { diskBytes: 0 } });
    expect(free.info.limits.diskBytes).toBe(0);
    await free.destroy();
    for (const storage of ['overlay', 'dir'] as const) {
      // a cap there is a filesystem per machine: none by default
      const plain = await lab.create({ name: `plain-${storage}`, storage });
      expect(plain.info.limits.diskBytes).toBeUndefined();
      await plain.destroy();
    }
    // a VM's disk is an image file: an explicit cap is refused before it boots, none is recorded by default
    await expect(
      lab.create({ name: 'vm-capped', driver: 'qemu', limits: { diskBytes: 64 * MiB } }),
    ).rejects.toMatchObject({ code: 'BAD_INPUT', message: expect.stringMatching(/qemu driver/) });
    expect((await lab.list()).map((b) => b.name)).toEqual([]);
    const r = cli(lab.home, ['create', '--name', 'x', '--driver', 'qemu', '--disk', '64M']);
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/error\[BAD_INPUT\]: --disk cannot be enforced here: the qemu driver/);
    expect(cli(lab.home, ['create', '--name', 'y', '--disk', 'lots']).err).toMatch(
      /error\[BAD_SIZE\]|error\[BAD_INPUT\]/,
    );
  });

  it('overlay: --disk is an ext4 loop file of its own; ENOSPC past it, the machine runs on, a restore keeps it, rm leaves nothing, no default cap', async () => {
    const small = await lab.create({ name: 'ov-small', storage: 'overlay', limits: { diskBytes: 64 * MiB } });
    const other = await lab.create({ name: 'ov-other', storage: 'overlay' });
    expect(small.info.limits.diskBytes).toBe(64 * MiB);
    expect(other.info.limits.diskBytes).toBeUndefined(); // a cap costs a filesystem: only when asked
    const disks = join(lab.home, 'storage', 'overlay', '.disks');
    const vol =
      (small.info as unknown as { volume: { id: string } }).volume?.id ?? readdirSync(disks)[0]!.replace('.img', '');
    expect(readdirSync(disks)).toEqual([`${vol}.img`]);

    const r = await small.exec(['sh', '-c', 'dd if=/dev/zero of=/root/big bs=1M count=100 conv=fsync']);
    expect(r.exitCode).not.toBe(0);
    expect(r.stderr).toMatch(/No space left on device/);
    const written = Number((await small.exec(['sh', '-c', 'wc -c < /root/big'])).stdout.trim());
    expect(written).toBeGreaterThan(58 * MiB); // the filesystem's own metadata takes ~6 % of a cap this small
    expect(written).toBeLessThanOrEqual(64 * MiB);
    expect((await small.exec(['echo', 'alive'])).stdout).toBe('alive\n');
    expect((await small.exec(['sh', '-c', 'rm /root/big && echo freed > /root/more && cat /root/more'])).stdout).toBe(
      'freed\n',
    );
    expect(
      (await other.exec(['sh', '-c', 'dd if=/dev/zero of=/root/f bs=1M count=80 conv=fsync 2>/dev/null && echo ok']))
        .stdout,
    ).toBe('ok\n');

    await small.exec(['sh', '-c', 'dd if=/dev/zero of=/root/half bs=1M count=32 conv=fsync 2>/dev/null']);
    const df = JSON.parse(cli(lab.home, ['df', '--json']).out) as {
      items: { name: string; writtenBytes?: number; diskBytes?: number }[];
    };
    const row = df.items.find((i) => i.name === 'ov-small')!;
    expect(row.diskBytes).toBe(64 * MiB);
    expect(row.writtenBytes).toBeGreaterThan(32 * MiB);
    expect(row.writtenBytes).toBeLessThan(40 * MiB);

    // a restore keeps the cap and counts only what it writes itself (32 MiB came with the snapshot)
    await small.snapshot('ov-capped');
    const copy = await lab.restore('ov-capped', { name: 'ov-copy' });
    expect(copy.info.limits.diskBytes).toBe(64 * MiB);
    expect(
      (await copy.exec(['sh', '-c', 'dd if=/dev/zero of=/root/e bs=1M count=48 conv=fsync 2>/dev/null && echo ok']))
        .stdout,
    ).toBe('ok\n');
    expect((await copy.exec(['sh', '-c', 'dd if=/dev/zero of=/root/f bs=1M count=30 conv=fsync'])).stderr).toMatch(
      /No space left on device/,
    );
    expect((await copy.exec(['sh', '-c', 'wc -c < /root/half'])).stdout.trim()).toBe(String(32 * MiB));
    // another limit given does not drop the carried cap (review: it did)
    const copy2 = await lab.restore('ov-capped', { name: 'ov-copy2', limits: { memoryBytes: 256 * MiB } });
    expect(copy2.info.limits).toMatchObject({ diskBytes: 64 * MiB, memoryBytes: 256 * MiB });
    await copy2.destroy();

    for (const b of [small, other, copy]) await b.destroy();
    await lab.removeSnapshot('ov-capped');
    expect(readdirSync(disks)).toEqual([]);
    expect(readFileSync('/proc/mounts', 'utf8')).not.toContain(`${lab.home}/storage/overlay/${vol}`);
    expect(loopsUnder(lab.home).filter((l) => l.includes('.disks'))).toEqual([]);
  });

  it("dir: --disk is an ext4 loop file holding the machine's copy of its image; ENOSPC past the cap, a restore keeps it, rm and gc leave nothing", async () => {
    const box = await lab.create({ name: 'dir-small', storage: 'dir', limits: { diskBytes: 48 * MiB } });
    expect(box.info.limits.diskBytes).toBe(48 * MiB);
    const disks = join(lab.home, 'storage', 'dir', '.disks');
    expect(readdirSync(disks)).toEqual([`${box.info.volume!.id}.img`]);
    // the image's files came along as an uncapped copy has them: names, modes, owners, links
    const listing = 'ls -lnR /bin /etc /root /usr 2>&1 | md5sum';
    const plain = await lab.create({ name: 'dir-plain', storage: 'dir' });
    expect((await box.exec(['sh', '-c', listing])).stdout.toString()).toBe(
      (await plain.exec(['sh', '-c', listing])).stdout.toString(),
    );
    await plain.destroy();
    const r = await box.exec(['sh', '-c', 'dd if=/dev/zero of=/root/big bs=1M count=100 conv=fsync']);
    expect(r.stderr.toString()).toMatch(/No space left on device/);
    const written = Number((await box.exec(['sh', '-c', 'wc -c < /root/big'])).stdout.toString().trim());
    expect(written).toBeGreaterThan(44 * MiB); // the cap is about what it writes beyond its image
    expect(written).toBeLessThan(60 * MiB);
    expect((await box.exec(['echo', 'alive'])).stdout.toString()).toBe('alive\n');
    await box.exec(['sh', '-c', 'rm /root/big && dd if=/dev/zero of=/root/half bs=1M count=20 conv=fsync 2>/dev/null']);
    const df = JSON.parse(cli(lab.home, ['df', '--json']).out) as {
      items: { name: string; writtenBytes?: number; diskBytes?: number }[];
    };
    const row = df.items.find((i) => i.name === 'dir-small')!;
    expect(row.diskBytes).toBe(48 * MiB);
    expect(row.writtenBytes).toBeGreaterThan(19 * MiB);
    expect(row.writtenBytes).toBeLessThan(26 * MiB);
    await box.snapshot('dir-capped');
    const copy = await lab.restore('dir-capped', { name: 'dir-copy' });
    expect(copy.info.limits.diskBytes).toBe(48 * MiB);
    expect(
      (
        await copy.exec([
          'sh',
          '-c',
          'wc -c < /root/half; dd if=/dev/zero of=/root/more bs=1M count=100 2>&1 | grep -o "No space left"',
        ])
      ).stdout.toString(),
    ).toBe(`${20 * MiB}\nNo space left\n`);
    await copy.destroy();
    await box.destroy();
    await lab.removeSnapshot('dir-capped');
    // one whose record is lost (a crash): gc finds its cap by its volume
    const lost = await lab.create({ name: 'dir-lost', storage: 'dir', limits: { diskBytes: 16 * MiB } });
    lost.close();
    const db = new Database(join(lab.home, 'state.db'));
    db.prepare('DELETE FROM sandboxes WHERE name = ?').run('dir-lost');
    db.close();
    expect((await lab.gc()).removed.join('\n')).toMatch(/dir: .*\.disks/);
    expect(readdirSync(disks)).toEqual([]);
    expect(loopsUnder(lab.home).filter((l) => l.includes('.disks'))).toEqual([]);
    expect(readFileSync('/proc/mounts', 'utf8')).not.toMatch(new RegExp(`${lab.home}/storage/dir/[0-9a-f]+ ext4`));
  });

  it('overlay: caps made and removed while other processes ready the same storage (their init mounts what is missing) all hold', async () => {
    // review: another process's init() mounted a half-made cap (the create failed), an overlay that
    // the cap then covered (an empty root), or a cap being removed (rm failed)
    const script = `import('${join(import.meta.dirname, '..', 'dist', 'storage', 'overlay', 'overlay-backend.js')}').then(async ({ OverlayBackend }) => { for (;;) await new OverlayBackend(process.argv[1]).init().catch(() => undefined); })`;
    const loop = spawn(process.execPath, ['-e', script, lab.home], { stdio: 'ignore' });
    try {
      for (let i = 0; i < 4; i++) {
        const boxes = await Promise.all([
          lab.create({ name: `race-u${i}`, storage: 'overlay', limits: { diskBytes: 32 * MiB } }),
          lab.create({ name: `race-h${i}`, storage: 'overlay', userns: false, limits: { diskBytes: 32 * MiB } }),
        ]);
        for (const b of boxes) {
          expect(
            (
              await b.exec([
                'sh',
                '-c',
                'ls /bin/sh && dd if=/dev/zero of=/root/f bs=1M count=40 2>&1 | grep -o "No space left"',
              ])
            ).stdout,
          ).toBe('/bin/sh\nNo space left\n');
          await b.destroy();
        }
      }
    } finally {
      loop.kill('SIGKILL');
      await new Promise((r) => loop.once('exit', r));
    }
    expect(readdirSync(join(lab.home, 'storage', 'overlay', '.disks'))).toEqual([]);
    expect(loopsUnder(lab.home).filter((l) => l.includes('.disks'))).toEqual([]);
  });

  it('overlay: a cap not mounted is an error, not an empty upper dir; the next process checks it and mounts it again', async () => {
    const box = await lab.create({ name: 'ov-off', storage: 'overlay', limits: { diskBytes: 32 * MiB } });
    await box.exec(['sh', '-c', 'echo kept > /root/data']);
    await box.stop();
    const dir = join(lab.home, 'storage', 'overlay', box.info.volume!.id);
    expect(spawnSync('umount', [dir]).status).toBe(0); // as a reboot would leave it
    await expect(box.snapshot('ov-off-s')).rejects.toMatchObject({
      code: 'STORAGE_FAILED',
      message: expect.stringMatching(/not mounted/),
    });
    // another process readies overlay storage: e2fsck, then the mount
    expect(cli(lab.home, ['create', '--name', 'ov-on', '--storage', 'overlay']).code).toBe(0);
    await box.snapshot('ov-off-s');
    const back = await lab.restore('ov-off-s', { name: 'ov-back' });
    expect((await back.exec(['cat', '/root/data'])).stdout).toBe('kept\n');
    for (const n of ['ov-back', 'ov-on', 'ov-off']) await (await lab.get(n)).destroy();
    await lab.removeSnapshot('ov-off-s');
  });

  it('overlay: a create killed once its cap exists, its record lost too: gc removes the mount, the loop device and the file', async () => {
    const disks = join(lab.home, 'storage', 'overlay', '.disks');
    const child = spawn(SNAPLAB, ['create', '--name', 'ov-killed', '--storage', 'overlay', '--disk', '64M'], {
      env: { ...process.env, SNAPLAB_HOME: lab.home },
      stdio: 'ignore',
    });
    const t0 = Date.now();
    while (
      !(existsSync(disks) && readdirSync(disks).some((f) => f.endsWith('.img') && mountedCap(lab.home, f))) &&
      Date.now() - t0 < 30_000
    )
      await new Promise((r) => setTimeout(r, 5));
    child.kill('SIGKILL');
    await new Promise((r) => child.once('exit', r));
    expect(readdirSync(disks).length).toBeGreaterThan(0); // it had made its cap
    // the record goes too (a crash that lost it): nothing owns the volume, only gc can find it
    const db = new Database(join(lab.home, 'state.db'));
    db.prepare('DELETE FROM sandboxes WHERE name = ?').run('ov-killed');
    db.close();
    const { removed } = await lab.gc();
    expect(removed.join('\n')).toMatch(/\.disks/);
    expect(readdirSync(disks)).toEqual([]);
    expect(
      readFileSync('/proc/mounts', 'utf8')
        .split('\n')
        .filter((l) => l.includes(`${lab.home}/storage/overlay/`) && l.includes(' ext4 ')),
    ).toEqual([]);
    expect(loopsUnder(lab.home).filter((l) => l.includes('.disks'))).toEqual([]);
  });
});

/** Backing files of the loop devices that are under `home`. */
function loopsUnder(home: string): string[] {
  return readdirSync('/sys/block')
    .filter((d) => d.startsWith('loop'))
    .flatMap((d) => {
      try {
        const f = readFileSync(`/sys/block/${d}/loop/backing_file`, 'utf8').trim();
        return f.startsWith(home) ? [f] : [];
      } catch {
        return [];
      }
    });
}

/** Is the cap file `image` (a name in .disks) mounted over its volume's directory? */
function mountedCap(home: string, image: string): boolean {
  return readFileSync('/proc/mounts', 'utf8').includes(`${home}/storage/overlay/${image.replace('.img', '')} ext4`);
}
