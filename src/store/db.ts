import Database from 'better-sqlite3';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { migrations } from './migrations.js';

export type Db = Database.Database;

/**
 * Open (creating if needed) the state database under `home` and run pending migrations.
 * WAL and a busy timeout let several CLI processes share it.
 */
export function openDb(home: string): Db {
  mkdirSync(home, { recursive: true, mode: 0o700 });
  const db = new Database(join(home, 'state.db'));
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = NORMAL');
  db.pragma('busy_timeout = 10000');
  db.pragma('foreign_keys = ON');
  migrate(db);
  return db;
}

function migrate(db: Db): void {
  const current = db.pragma('user_version', { simple: true }) as number;
  if (current > migrations.length) {
    throw new Error(
      `state.db has schema version ${current}, newer than this snaplab knows (${migrations.length}): upgrade snaplab`,
    );
  }
  for (let v = current; v < migrations.length; v++) {
    db.transaction(() => {
      db.exec(migrations[v]!);
      db.pragma(`user_version = ${v + 1}`);
    }).immediate();
  }
}
