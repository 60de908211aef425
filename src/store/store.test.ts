import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, expect, it, vi } from 'vitest';
import { openDb } from './db.js';
import { migrations } from './migrations.js';
import type { SandboxRecord, SnapshotRecord } from './records.js';
import { Store } from './store.js';
import { testRecord } from './test-record.js';

const require = createRequire(import.meta.url);
const Database = require('better-sqlite3') as typeof import('better-sqlite3');

let home: string;
beforeEach(() => {
  home = mkdtempSync(join(tmpdir(), 'snaplab-store-'));
});
afterEach(() => rmSync(home, { recursive: true, force: true }));

const OWNERS = migrations.findIndex((m) => m.includes('ADD COLUMN owner_pid'));

/** A state.db as the snaplab before the owner columns left it. */
function oldDb(): import('better-sqlite3').Database {
  const db = new Database(join(home, 'state.db'));
  for (const m of migrations.slice(0, OWNERS)) db.exec(m);
  db.pragma(`user_version = ${OWNERS}`);
  return db;
}

function oldSandbox(db: import('better-sqlite3').Database, id: string, state: string, reason: string, pool?: string) {
  db.prepare(
    `INSERT INTO sandboxes (id, name, image, storage, driver, state, reason, limits, created_at, pool)
       VALUES (?, ?, 'busybox', 'dir', 'namespaces', ?, ?, '{}', 1, ?)`,
  ).run(id, `n-${id}`, state, reason, pool ?? null);
}

it('moves the owner that old rows kept in reason into the owner columns', () => {
  expect(OWNERS).toBeGreaterThan(0);
  const db = oldDb();
  oldSandbox(db, 'a1', 'creating', 'being created by pid 4242');
  oldSandbox(db, 'a2', 'removing', 'being removed by pid 4343');
  oldSandbox(db, 'a3', 'running', 'taken by pid 77', 'p1');
  oldSandbox(db, 'a4', 'running', 'template of pool my pool (held by pid 99)');
  oldSandbox(db, 'a5', 'dead', 'creation was interrupted (the process creating it exited)');
  oldSandbox(db, 'a6', 'running', 'taken from pool p1');
  oldSandbox(db, 'a7', 'dead', 'removal was interrupted');
  db.prepare(
    `INSERT INTO scenarios (name, id, file, hash, spec, state, reason, created_at)
       VALUES ('s1', 'abcdef', 'f', 'h', '{}', 'creating', 'being raised by pid 555', 1)`,
  ).run();
  db.close();

  const store = new Store(openDb(home));
  const owner = (id: string) => store.getSandbox(id)?.owner;
  expect(owner('a1')).toEqual({ pid: 4242, start: null, op: 'create' });
  expect(owner('a2')).toEqual({ pid: 4343, start: null, op: 'remove' });
  expect(owner('a3')).toEqual({ pid: 77, start: null, op: 'hold' });
  expect(owner('a4')).toEqual({ pid: 99, start: null, op: 'hold' });
  expect(store.getSandbox('a4')?.templateOf).toBe('my pool');
  expect(owner('a5')).toEqual({ pid: null, start: null, op: 'create' });
  expect(owner('a6')).toBeNull();
  expect(owner('a7')).toBeNull();
  expect(store.getSandbox('a3')?.templateOf).toBeNull();
  expect(store.getScenario('s1')?.owner).toEqual({ pid: 555, start: null, op: 'create' });
  // the human text stays as it was
  expect(store.getSandbox('a4')?.reason).toBe('template of pool my pool (held by pid 99)');
  store.db.close();
});

const sandbox = (id: string, name: string): SandboxRecord =>
  testRecord(id, { name, state: 'creating', owner: { pid: 12, start: 34, op: 'create' } });

it('answers a taken name with false, and keeps the owner it was given', () => {
  const store = new Store(openDb(home));
  expect(store.insertSandbox(sandbox('b1', 'box'))).toBe(true);
  expect(store.insertSandbox(sandbox('b2', 'box'))).toBe(false); // UNIQUE (name)
  expect(store.insertSandbox(sandbox('b1', 'other'))).toBe(false); // PRIMARY KEY (id)
  expect(store.getSandbox('box')?.owner).toEqual({ pid: 12, start: 34, op: 'create' });
  store.updateSandbox('b1', { state: 'running', owner: null });
  expect(store.getSandbox('box')?.owner).toBeNull();

  const snap: SnapshotRecord = {
    name: 's',
    id: 'v1',
    sandbox: 'box',
    image: 'busybox',
    storage: 'dir',
    volume: { id: 'v1', path: '/x' } as SnapshotRecord['volume'],
    limits: {},
    createdAt: 1,
  };
  expect(store.insertSnapshot(snap)).toBe(true);
  expect(store.insertSnapshot({ ...snap, id: 'v2' })).toBe(false);
  const image = { name: 'img', source: 's', path: '/p', sizeBytes: 1, createdAt: 1 };
  expect(store.putImage(image)).toBe(true);
  expect(store.putImage(image)).toBe(false);
  // any other failure is still an error, not a conflict
  expect(() => store.insertSandbox({ ...sandbox('b3', 'x'), image: null as unknown as string })).toThrow(/NOT NULL/);
  store.db.close();
});

