import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, expect, it, vi } from 'vitest';
import { openDb } from '../../store/db.js';
import type { SnapshotRecord } from '../../store/records.js';
import { Store } from '../../store/store.js';
import { testRecord } from '../../store/test-record.js';
import type { LabContext } from '../context.js';
import { sandboxNotFound, snapshotNotFound } from './removals.js';

let home: string;
let store: Store;
beforeEach(() => {
  home = mkdtempSync(join(tmpdir(), 'snaplab-removals-'));
  store = new Store(openDb(home));
});
afterEach(() => {
  store.db.close();
  rmSync(home, { recursive: true, force: true });
});

it('a not-found error names the first ten, and reads only those: a miss beside thousands costs what it does beside none', () => {
  // a create through the daemon asks for its drawn name, a miss, every time: it read every record
  // for its hint (a pool take 5.9 → 52 ms beside 10 000 records; docs/benchmarks.md)
  store.db.transaction(() => {
    for (let i = 0; i < 30; i++) {
      store.insertSandbox(testRecord(`s${i}`, { name: `box-${i}`, createdAt: i }));
      store.insertSnapshot({
        name: `snap-${i}`,
        id: `v${i}`,
        sandbox: `box-${i}`,
        image: 'busybox',
        storage: 'dir',
        volume: { id: `v${i}`, path: '/x' } as SnapshotRecord['volume'],
        limits: {},
        createdAt: i,
      });
    }
  })();
  const ctx = { store } as unknown as LabContext;
  const all = [vi.spyOn(store, 'listSandboxes'), vi.spyOn(store, 'listSnapshots')];
  const prepared = vi.spyOn(store.db, 'prepare');
  const first = Array.from({ length: 10 }, (_, i) => i);
  const box = sandboxNotFound(ctx, 'nope');
  expect(box.code).toBe('SANDBOX_NOT_FOUND');
  expect(box.hint).toBe(`known sandboxes: ${first.map((i) => `box-${i}`).join(', ')} (see \`snaplab ls\`)`);
  const snap = snapshotNotFound(ctx, 'nope');
  expect(snap.code).toBe('SNAPSHOT_NOT_FOUND');
  expect(snap.hint).toBe(`known snapshots: ${first.map((i) => `snap-${i}`).join(', ')}`);
  for (const spy of all) expect(spy).not.toHaveBeenCalled();
  // each statement it ran reads a bounded page
  for (const [sql] of prepared.mock.calls) expect(sql).toMatch(/LIMIT \?/);
  expect(prepared).toHaveBeenCalledTimes(2);
});

it('says how to make one when there is none', () => {
  const ctx = { store } as unknown as LabContext;
  expect(sandboxNotFound(ctx, 'x').hint).toBe('create one with `snaplab create --image busybox`');
  expect(snapshotNotFound(ctx, 'x').hint).toBe('take one with `snaplab snapshot <sandbox> --name NAME`');
});
