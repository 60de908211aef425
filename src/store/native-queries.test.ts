import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { openDb } from './db.js';

// The C command's SQL (native-queries.sql) is compiled in as native/build/queries.h; the test reads
// that header, made by the same rule as the build's, so what it prepares is what the C command runs.
const ROOT = join(import.meta.dirname, '..', '..');
const NATIVE = join(ROOT, 'native');

function embedded(): Map<string, string> {
  const made = spawnSync('make', ['-s', '-C', NATIVE, 'build/queries.h'], { encoding: 'utf8' });
  expect(made.status, made.stderr).toBe(0);
  const header = readFileSync(join(NATIVE, 'build', 'queries.h'), 'utf8');
  const queries = new Map<string, string>();
  for (const m of header.matchAll(/^#define SQL_(\w+) "((?:[^"\\]|\\.)*)"$/gm))
    queries.set(m[1]!, m[2]!.replace(/\\(.)/g, '$1'));
  return queries;
}

const home = mkdtempSync(join(tmpdir(), 'snaplab-test-native-queries-'));
afterAll(() => rmSync(home, { recursive: true, force: true }));

describe("the C command's SQL (src/store/native-queries.sql)", () => {
  const queries = embedded();
  const cSources = readdirSync(NATIVE)
    .filter((f) => /\.[ch]$/.test(f))
    .map((f) => ({ file: f, text: readFileSync(join(NATIVE, f), 'utf8') }));

  it('has statements, each one used by native/', () => {
    expect(queries.size).toBeGreaterThan(0);
    for (const name of queries.keys())
      expect(
        cSources.some((s) => s.text.includes(`SQL_${name}`)),
        `SQL_${name} is used by no file of native/`,
      ).toBe(true);
  });

  it('prepares every statement against a database migrated by migrations.ts', () => {
    const db = openDb(home);
    try {
      for (const [name, sql] of queries) expect(() => db.prepare(sql), `SQL_${name}: ${sql}`).not.toThrow();
    } finally {
      db.close();
    }
  });

  it('is the only SQL of native/: no statement is written in a C string', () => {
    const sql =
      /"\s*(SELECT\s|INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|REPLACE\s+INTO|WITH\s+\w+\s+AS|PRAGMA\s)/i;
    const found = cSources.flatMap((s) =>
      s.text
        .split('\n')
        .map((line, i) => ({ line, at: `native/${s.file}:${i + 1}` }))
        .filter((l) => sql.test(l.line))
        .map((l) => `${l.at}: ${l.line.trim()}`),
    );
    expect(found).toEqual([]);
  });
});