it('a state.db a newer snaplab wrote is refused with a code and a hint, and left as it was', () => {
  const db = new Database(join(home, 'state.db'));
  db.pragma(`user_version = ${migrations.length + 1}`);
  db.close();
  expect(() => openDb(home)).toThrow(
    expect.objectContaining({ code: 'STATE_TOO_NEW', hint: expect.stringMatching(/upgrade snaplab/) }),
  );
  const again = new Database(join(home, 'state.db'));
  expect(again.pragma('user_version', { simple: true })).toBe(migrations.length + 1);
  again.close();
});

it("reads a key's sandboxes by the owner's index: its rows' limits and states, and a list filtered by it", () => {
  const store = new Store(openDb(home));
  const meta = (id: string, owner: string | null) =>
    store.putMeta({ id, labels: {}, metadata: {}, owner, timeoutS: null, onTimeout: 'kill', expiresAt: null });
  store.insertSandbox(testRecord('k1', { state: 'running', limits: { memoryBytes: 5 }, createdAt: 2 }));
  store.insertSandbox(testRecord('k2', { state: 'dead', reason: 'gone', createdAt: 1 }));
  store.insertSandbox(testRecord('o1', { state: 'running' }));
  store.insertSandbox(testRecord('n1', { state: 'running' }));
  meta('k1', 'key');
  meta('k2', 'key');
  meta('o1', 'other');
  const byHolds = (rows: ReturnType<Store['ownedLimits']>) =>
    rows.sort((a, b) =>
      `${a.holdsRoom}${JSON.stringify(a.limits)}`.localeCompare(`${b.holdsRoom}${JSON.stringify(b.limits)}`),
    );
  expect(byHolds(store.ownedLimits('key', ['stopped']))).toEqual([
    { driver: 'namespaces', limits: {}, holdsRoom: false, count: 1 },
    { driver: 'namespaces', limits: { memoryBytes: 5 }, holdsRoom: true, count: 1 },
  ]);
  // a dead one with a stop's reason holds its room
  expect(byHolds(store.ownedLimits('key', ['gone'])).map((r) => r.holdsRoom)).toEqual([true, true]);
  expect(store.ownedLimits('nobody', [])).toEqual([]);
  // counted in the store with a list's filters: by state as a list filters it (a stopped one apart)
  expect(store.countSandboxes({}, [])).toEqual({ total: 4, byState: { running: 3, dead: 1 } });
  expect(store.countSandboxes({ owner: 'key' }, ['gone'])).toEqual({ total: 2, byState: { running: 1, stopped: 1 } });
  expect(store.countSandboxes({ owner: null, state: ['running'] }, [])).toEqual({ total: 1, byState: { running: 1 } });
  expect(store.countSandboxes({ owner: 'nobody' }, [])).toEqual({ total: 0, byState: {} });
  const prepare = vi.spyOn(store.db, 'prepare');
  expect(store.pageSandboxes({ owner: 'key' }).map((r) => r.record.id)).toEqual(['k2', 'k1']);
  const listSql = prepare.mock.calls.map(([sql]) => sql).find((sql) => sql.includes('m.owner'));
  prepare.mockRestore();
  // no owner: those made without a key, and those with no meta row at all
  expect(store.pageSandboxes({ owner: null }).map((r) => r.record.id)).toEqual(['n1']);
  // a key's rows are found by the index, not by walking every sandbox of the host
  const plan = (sql: string, ...args: string[]) =>
    (store.db.prepare(`EXPLAIN QUERY PLAN ${sql}`).all(...args) as { detail: string }[])
      .map((r) => r.detail)
      .join('; ');
  // the list's own statement, and ownedLimits' (a store of its own: its statements not yet made)
  const owned = vi.spyOn(store.db, 'prepare');
  new Store(store.db).ownedLimits('key', []);
  const ownedSql = owned.mock.calls.map(([sql]) => sql).find((sql) => sql.includes('owner_held'));
  owned.mockRestore();
  expect(plan(listSql ?? 'no statement with the owner', 'key')).toMatch(
    /SEARCH m USING (COVERING )?INDEX sandbox_meta_owner/,
  );
  // what a key holds: its own counted groups, not its sandboxes' rows
  expect(plan(ownedSql ?? 'no statement of owner_held', 'key')).toMatch(
    /SEARCH owner_held USING PRIMARY KEY \(owner=\?\)/,
  );
  // alike ones come as one row with their count: the same driver, limits, and whether they hold room
  for (const [id, over] of [
    ['g1', { state: 'running', limits: { memoryBytes: 5 }, reason: 'taken by x' }],
    ['g2', { state: 'paused', limits: { memoryBytes: 5 } }],
    ['g3', { state: 'dead', reason: 'gone' }],
    ['g4', { state: 'dead', reason: 'another' }],
    ['g5', { state: 'dead', reason: null }],
    ['g6', { state: 'dead', reason: 'stopped' }],
  ] as const) {
    store.insertSandbox(testRecord(id, over));
    meta(id, 'grouped');
  }
  expect(byHolds(store.ownedLimits('grouped', ['stopped']))).toEqual([
    { driver: 'namespaces', limits: {}, holdsRoom: false, count: 3 },
    { driver: 'namespaces', limits: { memoryBytes: 5 }, holdsRoom: true, count: 2 },
    { driver: 'namespaces', limits: {}, holdsRoom: true, count: 1 },
  ]);
  store.db.close();
});

