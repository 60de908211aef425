import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, expect, it } from 'vitest';
import { openDb } from '../store/db.js';
import type { SandboxRecord } from '../store/records.js';
import { Store } from '../store/store.js';
import { Lab } from './lab.js';
import { listCursor, nextCursor } from './paging.js';

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
  const r: SandboxRecord = {
    id,
    name: `n-${id}`,
    image: 'busybox',
    storage: 'dir',
    driver: 'namespaces',
    state: 'dead',
    reason: 'a record of the paging test',
    volume: null,
    pid: null,
    pidStart: null,
    limits: {},
    origin: null,
    createdAt: at,
    pool: null,
    scenario: null,
    baseline: null,
    uidBase: null,
  };
  expect(store.insertSandbox(r)).toBe(true);
  store.putMeta({ id, labels, metadata: {}, owner, timeoutS: null, onTimeout: null, expiresAt: null });
}

/** Every page of `limit` with these filters, following each page's cursor; `between` runs after each page. */
async function pages(
  q: { labels?: Record<string, string>; owner?: string | null },
  limit: number,
  between: (page: number) => void = () => {},
): Promise<string[][]> {
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
