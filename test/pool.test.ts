import { spawn, spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Lab } from '../src/sdk/lab.js';
import type { PoolSpec } from '../src/lab/pools/admin.js';
import { disposeLab, testLab } from './helpers.js';
import { cgroupFor, freeze, isFrozen, stats } from '../src/host/cgroups/cgroups.js';

let lab: Lab;
beforeAll(async () => {
  lab = await testLab();
});
afterAll(async () => {
  try {
    for (const p of (await lab?.pools()) ?? []) await lab.pool(p.name).remove();
  } finally {
    await disposeLab(lab);
  }
});

const until = async (check: () => Promise<boolean>, ms = 20_000): Promise<void> => {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error('condition not reached in time');
    await new Promise((r) => setTimeout(r, 50));
  }
};

describe.each(['btrfs', 'overlay'] as const)('pools on %s', (storage) => {
  it('hands out usable standbys, recycles clean ones, refuses and counts dirty ones', async () => {
    const pool = await lab.createPool({ name: `p-${storage}`, image: 'busybox', size: 2, limits: {}, storage });
    expect((await pool.stats()).ready).toBe(2);

    const clean = await pool.run(['echo', 'hi']);
    expect(clean).toMatchObject({ exitCode: 0, hit: true, recycled: true, dirt: [] });
    expect(clean.stdout.toString()).toBe('hi\n');
    // a file put under /run (in memory) is taken out again: the sandbox stays recyclable
    const put = await pool.run(['sh', '/run/job.sh'], {
      put: [{ from: Buffer.from('echo from job\n'), to: '/run/job.sh' }],
    });
    expect(put).toMatchObject({ exitCode: 0, recycled: true, dirt: [] });
    expect(put.stdout.toString()).toBe('from job\n');
    // a standby waits unfrozen (the clean check showed nothing but its agent runs) and idle:
    // its cgroup's CPU time barely moves while it waits (a few µs of wake-ups were seen; a busy
    // process would take ~500 000 µs in the half second)
    const standby = (await lab.list()).find((x) => x.info.pool === `p-${storage}` && x.state === 'paused');
    expect(standby).toBeDefined();
    if (!standby) return;
    expect(await isFrozen(cgroupFor(standby.id))).toBe(false);
    const cpu0 = (await stats(cgroupFor(standby.id))).cpuUsec;
    await new Promise((r) => setTimeout(r, 500));
    expect((await stats(cgroupFor(standby.id))).cpuUsec! - cpu0!).toBeLessThan(2000);
    // one frozen by an earlier snaplab (which froze them all) is thawed when taken
    await freeze(cgroupFor(standby.id));
    const fromFrozen = await pool.run(['echo', 'thawed']);
    expect([fromFrozen.hit, fromFrozen.stdout.toString()]).toEqual([true, 'thawed\n']);

    const dirty = [
      { argv: ['sh', '-c', 'echo x > /root/left-behind'], reason: /root filesystem changed/ },
      { argv: ['sh', '-c', 'sleep 60 > /dev/null 2>&1 &'], reason: /processes: 1 left/ },
      { argv: ['sh', '-c', 'echo x > /dev/shm/left'], reason: /dev\/shm changed/ },
      { argv: ['sh', '-c', 'echo x > /run/left'], reason: /run changed/ },
      { argv: ['sh', '-c', 'chmod 0777 /'], reason: /root filesystem changed/ },
      { argv: ['sh', '-c', 'chmod 0777 /run'], reason: /run changed/ },
    ];
    for (const d of dirty) {
      const r = await pool.run(d.argv);
      expect(r.exitCode).toBe(0);
      expect(r.recycled).toBe(false);
      expect(r.dirt.join('; ')).toMatch(d.reason);
    }
    const s = await pool.stats();
    expect(s.refusedDirty).toBe(dirty.length);
    expect(s.recycled).toBe(3); // echo hi, the put job, the once-frozen standby's echo
    // nothing a dirty run left is ever seen by a later one
    const next = await pool.run(['sh', '-c', 'ls /root /dev/shm /run; ps -o comm | grep -c sleep || true']);
    expect(next.stdout.toString()).not.toMatch(/left/);
    expect(next.stdout.toString().trim().split('\n').pop()).toBe('0');
    await pool.remove();
  });
});