it("keeps a key's counted groups as its sandboxes change, whoever writes and in whichever order", () => {
  const store = new Store(openDb(home));
  const meta = (id: string, owner: string | null, labels: Record<string, string> = {}) =>
    store.putMeta({ id, labels, metadata: {}, owner, timeoutS: null, onTimeout: 'kill', expiresAt: null });
  // what the groups must be: the same grouping read from every row (the statement owner_held replaced)
  const recount = (owner: string) =>
    (
      store.db
        .prepare(
          `SELECT s.driver, s.limits, s.state = 'dead' AS dead,
             CASE WHEN s.state = 'dead' THEN coalesce(s.reason, '') ELSE '' END AS reason, COUNT(*) AS count
           FROM sandbox_meta m JOIN sandboxes s ON s.id = m.id WHERE m.owner = ? GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4`,
        )
        .all(owner) as unknown[]
    ).map((r) => JSON.stringify(r));
  const kept = (owner: string) =>
    (
      store.db
        .prepare('SELECT driver, limits, dead, reason, count FROM owner_held WHERE owner = ? ORDER BY 1, 2, 3, 4')
        .all(owner) as unknown[]
    ).map((r) => JSON.stringify(r));
  const agree = () => {
    for (const owner of ['a', 'b']) expect(kept(owner)).toEqual(recount(owner));
    // no group is left at zero, none for rows without an owner
    expect(store.db.prepare('SELECT COUNT(*) AS n FROM owner_held WHERE count <= 0').get()).toEqual({ n: 0 });
  };
  // the sandbox first, then its meta; and the meta first, then the sandbox
  store.insertSandbox(testRecord('s1', { state: 'creating', limits: { memoryBytes: 5 } }));
  meta('s1', 'a');
  meta('s2', 'a');
  store.insertSandbox(testRecord('s2', { state: 'creating' }));
  store.insertSandbox(testRecord('s3', { state: 'running' }));
  meta('s3', null);
  agree();
  expect(kept('a')).toHaveLength(2);
  // state, reason, limits and driver changes move a sandbox between groups; a running one's reason does not
  store.updateSandbox('s1', { state: 'running', reason: 'taken by x' });
  store.updateSandbox('s2', { state: 'dead', reason: 'stopped' });
  store.updateSandbox('s3', { state: 'paused' });
  agree();
  store.updateSandbox('s2', { reason: 'crashed' });
  store.db.prepare("UPDATE sandboxes SET limits = '{\"memoryBytes\":9}', driver = 'qemu' WHERE id = 's1'").run();
  agree();
  // a meta written again (its labels, its owner): counted once, under its owner now
  meta('s1', 'a', { x: '1' });
  meta('s3', 'b');
  meta('s2', 'b');
  agree();
  expect(kept('b').reduce((n, r) => n + (JSON.parse(r) as { count: number }).count, 0)).toBe(2);
  // removed: the record (deleteSandbox removes both rows), or one row alone in either order
  store.deleteSandbox('s1');
  store.db.prepare("DELETE FROM sandbox_meta WHERE id = 's2'").run();
  store.db.prepare("DELETE FROM sandboxes WHERE id = 's3'").run();
  agree();
  expect(kept('a')).toEqual([]);
  expect(kept('b')).toEqual([]);
  // many alike: one group, counted
  for (let i = 0; i < 50; i++) {
    store.insertSandbox(testRecord(`m${i}`, { state: 'running' }));
    meta(`m${i}`, 'a');
  }
  agree();
  expect(store.ownedLimits('a', [])).toEqual([{ driver: 'namespaces', limits: {}, holdsRoom: true, count: 50 }]);
  // a writer that REPLACEs a meta row (a snaplab from before the triggers, still running) makes
  // the counts drift; gc's recount mends them, and says so only when they had
  expect(store.recountOwned()).toBe(false);
  store.db
    .prepare(
      `INSERT OR REPLACE INTO sandbox_meta (id, labels, metadata, owner, timeout_s, on_timeout, expires_at)
       VALUES ('m0', '{}', '{}', 'a', NULL, 'kill', NULL)`,
    )
    .run();
  expect(kept('a')).not.toEqual(recount('a'));
  expect(store.recountOwned()).toBe(true);
  agree();
  expect(store.recountOwned()).toBe(false);
  store.db.close();
});

