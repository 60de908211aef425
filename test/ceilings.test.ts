/**
 * A key's ceilings at a real daemon (127.0.0.1, keys made by the CLI): a key cannot choose its
 * own limits (64 GiB of memory, millions of pids were accepted before), every sandbox it makes
 * has a disk cap on every storage type (an overlay sandbox wrote to the host's root filesystem
 * uncapped), and its sandboxes together stay under its totals.
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Lab } from '../src/sdk/lab.js';
import { cli, removeHome, startDaemon, type TestDaemon } from './daemon-helpers.js';

let home: string;
let d: TestDaemon;
const GiB = 1024 ** 3;
const MiB = 1024 ** 2;

// biome-ignore lint/suspicious/noExplicitAny: the daemon's answers, read by field in each expect
type Json = any;

async function call(
  token: string,
  method: string,
  path: string,
  json?: unknown,
): Promise<{ status: number; body: Json }> {
  const r = await fetch(`${d.url}${path}`, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(json ? { 'content-type': 'application/json' } : {}) },
    body: json ? JSON.stringify(json) : undefined,
  });
  const text = await r.text();
  return { status: r.status, body: text ? JSON.parse(text) : null };
}

const key = (name: string, ...flags: string[]): string => {
  const r = cli(home, ['key', 'create', name, '--scope', 'read,exec', ...flags]);
  expect(r.code, r.err).toBe(0);
  return r.out.trim();
};

beforeAll(async () => {
  home = mkdtempSync(join(tmpdir(), 'snaplab-test-ceilings-'));
  d = await startDaemon(home, ['--default-timeout', '0']);
}, 120_000);

afterAll(async () => {
  await d?.stop();
  removeHome(home);
});

describe("a key's ceilings", () => {
  it('refuse limits above them with 403, naming the limit; a key made without them has the defaults', async () => {
    const tenant = key('tenant');
    const big = await call(tenant, 'POST', '/sandboxes', { limits: { memoryBytes: 64 * GiB } });
    expect([big.status, big.body.code, big.body.limit]).toEqual([403, 'ABOVE_CEILING', 'memoryBytes']);
    expect(big.body.message).toBe("memory 64.0 GiB is above key tenant's ceiling of 4.0 GiB per sandbox");
    const pids = await call(tenant, 'POST', '/sandboxes', { limits: { pids: 4_000_000 } });
    expect([pids.status, pids.body.limit]).toEqual([403, 'pids']);
    const uncapped = await call(tenant, 'POST', '/sandboxes', { storage: 'overlay', limits: { diskBytes: 0 } });
    expect([uncapped.status, uncapped.body.limit]).toEqual([403, 'diskBytes']);
    expect((await call(tenant, 'GET', '/whoami')).body.ceilings).toMatchObject({ memoryBytes: 4 * GiB, pids: 4096 });
    // nothing was made
    expect((await call(tenant, 'GET', '/sandboxes')).body).toEqual([]);
  });

  it.each(['overlay', 'dir'])('cap the disk of every sandbox, on %s too', async (storage) => {
    const tenant = key(`disk-${storage}`, '--max-disk', '1G');
    const made = await call(tenant, 'POST', '/sandboxes', { storage });
    expect(made.status, JSON.stringify(made.body)).toBe(201);
    expect(made.body.limits.diskBytes).toBe(GiB);
    const df = await call(tenant, 'POST', `/sandboxes/${made.body.id}/exec`, { argv: ['df', '-k', '/'] });
    const total = Number(df.body.stdout.trim().split('\n')[1].split(/\s+/)[1]) * 1024;
    // the machine's root is its own filesystem of the cap's size, not the host's
    expect(total).toBeGreaterThan(0.8 * GiB);
    // (its filesystem's own metadata counted: dir's ext4 shows a little more than the cap)
    expect(total).toBeLessThanOrEqual(1.1 * GiB);
    expect((await call(tenant, 'DELETE', `/sandboxes/${made.body.id}`)).status).toBe(204);
  });

  it("hold a key's sandboxes under its totals (429), lowering what is not asked to the ceilings", async () => {
    const tenant = key('totals', '--max-memory', '256M', '--max-total-memory', '600M', '--max-disk', '64M');
    const a = await call(tenant, 'POST', '/sandboxes', {});
    const b = await call(tenant, 'POST', '/sandboxes', {});
    expect([a.status, b.status]).toEqual([201, 201]);
    expect([a.body.limits.memoryBytes, b.body.limits.memoryBytes]).toEqual([256 * MiB, 256 * MiB]);
    const c = await call(tenant, 'POST', '/sandboxes', {});
    expect([c.status, c.body.code, c.body.limit]).toEqual([429, 'QUOTA_EXCEEDED', 'totalMemoryBytes']);
    expect(c.body.message).toBe(
      "key totals's sandboxes hold 512.0 MiB of memory; 256.0 MiB more is over its total of 600.0 MiB",
    );
    // a smaller one fits
    const small = await call(tenant, 'POST', '/sandboxes', { limits: { memoryBytes: 64 * MiB } });
    expect(small.status).toBe(201);
    await call(tenant, 'DELETE', `/sandboxes/${a.body.id}`);
    expect((await call(tenant, 'POST', '/sandboxes', {})).status).toBe(201);
  });

  it('count a stopped machine: it keeps its room, so stop, create, start cannot pass the totals', async () => {
    const tenant = key('stopper', '--max-memory', '256M', '--max-total-memory', '600M', '--max-disk', '64M');
    const a = await call(tenant, 'POST', '/sandboxes', {});
    const b = await call(tenant, 'POST', '/sandboxes', {});
    expect([a.status, b.status]).toEqual([201, 201]);
    expect((await call(tenant, 'POST', `/sandboxes/${a.body.id}/stop`)).status).toBe(200);
    const c = await call(tenant, 'POST', '/sandboxes', {});
    expect([c.status, c.body.code, c.body.limit]).toEqual([429, 'QUOTA_EXCEEDED', 'totalMemoryBytes']);
    expect((await call(tenant, 'POST', `/sandboxes/${a.body.id}/start`)).status).toBe(200);
    for (const x of [a, b]) await call(tenant, 'DELETE', `/sandboxes/${x.body.id}`);
  });

  it('hold a restore and a standby take too: a pool with more than a key may ask is not for that key', async () => {
    const tenant = key('restorer', '--max-memory', '512M');
    const made = await call(tenant, 'POST', '/sandboxes', { limits: { memoryBytes: 128 * MiB } });
    expect(made.status).toBe(201);
    expect((await call(tenant, 'POST', `/sandboxes/${made.body.id}/snapshots`, { name: 'c-snap' })).status).toBe(201);
    const big = await call(tenant, 'POST', '/sandboxes', { snapshot: 'c-snap', limits: { memoryBytes: GiB } });
    expect([big.status, big.body.limit]).toEqual([403, 'memoryBytes']);
    const ok = await call(tenant, 'POST', '/sandboxes', { snapshot: 'c-snap' });
    expect([ok.status, ok.body.limits.memoryBytes]).toEqual([201, 512 * MiB]);
    // the Unix socket is root: it defines a pool of 1 GiB standbys
    expect(cli(home, ['pool', 'create', 'c-big', '--size', '1', '--memory', '1G', '--disk', '256M']).code).toBe(0);
    const take = await call(tenant, 'POST', '/sandboxes', { pool: 'c-big' });
    expect([take.status, take.body.limit]).toEqual([403, 'memoryBytes']);
    expect(cli(home, ['pool', 'rm', 'c-big']).code).toBe(0);
    cli(home, ['snapshot', 'rm', 'c-snap']);
  });

  // a take is checked against what its standby holds; with none ready (the last one taken, the
  // refill still being made), against what the miss will be raised with: the storage's default
  // cap here. That was the pool's own limits (no cap), and every take right after another was refused
  it('hold a pool drained by takes one after another as its standbys: the default cap, not a refusal', async () => {
    const tenant = key('drainer', '--max-disk', '8G', '--max-total-disk', 'none');
    expect(cli(home, ['pool', 'create', 'c-drain', '--size', '1']).code).toBe(0);
    const taken: Json[] = [];
    try {
      for (let i = 0; i < 3; i++) {
        const t = await call(tenant, 'POST', '/sandboxes', { pool: 'c-drain' });
        expect([t.status, t.body.limits?.diskBytes], JSON.stringify(t.body)).toEqual([201, 4 * GiB]);
        taken.push(t.body);
      }
    } finally {
      for (const t of taken) await call(tenant, 'DELETE', `/sandboxes/${t.id}`);
      expect(cli(home, ['pool', 'rm', 'c-drain']).code).toBe(0);
    }
  });

  it("count a key's snapshots", async () => {
    const tenant = key('snapper', '--max-snapshots', '2');
    const box = await call(tenant, 'POST', '/sandboxes', {});
    for (const n of [1, 2])
      expect((await call(tenant, 'POST', `/sandboxes/${box.body.id}/snapshots`, { name: `s${n}` })).status).toBe(201);
    const third = await call(tenant, 'POST', `/sandboxes/${box.body.id}/snapshots`, { name: 's3' });
    expect([third.status, third.body.code, third.body.limit]).toEqual([429, 'QUOTA_EXCEEDED', 'snapshots']);
    expect(third.body.message).toBe('key snapper has 2 of its 2 snapshots');
    expect((await call(tenant, 'DELETE', '/snapshots/s1')).status).toBe(204);
    expect((await call(tenant, 'POST', `/sandboxes/${box.body.id}/snapshots`, { name: 's3' })).status).toBe(201);
    for (const n of ['s2', 's3']) cli(home, ['snapshot', 'rm', n]);
  });

  it('hold what comes made: a standby without a disk cap, a pool run, a carried cap, a pool without a user namespace', async () => {
    const tenant = key('made', '--max-disk', '1G', '--max-total-disk', 'none');
    // the Unix socket (root) defines pools and takes snapshots as it likes
    expect(cli(home, ['pool', 'create', 'c-open', '--size', '1', '--storage', 'overlay']).code).toBe(0);
    const take = await call(tenant, 'POST', '/sandboxes', { pool: 'c-open' });
    expect([take.status, take.body.limit]).toEqual([403, 'diskBytes']);
    const run = await call(tenant, 'POST', '/pools/c-open/run', { argv: ['true'] });
    expect([run.status, run.body.limit]).toEqual([403, 'diskBytes']);
    // the library's pool.run goes over /rpc: held to the same ceilings (it once ran past them all)
    const lab = await Lab.connect({ url: d.url, token: tenant });
    try {
      const viaRpc = await lab
        .pool('c-open')
        .run(['true'])
        .catch((e: Json) => e);
      expect([viaRpc.code, viaRpc.limit], String(viaRpc)).toEqual(['ABOVE_CEILING', 'diskBytes']);
    } finally {
      lab.close();
    }
    expect(cli(home, ['pool', 'rm', 'c-open']).code).toBe(0);
    expect(cli(home, ['create', '--name', 'c-wide', '--storage', 'overlay', '--disk', '2G']).code).toBe(0);
    expect(cli(home, ['snapshot', 'c-wide', '--name', 'c-wide-snap']).code).toBe(0);
    const carried = await call(tenant, 'POST', '/sandboxes', { snapshot: 'c-wide-snap' });
    expect([carried.status, carried.body.limit]).toEqual([403, 'diskBytes']);
    const smaller = await call(tenant, 'POST', '/sandboxes', { snapshot: 'c-wide-snap', limits: { diskBytes: GiB } });
    expect([smaller.status, smaller.body.limits?.diskBytes]).toEqual([201, GiB]);
    expect(cli(home, ['pool', 'create', 'c-root', '--size', '1', '--no-userns']).code).toBe(0);
    const root = await call(tenant, 'POST', '/sandboxes', { pool: 'c-root' });
    expect([root.status, root.body.code]).toEqual([403, 'FORBIDDEN']);
    const rootRun = await call(tenant, 'POST', '/pools/c-root/run', { argv: ['true'] });
    expect([rootRun.status, rootRun.body.code]).toEqual([403, 'FORBIDDEN']);
    // over /rpc as well: a key without admin never runs as the host's root
    const rootLab = await Lab.connect({ url: d.url, token: tenant });
    try {
      const viaRpc = await rootLab
        .pool('c-root')
        .run(['cat', '/proc/self/uid_map'])
        .catch((e: Json) => e);
      expect(viaRpc.code, String(viaRpc.stdout ?? viaRpc)).toBe('FORBIDDEN');
    } finally {
      rootLab.close();
    }
    expect(cli(home, ['pool', 'rm', 'c-root']).code).toBe(0);
    cli(home, ['rm', 'c-wide']);
  });

  it("keep a key's traces its own: not another key's under a name used again, not a pool's runs", async () => {
    const [a, b] = [key('trace-a'), key('trace-b')];
    const first = await call(a, 'POST', '/sandboxes', { name: 'reused' });
    expect(first.status).toBe(201);
    expect((await call(a, 'DELETE', `/sandboxes/${first.body.id}`)).status).toBe(204);
    expect(cli(home, ['pool', 'create', 'c-traced', '--size', '1']).code).toBe(0);
    expect((await call(a, 'POST', '/pools/c-traced/run', { argv: ['true'] })).status).toBe(200);
    const ids: string[] = [];
    try {
      for (const name of ['reused', 'c-traced']) {
        const made = await call(b, 'POST', '/sandboxes', { name });
        expect(made.status).toBe(201);
        ids.push(made.body.id);
      }
      const seen = (await call(b, 'GET', '/traces?limit=100')).body.map((t: Json) => `${t.kind} ${t.target}`);
      expect(seen.sort()).toEqual(['create c-traced', 'create reused']);
      // the pool's runs since, newer than b's creates, do not push them off a small page
      for (let i = 0; i < 3; i++)
        expect((await call(a, 'POST', '/pools/c-traced/run', { argv: ['true'] })).status).toBe(200);
      const page = (await call(b, 'GET', '/traces?limit=2')).body.map((t: Json) => `${t.kind} ${t.target}`);
      expect(page.sort()).toEqual(['create c-traced', 'create reused']);
      const aCreate = (await call(a, 'GET', '/traces?limit=100')).body;
      expect(aCreate).toEqual([]); // a's machine is gone: its traces with it, for a key
    } finally {
      for (const id of ids) await call(b, 'DELETE', `/sandboxes/${id}`);
      cli(home, ['pool', 'rm', 'c-traced']);
    }
  });

  it("keep a key's snapshots its own: others' are not found, the host's may be restored, not removed", async () => {
    const [a, b] = [key('snap-a'), key('snap-b')];
    const box = await call(a, 'POST', '/sandboxes', {});
    expect((await call(a, 'POST', `/sandboxes/${box.body.id}/snapshots`, { name: 'a-snap' })).status).toBe(201);
    expect((await call(b, 'GET', '/snapshots')).body.map((s: { name: string }) => s.name)).not.toContain('a-snap');
    for (const [method, path, body] of [
      ['GET', '/snapshots/a-snap', undefined],
      ['DELETE', '/snapshots/a-snap', undefined],
      ['POST', '/sandboxes', { snapshot: 'a-snap' }],
    ] as const) {
      const r = await call(b, method, path, body);
      expect([r.status, r.body.code, r.body.hint], `${method} ${path}`).toEqual([
        404,
        'SNAPSHOT_NOT_FOUND',
        'list them with GET /snapshots',
      ]);
    }
    // the host's own snapshot (taken through the CLI): restored by a key, removed only by its owner
    expect(cli(home, ['create', '--name', 'c-host']).code).toBe(0);
    expect(cli(home, ['snapshot', 'c-host', '--name', 'c-host-snap']).code).toBe(0);
    expect((await call(b, 'GET', '/snapshots/c-host-snap')).status).toBe(200);
    expect((await call(b, 'DELETE', '/snapshots/c-host-snap')).status).toBe(404);
    expect((await call(a, 'DELETE', '/snapshots/a-snap')).status).toBe(204);
    for (const s of ['c-host-snap', 'c-wide-snap']) cli(home, ['snapshot', 'rm', s]);
    cli(home, ['rm', 'c-host']);
  });

  it('are shown by key ls, and none lifts one', async () => {
    const free = key('free', '--max-memory', 'none', '--max-pids', '50');
    const ls = cli(home, ['key', 'ls']);
    expect(ls.out).toMatch(/^free\s+read,exec\s+-\s+-\s+memory=none,pids=50\s/m);
    expect(JSON.parse(cli(home, ['key', 'ls', '--json']).out)).toContainEqual(
      expect.objectContaining({ name: 'free', ceilings: { memoryBytes: null, pids: 50 } }),
    );
    const who = (await call(free, 'GET', '/whoami')).body.ceilings;
    expect([who.memoryBytes, who.pids]).toEqual([null, 50]);
    expect(cli(home, ['key', 'create', 'bad', '--max-memory', 'lots']).err).toMatch(/invalid memory ceiling "lots"/);
  });
});

// A host where no disk cap can hold: btrfs without simple quotas (Linux before 6.7: stock Debian
// 12's 6.1), made here with SNAPLAB_DISK_QUOTAS=off on a pool of its own. Every create of a key was
// refused there ("--disk cannot be enforced here"), the E2B front's too: the daemon asked for the
// cap by the driver alone.
describe('where no disk cap holds', () => {
  let home2: string;
  let d2: TestDaemon;
  beforeAll(async () => {
    home2 = mkdtempSync(join(tmpdir(), 'snaplab-test-ceilings-nocap-'));
    d2 = await startDaemon(home2, ['--default-timeout', '0'], ['env', 'SNAPLAB_DISK_QUOTAS=off']);
  }, 120_000);
  afterAll(async () => {
    await d2?.stop();
    removeHome(home2);
  });
  const at = async (token: string, method: string, path: string, json?: unknown) => {
    const r = await fetch(`${d2.url}${path}`, {
      method,
      headers: { authorization: `Bearer ${token}`, ...(json ? { 'content-type': 'application/json' } : {}) },
      body: json ? JSON.stringify(json) : undefined,
    });
    const text = await r.text();
    return { status: r.status, body: text ? JSON.parse(text) : null } as { status: number; body: Json };
  };

  it("a key's sandbox is made without a cap (its disk ceilings do not apply); one that asks for a cap is refused", async () => {
    const made = cli(home2, ['key', 'create', 'nocap', '--scope', 'read,exec,admin', '--max-disk', '1G']);
    expect(made.code, made.err).toBe(0);
    const token = made.out.trim();
    const box = await at(token, 'POST', '/sandboxes', {});
    expect(box.status, JSON.stringify(box.body)).toBe(201);
    expect(box.body.limits.diskBytes).toBeUndefined();
    const asked = await at(token, 'POST', '/sandboxes', { limits: { diskBytes: 512 * MiB } });
    expect([asked.status, asked.body.code], JSON.stringify(asked.body)).toEqual([400, 'BAD_INPUT']);
    expect(asked.body.message).toMatch(/cannot be enforced here/);
    // a pool's standby without a cap is taken (it was refused: "has no disk cap"), the first take
    // too, which meets none ready (its miss was checked as if raised with the 4 GiB default: 403)
    expect((await at(token, 'POST', '/pools', { name: 'nocap', image: 'busybox', size: 1 })).status).toBeLessThan(300);
    const taken = await at(token, 'POST', '/sandboxes', { pool: 'nocap' });
    expect(taken.status, JSON.stringify(taken.body)).toBe(201);
    expect(taken.body.limits.diskBytes).toBeUndefined();
    for (const id of [box.body.id, taken.body.id])
      expect((await at(token, 'DELETE', `/sandboxes/${id}`)).status).toBe(204);
    expect((await at(token, 'DELETE', '/pools/nocap')).status).toBeLessThan(300);
  }, 120_000);
});

// The other way no cap holds: a home on a btrfs of the user's whose quotas are off (snaplab turns
// them on only in a pool of its own). A key's create carried the default cap as if asked, and the
// raise refused it ("--disk cannot be enforced here: quotas are off"); a default is dropped.
describe("on a btrfs of the user's without quotas", () => {
  let dir: string;
  let home3: string;
  let d3: TestDaemon | undefined;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'snaplab-test-ceilings-userfs-'));
    const ok = (r: ReturnType<typeof spawnSync>): void => {
      if (r.status !== 0) throw new Error(String(r.stderr));
    };
    const img = join(dir, 'fs.img');
    ok(spawnSync('truncate', ['-s', '2G', img], { encoding: 'utf8' }));
    ok(spawnSync('mkfs.btrfs', ['-q', img], { encoding: 'utf8' }));
    mkdirSync(join(dir, 'mnt'));
    ok(spawnSync('mount', ['-o', 'loop', img, join(dir, 'mnt')], { encoding: 'utf8' }));
    home3 = join(dir, 'mnt', 'home');
    d3 = await startDaemon(home3, ['--default-timeout', '0']);
  }, 120_000);
  afterAll(async () => {
    await d3?.stop();
    if (home3) removeHome(home3);
    spawnSync('umount', [join(dir, 'mnt')]);
    rmSync(dir, { recursive: true, force: true });
  });

  it("a key's create is made without the default cap it cannot hold; one it asks for is refused", async () => {
    const made = cli(home3, ['key', 'create', 'userfs', '--scope', 'read,exec']);
    expect(made.code, made.err).toBe(0);
    const call3 = async (method: string, path: string, json?: unknown) => {
      const r = await fetch(`${d3!.url}${path}`, {
        method,
        headers: {
          authorization: `Bearer ${made.out.trim()}`,
          ...(json ? { 'content-type': 'application/json' } : {}),
        },
        body: json ? JSON.stringify(json) : undefined,
      });
      const text = await r.text();
      return { status: r.status, body: (text ? JSON.parse(text) : null) as Json };
    };
    const box = await call3('POST', '/sandboxes', {});
    expect(box.status, JSON.stringify(box.body)).toBe(201);
    expect([box.body.storage, box.body.limits.diskBytes]).toEqual(['btrfs', undefined]);
    const asked = await call3('POST', '/sandboxes', { limits: { diskBytes: 512 * MiB } });
    expect([asked.status, asked.body.code]).toEqual([400, 'BAD_INPUT']);
    expect((await call3('DELETE', `/sandboxes/${box.body.id}`)).status).toBe(204);
  }, 120_000);
});
