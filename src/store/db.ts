import type DatabaseModule from 'better-sqlite3';
import { mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { migrations } from './migrations.js';
import { SnaplabError } from '../errors.js';

export type Db = DatabaseModule.Database;

// required, not imported: Node's ESM import of this CommonJS addon parses its source for exports
// and `bindings` then searches a dozen paths for the .node file; naming the binding directly takes
// ~8 ms instead of ~20 ms of every command's start (measured on Node 20 here)
const require = createRequire(import.meta.url);
const Database = require('better-sqlite3') as typeof DatabaseModule;
const nativeBinding = require.resolve('better-sqlite3/build/Release/better_sqlite3.node');

/**
 * Open (creating if needed) the state database under `home` and run pending migrations.
 * WAL and a busy timeout let several CLI processes share it.
 */
export function openDb(home: string): Db {
  mkdirSync(home, { recursive: true, mode: 0o700 });
  const db = new Database(join(home, 'state.db'), { nativeBinding });
  // first: another process opening a new home at once holds the locks the next steps need
  db.pragma('busy_timeout = 10000');
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = NORMAL');
  db.pragma('foreign_keys = ON');
  // a statement's temporary tables in memory: with the default (a temporary file, opened lazily), a
  // write whose triggers or RETURNING need one set up and tore down a temporary pager and its page
  // cache each time (~1 ms of malloc, brk and page faults on this host; 0.1 ms in memory: a pool
  // take's claim went 1.9 → 0.3 ms). They are small here: a page of records, a sort of a list
  db.pragma('temp_store = MEMORY');
  migrate(db);
  return db;
}

function migrate(db: Db): void {
  const current = db.pragma('user_version', { simple: true }) as number;
  if (current > migrations.length) {
    throw new SnaplabError(
      'STATE_TOO_NEW',
      `state.db has schema version ${current}, newer than this snaplab knows (${migrations.length})`,
      'a newer snaplab wrote this home: upgrade snaplab, or give another SNAPLAB_HOME',
    );
  }
  for (let v = current; v < migrations.length; v++) {
    db.transaction(() => {
      // another process may have taken this step since `current` was read (two commands on a new
      // home at once: "table images already exists")
      if ((db.pragma('user_version', { simple: true }) as number) > v) return;
      db.exec(migrations[v]!);
      db.pragma(`user_version = ${v + 1}`);
    }).immediate();
  }
}