it('counts the groups of a store made before owner_held from its rows, when it is migrated', () => {
  const db = new Database(join(home, 'state.db'));
  const before = migrations.findIndex((m) => m.includes('CREATE TABLE owner_held'));
  db.exec('BEGIN');
  for (const m of migrations.slice(0, before)) db.exec(m);
  db.pragma(`user_version = ${before}`);
  db.exec('COMMIT');
  const old = new Store(db);
  old.insertSandbox(testRecord('o1', { state: 'running' }));
  old.insertSandbox(testRecord('o2', { state: 'dead', reason: 'stopped' }));
  old.insertSandbox(testRecord('o3', { state: 'dead', reason: null }));
  old.insertSandbox(testRecord('o4', { state: 'running' })); // no meta row
  old.insertSandbox(testRecord('o5', { state: 'running' })); // a meta row without an owner
  for (const id of ['o1', 'o2', 'o3'])
    db.prepare("INSERT INTO sandbox_meta (id, labels, metadata, owner) VALUES (?, '{}', '{}', 'k')").run(id);
  db.prepare("INSERT INTO sandbox_meta (id, labels, metadata, owner) VALUES ('o5', '{}', '{}', NULL)").run();
  db.prepare("INSERT INTO sandbox_meta (id, labels, metadata, owner) VALUES ('gone', '{}', '{}', 'k')").run(); // no sandbox
  db.close();
  const store = new Store(openDb(home));
  const byHolds = (rows: ReturnType<Store['ownedLimits']>) =>
    rows.sort((a, b) => Number(b.holdsRoom) - Number(a.holdsRoom));
  expect(byHolds(store.ownedLimits('k', ['stopped']))).toEqual([
    { driver: 'namespaces', limits: {}, holdsRoom: true, count: 2 },
    { driver: 'namespaces', limits: {}, holdsRoom: false, count: 1 },
  ]);
  expect(byHolds(store.ownedLimits('k', []))).toEqual([
    { driver: 'namespaces', limits: {}, holdsRoom: true, count: 1 },
    { driver: 'namespaces', limits: {}, holdsRoom: false, count: 2 },
  ]);
  expect(store.db.prepare('SELECT COUNT(*) AS n FROM owner_held WHERE owner IS NULL').get()).toEqual({ n: 0 });
  expect(store.recountOwned()).toBe(false);
  store.db.close();
});

// a shipped migration is never edited (a home migrated by it would differ from one made after):
// each one's text pinned here by its hash; a new migration is appended and pinned in turn
const SHIPPED = [
  'cd2b49bf992a071f',
  '11d74b5ada41f04a',
  '14b3f3bca2c50bfa',
  '5070ae8a74989a8b',
  'cdd80213e0452534',
  'ad9614ce4c14a8c8',
  '3eb434d0f2da231e',
  '3e98e2c5f323f8f6',
  '423bc95928587f7e',
  '6d88d8829ee5c183',
  'ff069144feb2685f',
  '625c34ddc0acc003',
  'ac7e1ff8152d72b1',
  'dd67c77718610e22',
  '5a8f242f9fa38d33',
  'be4d5e8676e2f99d',
  'e889b235b1f6211f',
  '7bc1c8c32d1aaf78',
  '83c1192529956bbf',
  '1e919449753cf20f',
  '7bfc043337fe97c2',
  'ae8d727e01397cc1',
  'ce3759ccefbec3dd',
  '4b66e11898c2c4e6',
  '663bff2c3809bab8',
  '7ab264987bac9142',
  'ab321cb61c96ff18',
  '34ffa4291a4aac8b',
];

it('keeps every shipped migration as it shipped', () => {
  const hash = (m: string) => createHash('sha256').update(m).digest('hex').slice(0, 16);
  expect(migrations.slice(0, SHIPPED.length).map(hash)).toEqual(SHIPPED);
  // and a new one is pinned with its change (its hash added above)
  expect(migrations.length).toBe(SHIPPED.length);
});
