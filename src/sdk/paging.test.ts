import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, expect, it } from 'vitest';
import { openDb } from '../store/db.js';
import { testRecord } from '../store/test-record.js';
import { Store } from '../store/store.js';
import { Lab } from './lab.js';
import { checkPage, listCursor, MAX_PAGE, nextCursor } from './paging.js';
import type { ListOptions } from './api.js';

// The page a lab lists is read from its store (records only, check: false): no machine is made here.
let home: string;
let store: Store;
let lab: Lab;
beforeEach(async () => {
  home = mkdtempSync(join(tmpdir(), 'snaplab-paging-'));
  lab = await Lab.open({ home });
  store = new Store(openDb(home));
});
afterEach(() => {
  store.db.close();
  rmSync(home, { recursive: true, force: true });
});

/** A record (no machine behind it) made at `at` by `owner`, with labels. */
function put(id: string, at: number, labels: Record<string, string>, owner: string | null = null): void {
  const r = testRecord(id, { reason: 'a record of the paging test', createdAt: at });
  expect(store.insertSandbox(r)).toBe(true);
  store.putMeta({ id, labels, metadata: {}, owner, timeoutS: null, onTimeout: null, expiresAt: null });
}

/** Every page of `limit` with these filters, following each page's cursor; `between` runs after each page. */
async function pages(q: ListOptions, limit: number, between: (page: number) => void = () => {}): Promise<string[][]> {
  const out: string[][] = [];
  let after: string | undefined;
  for (;;) {
    const page = await lab.list({ ...q, limit, check: false, ...(after ? { after } : {}) });
    out.push(page.map((b) => b.id));
    after = nextCursor(page, limit);
    if (after === undefined) return out;
    between(out.length);
  }
}

it('pages oldest first (creation time, then id), each row once, a shorter last page ending the list', async () => {
  // ties on the creation time are broken by id
  for (const [id, at] of [
    ['b1', 10],
    ['a1', 10],
    ['c1', 5],
    ['d1', 20],
    ['e1', 20],
  ] as const)
    put(id, at, { team: 'x' });
  expect(await pages({}, 2)).toEqual([['c1', 'a1'], ['b1', 'd1'], ['e1']]);
  // a full last page has one (empty) page after it
  expect(await pages({}, 5)).toEqual([['c1', 'a1', 'b1', 'd1', 'e1'], []]);
  expect((await lab.list({ check: false })).map((b) => b.id)).toEqual(['c1', 'a1', 'b1', 'd1', 'e1']);
  const [first] = await lab.list({ limit: 1, check: false });
  expect(listCursor(first!)).toBe('5.c1');
});

it('keeps its cursor across removals and inserts between pages, with owner and label filters', async () => {
  for (let i = 0; i < 12; i++)
    put(`s${String(i).padStart(2, '0')}`, 100 + i, { team: i % 2 ? 'odd' : 'even', tier: 'a' }, i % 3 ? 'k1' : null);
  // k1's odd ones: s01 s05 s07 s11 (s03 s09 are made by no key)
  const q = { labels: { team: 'odd', tier: 'a' }, owner: 'k1' };
  expect((await pages(q, 10)).flat()).toEqual(['s01', 's05', 's07', 's11']);
  const seen = await pages(q, 2, (page) => {
    if (page !== 1) return;
    // the sandbox the cursor names goes: the cursor still says where the next page starts
    store.deleteSandbox('s05');
    // one ahead goes, one ahead comes (in order, and passing the filters), one comes behind the
    // cursor (not seen: it sorts before), one comes ahead that does not pass them
    store.deleteSandbox('s07');
    put('s08b', 108, { team: 'odd', tier: 'a' }, 'k1');
    put('s02b', 102, { team: 'odd', tier: 'a' }, 'k1');
    put('s10b', 110, { team: 'odd', tier: 'b' }, 'k1');
    put('s10c', 110, { team: 'odd', tier: 'a' }, 'k2');
  });
  expect(seen).toEqual([['s01', 's05'], ['s08b', 's11'], []]);
  // made by no key (null), with one label
  expect((await pages({ owner: null, labels: { team: 'even' } }, 3)).flat()).toEqual(['s00', 's06']);
  // a label key is compared as it is (no JSON path is made of it)
  put('q1', 200, { 'a.b/c': 'v"w' });
  expect((await lab.list({ labels: { 'a.b/c': 'v"w' }, check: false })).map((b) => b.id)).toEqual(['q1']);
  expect(await lab.list({ labels: { 'a.b': 'v"w' }, check: false })).toEqual([]);
});

