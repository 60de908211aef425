import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, expect, it } from 'vitest';
import { openDb } from '../store/db.js';
import { Store } from '../store/store.js';
import { EventLog } from './events.js';
import type { EventJournal } from './served-lab.js';

let home: string;
let store: Store;
beforeEach(() => {
  home = mkdtempSync(join(tmpdir(), 'snaplab-events-'));
  store = new Store(openDb(home));
});
afterEach(() => {
  store.db.close();
  rmSync(home, { recursive: true, force: true });
});

/** The journal as the embedded lab gives it to a daemon (sdk/lab.ts), on a real store. */
const journal = (): EventJournal => ({
  append: (e) => store.appendEvent(e),
  after: (id, n) => store.eventsAfter(id, n),
  lastId: () => store.lastEventId(),
  watched: () => undefined,
  setWatched: () => undefined,
});

it('a restart still knows a sandbox whose events are older than the journal keeps: its removal is told, a change is not a creation', () => {
  const log = new EventLog(journal());
  log.record('created', { id: 'old', name: 'old', owner: 'k1' }, 'made');
  log.record('ready', { id: 'old' }, null);
  log.record('paused', { id: 'calm', name: 'calm' }, null);
  log.record('created', { id: 'gone', name: 'gone' }, null);
  log.record('destroyed', { id: 'gone' }, null);
  // 12 000 events of others (a sandbox made and removed 6 000 times): the journal trims past 10 000
  for (let i = 0; i < 6000; i++) {
    log.record('created', { id: `t${i}`, name: `t${i}` }, null);
    log.record('destroyed', { id: `t${i}` }, null);
  }
  const kept = store.eventsAfter(0, 20_000);
  // what is kept past the newest 10 000 (and the 1 000 a trim waits for): one row a sandbox still there
  expect(kept.length).toBeLessThanOrEqual(11_002);
  expect(kept.filter((e) => e.id < kept.at(-1)!.id - 11_000).map((e) => [e.sandbox, e.type])).toEqual([
    ['old', 'ready'],
    ['calm', 'paused'],
  ]);

  const again = new EventLog(journal());
  const told: [string | null, string, string | null][] = [];
  again.on('event', (e: { sandbox: string | null; type: string; name: string | null }) =>
    told.push([e.sandbox, e.type, e.name]),
  );
  again.watch({
    mark: 1,
    complete: false,
    sandboxes: [{ id: 'calm', name: 'calm', state: 'running', reason: null, pool: null }],
    removed: ['old', 'gone'],
  });
  expect(told).toEqual([
    ['calm', 'resumed', 'calm'],
    ['old', 'destroyed', 'old'],
  ]);
  // the owner kept with it: the removal is the key's to see
  expect(store.eventsAfter(0, 20_000).at(-1)?.data).toEqual({ owner: 'k1' });
});