describe('pool refill', () => {
  it('keeps its target size under churn, and files go in with put', async () => {
    const pool = await lab.createPool({ name: 'churn', image: 'busybox', size: 3, limits: {} });
    pool.start();
    for (let i = 0; i < 8; i++) {
      const r = await pool.run(['sh', '-c', 'cat /root/in; echo dirty > /root/out'], {
        put: [{ from: Buffer.from(`job ${i}\n`), to: '/root/in' }],
      });
      expect(r.stdout.toString()).toBe(`job ${i}\n`);
      expect(r.recycled).toBe(false);
    }
    await until(async () => (await pool.stats()).ready === 3);
    const s = await pool.stats();
    expect(s.target).toBe(3);
    expect(s.hits + s.misses).toBe(8);
    await pool.stop();
    await pool.resize(1);
    expect((await pool.stats()).ready).toBe(1);
    await pool.remove();
  });

  it("a standby ran its image's shell (its clone's page cache is warm); a plain create's is cold", async () => {
    // a btrfs clone's files are inodes of their own: none of the image's page cache comes with it
    // (overlay shares its lower layer's, so only btrfs shows the difference)
    const resident = (root: string): number => {
      const r = spawnSync('fincore', ['--bytes', '--noheadings', '--output', 'RES', join(root, 'bin/busybox')], {
        encoding: 'utf8',
      });
      if (r.error) throw r.error;
      if (r.status !== 0) throw new Error(`fincore: ${r.stderr}`);
      return Number(r.stdout.trim());
    };
    const plain = await lab.create({ image: 'busybox', storage: 'btrfs', limits: {} });
    try {
      expect(resident(plain.info.volume!.path)).toBe(0);
    } finally {
      await plain.destroy();
    }
    const pool = await lab.createPool({ name: 'warm-shell', image: 'busybox', size: 1, limits: {}, storage: 'btrfs' });
    try {
      const standby = (await lab.list({ check: false })).find((b) => b.info.pool === pool.name);
      expect(standby).toBeDefined();
      expect(resident(standby!.info.volume!.path)).toBeGreaterThan(0);
      // and it left nothing a take would find: the clean check passes on a run that leaves nothing
      expect(await pool.run(['true'])).toMatchObject({ exitCode: 0, hit: true, recycled: true, dirt: [] });
    } finally {
      await pool.remove();
    }
  });

  it('a warm pool is refused what it cannot keep, and one whose standbys cannot warm is not left behind', async () => {
    const refused = async (spec: Partial<PoolSpec>, code: string, message: RegExp): Promise<void> => {
      const e = await lab.createPool({ name: 'warm', image: 'busybox', size: 2, limits: {}, ...spec }).then(
        () => undefined,
        (x: unknown) => x,
      );
      expect(e).toMatchObject({ code });
      expect((e as Error).message).toMatch(message);
      expect((await lab.pools()).map((p) => p.name)).not.toContain('warm');
    };
    await refused({ warm: 'kernel' as 'interpreter' }, 'BAD_INPUT', /cannot warm "kernel"/);
    await refused({ warm: 'interpreter', recycle: true }, 'BAD_INPUT', /not recycled/);
    // busybox has no python3: the fill fails (both raises of its batch settled first), and the pool and its standbys go
    await refused({ warm: 'interpreter' }, 'AGENT_ERROR', /no python3 in this image/);
    expect((await lab.list()).filter((b) => b.info.pool === 'warm')).toEqual([]);
  });

  it('its stats reap a standby that died: counted a leak, not ready nor dead, its record gone', async () => {
    const pool = await lab.createPool({ name: 'reap', image: 'busybox', size: 2, limits: {} });
    expect((await pool.stats()).ready).toBe(2);
    const victim = (await lab.list({ check: false })).find((b) => b.info.pool === pool.name)!;
    process.kill(victim.info.pid!, 'SIGKILL');
    await until(async () => (await pool.stats()).leaks === 1);
    const s = await pool.stats();
    expect(s).toMatchObject({ ready: 1, dead: 0, inUse: 0, raising: 0, leaks: 1 });
    expect((await lab.list({ check: false })).some((b) => b.id === victim.id)).toBe(false);
    await pool.remove();
  });

  it('a holder killed mid-refill leaves nothing gc cannot remove', async () => {
    await lab.createPool({ name: 'crash', image: 'busybox', size: 0, limits: {} });
    const script = `
      import { Lab } from ${JSON.stringify(join(import.meta.dirname, '..', 'dist', 'sdk', 'index.js'))};
      const lab = await Lab.open({ home: process.env.SNAPLAB_HOME });
      const pool = lab.pool('crash');
      await pool.resize(12);
    `;
    // the built library (npm test builds first), in a process of its own that we can kill
    const child = spawn(process.execPath, ['--input-type=module', '-e', script], {
      env: { ...process.env, SNAPLAB_HOME: lab.home },
      stdio: 'ignore',
    });
    await until(async () => (await lab.pools())[0]!.ready >= 2, 30_000);
    child.kill('SIGKILL');
    await new Promise((r) => child.once('exit', r));
    await lab.gc();
    const s = (await lab.pools()).find((p) => p.name === 'crash')!;
    expect(s.raising).toBe(0); // interrupted raises were reconciled and removed
    await lab.pool('crash').remove();
    await lab.gc();
    expect(
      (await lab.list()).filter((b) => b.info.pool === 'crash').map((b) => `${b.state}: ${b.info.reason}`),
    ).toEqual([]);
  });
});