it('gives each listed sandbox the labels and lifetime read with it, live again once it changes them', async () => {
  put('m1', 1, { team: 'x' }, 'k1');
  const [box] = await lab.list({ check: false });
  expect(box!.toJSON()).toMatchObject({ labels: { team: 'x' }, owner: 'k1', timeoutS: 0, expiresAt: null });
  // changed by another process: the listed view stands until this object changes them or is refreshed
  store.putMeta({
    id: 'm1',
    labels: { team: 'y' },
    metadata: {},
    owner: 'k1',
    timeoutS: null,
    onTimeout: null,
    expiresAt: null,
  });
  expect(box!.labels).toEqual({ team: 'x' });
  await box!.refresh();
  expect(box!.labels).toEqual({ team: 'y' });
  await box!.setLabels({ metadata: { note: 'n' } });
  expect(box!.toJSON()).toMatchObject({ labels: { team: 'y' }, metadata: { note: 'n' } });
  await expect(lab.list({ limit: 0 })).rejects.toMatchObject({ code: 'BAD_INPUT' });
  await expect(lab.list({ after: '1.a/b' })).rejects.toMatchObject({ code: 'BAD_INPUT' });
});

const STOPPED = 'stopped (snaplab stop); its filesystem is kept: `snaplab start` runs it again';

/** A record made at `at`, in a state (a stopped one: dead with stop's reason), with metadata. */
function putMeta(id: string, at: number, state: string, metadata: Record<string, string>, owner = 'k1'): void {
  put(id, at, {}, owner);
  store.db
    .prepare('UPDATE sandboxes SET state = ?, reason = ? WHERE id = ?')
    .run(state === 'stopped' ? 'dead' : state, state === 'stopped' ? STOPPED : `${state} here`, id);
  store.putMeta({ id, labels: {}, metadata, owner, timeoutS: null, onTimeout: null, expiresAt: null });
}

const chunks = (ids: string[], n: number): string[][] => {
  const out: string[][] = [];
  for (let i = 0; i < ids.length; i += n) out.push(ids.slice(i, i + n));
  // a full last page has one (empty) page after it
  if (ids.length % n === 0) out.push([]);
  return out;
};

