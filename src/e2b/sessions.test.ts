import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { getSignature } from 'e2b';
import { afterEach, beforeEach, expect, it } from 'vitest';
import { openDb } from '../store/db.js';
import { Store } from '../store/store.js';
import type { SessionRows } from '../store/records.js';
import { sameSecret, sealedSessions, signatureOf } from './sessions.js';

let home: string;
let store: Store;
let rows: SessionRows;
beforeEach(() => {
  home = mkdtempSync(join(tmpdir(), 'snaplab-e2b-sessions-'));
  store = new Store(openDb(home));
  rows = {
    list: () => store.listE2bSessions(),
    put: (id, sealed) => store.putE2bSession(id, sealed),
    delete: (id) => store.deleteE2bSession(id),
  };
});
afterEach(() => {
  store.db.close();
  rmSync(home, { recursive: true, force: true });
});

const SESSION = { apiKey: 'e2b_0123456789abcdef0123456789abcdef01234567', accessToken: 'f00d'.repeat(12) };

it('keeps sessions sealed in the store, under a secret of the home only the daemon reads', () => {
  const secret = join(home, 'e2b-sessions.key');
  sealedSessions(rows, secret).save('sbx1', SESSION);
  expect(statSync(secret).mode & 0o777).toBe(0o600);
  expect(readFileSync(secret).length).toBe(32);
  // neither the key nor the token is in the row
  const [row] = store.listE2bSessions();
  expect(row!.id).toBe('sbx1');
  expect(row!.sealed).not.toContain(SESSION.apiKey);
  expect(Buffer.from(row!.sealed, 'base64').toString('latin1')).not.toContain(SESSION.accessToken);
  // a later front (a restarted daemon) opens it
  expect(sealedSessions(rows, secret).load().get('sbx1')).toEqual(SESSION);
  // a row moved to another sandbox's id does not open there: it is dropped
  store.putE2bSession('sbx2', row!.sealed);
  const loaded = sealedSessions(rows, secret).load();
  expect([...loaded.keys()]).toEqual(['sbx1']);
  expect(store.listE2bSessions().map((r) => r.id)).toEqual(['sbx1']);
  // the sandbox's record removed: its session with it
  store.deleteSandbox('sbx1');
  expect(store.listE2bSessions()).toEqual([]);
});

it('drops the rows another secret sealed, and refuses a secret file of the wrong size', () => {
  sealedSessions(rows, join(home, 'one.key')).save('sbx1', SESSION);
  expect(sealedSessions(rows, join(home, 'other.key')).load().size).toBe(0);
  expect(store.listE2bSessions()).toEqual([]);
  writeFileSync(join(home, 'short.key'), 'short');
  expect(() => sealedSessions(rows, join(home, 'short.key'))).toThrow(/32-byte/);
});

it("signs as E2B's SDK signs (its getSignature), with and without an expiration", async () => {
  const token = SESSION.accessToken;
  for (const [path, op, user] of [
    ['/tmp/a b+c.txt', 'read', undefined],
    ['', 'write', 'root'],
    ['rel/path', 'write', 'user'],
  ] as const) {
    const plain = await getSignature({ path, operation: op, user, envdAccessToken: token });
    expect(signatureOf(path, op, user ?? '', token)).toBe(plain.signature);
    const timed = await getSignature({ path, operation: op, user, envdAccessToken: token, expirationInSeconds: 60 });
    expect(signatureOf(path, op, user ?? '', token, String(timed.expiration))).toBe(timed.signature);
    expect(signatureOf(path, op, user ?? '', token)).not.toBe(signatureOf(path, op, user ?? '', `${token}0`));
  }
  expect(sameSecret('abc', 'abc')).toBe(true);
  expect(sameSecret('abc', 'abd')).toBe(false);
  expect(sameSecret('abc', 'abcd')).toBe(false);
});