it('filters by metadata, state and creation time in its one query, newest first too, each page and cursor exact', async () => {
  // 1 100 rows with suite=wide (a filter too broad to read from its rows: the list's order is
  // walked), 1 in 100 with user=u7 (few: read from them); states in turn; some without a
  // template, and other keys' rows around them
  const STATES = ['running', 'paused', 'stopped', 'dead', 'creating'];
  const rows: { id: string; at: number; state: string; meta: Record<string, string>; owner: string }[] = [];
  for (let i = 0; i < 1100; i++) {
    const meta: Record<string, string> = { suite: 'wide', user: `u${i % 100}` };
    if (i % 3) meta['e2b.template'] = i % 2 ? 'base' : 'py';
    // ties on the creation time, broken by id
    rows.push({
      id: `r${String(i).padStart(4, '0')}`,
      at: 1000 + Math.floor(i / 2),
      state: STATES[i % 5]!,
      meta,
      owner: i % 11 ? 'k1' : 'k2',
    });
  }
  store.db.transaction(() => {
    for (const r of rows) putMeta(r.id, r.at, r.state, r.meta, r.owner);
  })();
  const want = (keep: (r: (typeof rows)[number]) => boolean, desc: boolean): string[] => {
    const out = rows.filter(keep).sort((a, b) => a.at - b.at || (a.id < b.id ? -1 : 1));
    return (desc ? out.reverse() : out).map((r) => r.id);
  };
  const e2bPaused = new Set(['paused', 'stopped']);
  // selective (read from its rows), newest first, with state and a start, as the E2B front asks
  const q1: ListOptions = {
    owner: 'k1',
    metadata: { user: 'u7' },
    state: ['paused', 'stopped'],
    createdSince: 1100,
    order: 'desc',
  };
  const w1 = want((r) => r.owner === 'k1' && r.meta.user === 'u7' && e2bPaused.has(r.state) && r.at >= 1100, true);
  expect(w1.length).toBeGreaterThan(2);
  expect(await pages(q1, 2)).toEqual(chunks(w1, 2));
  // broad (1 100 rows: walked in the list's order), oldest first, and one that keeps rows without a key
  const q2: ListOptions = {
    owner: 'k1',
    metadata: { suite: 'wide', 'e2b.template': ['py', null] },
    state: ['running'],
  };
  const w2 = want((r) => r.owner === 'k1' && r.meta['e2b.template'] !== 'base' && r.state === 'running', false);
  expect(w2.length).toBeGreaterThan(30);
  expect(await pages(q2, 7)).toEqual(chunks(w2, 7));
  expect(await pages({ ...q2, order: 'desc' }, 50)).toEqual(chunks([...w2].reverse(), 50));
  // one of several values, or without the key (null): E2B's `base` template, shown for none
  const q3: ListOptions = { owner: 'k2', metadata: { 'e2b.template': ['base', null], user: ['u0', 'u1', 'u22'] } };
  const w3 = want(
    (r) =>
      r.owner === 'k2' && (r.meta['e2b.template'] ?? 'base') === 'base' && ['u0', 'u1', 'u22'].includes(r.meta.user!),
    false,
  );
  expect(w3.length).toBeGreaterThan(1);
  expect((await lab.list({ ...q3, check: false })).map((b) => b.id)).toEqual(w3);
  // `stopped` is not `dead`: each its own; none asked, none given
  const dead = await lab.list({ state: ['dead'], createdSince: 1540, check: false });
  expect(dead.map((b) => b.id)).toEqual(want((r) => r.state === 'dead' && r.at >= 1540, false));
  expect(dead.every((b) => !b.stopped)).toBe(true);
  const stopped = await lab.list({ state: ['stopped'], createdSince: 1540, check: false });
  expect(stopped.map((b) => b.id)).toEqual(want((r) => r.state === 'stopped' && r.at >= 1540, false));
  expect(stopped.every((b) => b.stopped)).toBe(true);
  expect(await lab.list({ state: [], check: false })).toEqual([]);
  expect(await lab.list({ metadata: { user: [] }, check: false })).toEqual([]);
  // the side table follows the metadata: changed, and removed with its sandbox
  const [first] = await lab.list({ metadata: { user: 'u7' }, limit: 1, check: false });
  await first!.setLabels({ metadata: { user: 'moved' } });
  expect((await lab.list({ metadata: { user: 'moved' }, check: false })).map((b) => b.id)).toEqual([first!.id]);
  expect((await lab.list({ metadata: { user: 'u7' }, check: false })).map((b) => b.id)).not.toContain(first!.id);
  store.deleteSandbox(first!.id);
  expect(await lab.list({ metadata: { user: 'moved' }, check: false })).toEqual([]);
  expect(store.db.prepare('SELECT COUNT(*) AS n FROM sandbox_metadata WHERE id = ?').get(first!.id)).toEqual({ n: 0 });
  // what no list can have is refused before any work
  for (const bad of [
    { state: ['asleep'] },
    { metadata: { user: 7 } },
    { metadata: { user: [1] } },
    { order: 'up' },
    { createdSince: 1.5 },
  ])
    await expect(lab.list(bad as ListOptions)).rejects.toMatchObject({ code: 'BAD_INPUT' });
});

it('a metadata filter is one statement whatever the number of values; past the caps, BAD_INPUT', async () => {
  putMeta('v1', 1, 'running', { k: 'x17' });
  putMeta('v2', 2, 'running', { k: 'other' });
  const many = Array.from({ length: 256 }, (_, i) => `x${i}`);
  // the lab's own store: the statements it keeps prepared
  const labStore = (lab as unknown as { ctx: { store: Store } }).ctx.store;
  const prepared = (): number => (labStore as unknown as { arrays: Map<string, unknown> }).arrays.size;
  expect((await lab.list({ metadata: { k: many }, check: false })).map((b) => b.id)).toEqual(['v1']);
  const shapes = prepared();
  expect(shapes).toBeGreaterThan(0);
  // another number of values: the same statement (its values are one parameter)
  expect((await lab.list({ metadata: { k: many.slice(0, 20) }, check: false })).map((b) => b.id)).toEqual(['v1']);
  expect((await lab.list({ metadata: { k: [...many.slice(0, 3), null] }, check: false })).map((b) => b.id)).toEqual([]);
  expect(prepared()).toBeLessThanOrEqual(shapes + 1); // (+1: the null alternative's own shape)
  await expect(lab.list({ metadata: { k: [...many, 'one more'] } })).rejects.toMatchObject({ code: 'BAD_INPUT' });
  const keys = Object.fromEntries(Array.from({ length: 33 }, (_, i) => [`k${i}`, 'v']));
  await expect(lab.list({ metadata: keys })).rejects.toMatchObject({ code: 'BAD_INPUT' });
});

it('takes a page of at most 10 000, as the daemon does (it had no bound embedded)', () => {
  expect(checkPage({ limit: MAX_PAGE })).toBeUndefined();
  expect(() => checkPage({ limit: MAX_PAGE + 1 })).toThrow(/invalid list limit 10001/);
  expect(() => checkPage({ limit: 0 })).toThrow(/invalid list limit 0/);
});
