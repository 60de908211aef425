import { OWNER_HELD_COUNT } from './migrations.js';
import type Database from 'better-sqlite3';
import { DEFAULT_DRIVER } from '../defaults.js';
import type { Db } from './db.js';
import type {
  ApiKeyRecord,
  EventRecord,
  ImageRecord,
  Limits,
  Owner,
  PoolRecord,
  PoolWarm,
  SandboxMeta,
  SandboxEgress,
  SandboxRecord,
  SandboxCount,
  ScenarioRecord,
  ScenarioSnapshotRecord,
  ScenarioStandby,
  Scope,
  SnapshotRecord,
} from './records.js';
import { END_EVENTS, STATE_EVENTS } from './records.js';
import type { TraceSummary } from '../timing/trace.js';
import type { StorageKind, Volume } from '../storage/backend.js';
import type { ImageConfig } from '../image/oci.js';
import type { Provenance } from '../image/import.js';

type Row = Record<string, unknown>;
const json = <T>(v: unknown): T => JSON.parse(v as string) as T;

function toOwner(r: Row): Owner | null {
  if (r.owner_op === null || r.owner_op === undefined) return null;
  return {
    pid: (r.owner_pid as number | null) ?? null,
    start: (r.owner_start as number | null) ?? null,
    op: r.owner_op as Owner['op'],
  };
}
/** An owner's three columns, as named parameters. */
const ownerParams = (
  o: Owner | null | undefined,
): { ownerPid: number | null; ownerStart: number | null; ownerOp: string | null } => ({
  ownerPid: o?.pid ?? null,
  ownerStart: o?.start ?? null,
  ownerOp: o?.op ?? null,
});

/**
 * Run an insert; false when a unique key (a name, an id) is already taken. better-sqlite3 gives
 * the constraint as the error's code: no message is read.
 */
function inserted(run: () => unknown): boolean {
  try {
    run();
    return true;
  } catch (e) {
    const code = (e as { code?: unknown }).code;
    if (code === 'SQLITE_CONSTRAINT_UNIQUE' || code === 'SQLITE_CONSTRAINT_PRIMARYKEY') return false;
    throw e;
  }
}

function toImage(r: Row): ImageRecord {
  return {
    name: r.name as string,
    source: r.source as string,
    path: r.path as string,
    sizeBytes: r.size_bytes as number,
    createdAt: r.created_at as number,
    config: r.config ? json<ImageConfig>(r.config) : null,
    provenance: r.provenance ? json<Provenance>(r.provenance) : null,
    buildKey: (r.build_key as string | null) ?? null,
  };
}

/**
 * The sandboxes table's columns in the order toSandbox reads them. Its rows are read as arrays
 * (better-sqlite3's raw mode), not as objects of 25 named keys: making those cost ~10 times more
 * than the record made from them (measured here: a list of thousands spent most of its time there).
 */
const SANDBOX_COLUMNS = [
  'id',
  'name',
  'image',
  'storage',
  'driver',
  'state',
  'reason',
  'volume',
  'pid',
  'pid_start',
  'limits',
  'origin',
  'created_at',
  'pool',
  'scenario',
  'baseline',
  'uid_base',
  'uid_count',
  'init',
  'owner_pid',
  'owner_start',
  'owner_op',
  'template_of',
  'egress',
  'egress_slot',
];
/** SANDBOX_COLUMNS for a SELECT, each under table alias `t` when one is given */
const sandboxColumns = (t = ''): string => SANDBOX_COLUMNS.map((c) => (t ? `${t}.${c}` : c)).join(', ');

/** A sandbox from its row, read as an array of SANDBOX_COLUMNS (and maybe more after them). */
function toSandbox(a: unknown[]): SandboxRecord {
  const [id, name, image, storage, driver, state, reason, volume, pid, pidStart, limits, origin, createdAt] = a;
  const [pool, scenario, baseline, uidBase, ids, init, ownerPid, ownerStart, ownerOp, templateOf, egress, slot] =
    a.slice(13);
  return {
    id: id as string,
    name: name as string,
    image: image as string,
    storage: storage as StorageKind,
    driver: driver as string,
    state: state as SandboxRecord['state'],
    reason: (reason as string | null) ?? null,
    volume: volume ? json<Volume>(volume) : null,
    pid: (pid as number | null) ?? null,
    pidStart: (pidStart as number | null) ?? null,
    limits: json(limits),
    origin: (origin as string | null) ?? null,
    createdAt: createdAt as number,
    pool: (pool as string | null) ?? null,
    scenario: (scenario as string | null) ?? null,
    baseline: baseline ? json(baseline) : null,
    uidBase: (uidBase as number | null) ?? null,
    ids: (ids as number | null) ?? null,
    init: (init as 'systemd' | null) ?? null,
    owner: toOwner({ owner_pid: ownerPid, owner_start: ownerStart, owner_op: ownerOp }),
    templateOf: (templateOf as string | null) ?? null,
    egress: egress ? { ...json<Omit<SandboxEgress, 'slot'>>(egress), slot: slot as number } : null,
  };
}

function toPool(r: Row): PoolRecord {
  return {
    name: r.name as string,
    image: r.image as string,
    storage: r.storage as StorageKind,
    limits: json(r.limits),
    target: r.target as number,
    recycle: r.recycle === 1,
    hits: r.hits as number,
    misses: r.misses as number,
    recycled: r.recycled as number,
    refusedDirty: r.refused_dirty as number,
    leaks: r.leaks as number,
    createdAt: r.created_at as number,
    // a pool from before the column: the default driver was the only one then
    driver: (r.driver as string | null) ?? DEFAULT_DRIVER,
    userns: r.userns === null || r.userns === undefined ? null : r.userns === 1,
    egress: r.egress ? json<{ allow: string[]; deny: string[] }>(r.egress) : null,
    template: (r.template as string | null) ?? null,
    warm: (r.warm as PoolWarm | null) ?? null,
  };
}

function toScenario(r: Row): ScenarioRecord {
  return {
    name: r.name as string,
    id: r.id as string,
    file: r.file as string,
    hash: r.hash as string,
    spec: json(r.spec),
    state: r.state as ScenarioRecord['state'],
    reason: (r.reason as string | null) ?? null,
    createdAt: r.created_at as number,
    owner: toOwner(r),
    standby: r.standby ? json<ScenarioStandby>(r.standby) : null,
    standbyWanted: r.standby_wanted === null || r.standby_wanted === undefined ? null : r.standby_wanted === 1,
  };
}

export type PoolCounter = 'hits' | 'misses' | 'recycled' | 'refused_dirty' | 'leaks';

function toMeta(r: Row): SandboxMeta {
  return {
    id: r.id as string,
    labels: json(r.labels),
    metadata: json(r.metadata),
    owner: (r.owner as string | null) ?? null,
    timeoutS: (r.timeout_s as number | null) ?? null,
    onTimeout: (r.on_timeout as SandboxMeta['onTimeout']) ?? null,
    expiresAt: (r.expires_at as number | null) ?? null,
  };
}

function toKey(r: Row): ApiKeyRecord {
  return {
    name: r.name as string,
    hash: r.hash as string,
    scopes: (r.scopes as string).split(',').filter(Boolean) as Scope[],
    maxSandboxes: (r.max_sandboxes as number | null) ?? null,
    maxExecs: (r.max_execs as number | null) ?? null,
    ceilings: r.ceilings ? (JSON.parse(r.ceilings as string) as ApiKeyRecord['ceilings']) : {},
    createdAt: r.created_at as number,
  };
}

function toSnapshot(r: Row): SnapshotRecord {
  return {
    name: r.name as string,
    id: r.id as string,
    sandbox: (r.sandbox as string | null) ?? null,
    image: r.image as string,
    storage: r.storage as StorageKind,
    volume: json(r.volume),
    limits: json(r.limits),
    createdAt: r.created_at as number,
    memory: r.memory ? json(r.memory) : null,
    driver: (r.driver as string | null) ?? null,
    init: (r.init as 'systemd' | null) ?? null,
    ids: (r.ids as number | null) ?? null,
    owner: (r.owner as string | null) ?? null,
  };
}

/** What a list reads (Store.pageSandboxes); every filter given must hold. */
export interface SandboxQuery {
  /** every key=value among its labels */
  labels?: Record<string, string>;
  /** for every key, its metadata value is one of these (null: the key is absent) */
  metadata?: Record<string, readonly (string | null)[]>;
  /** made by this API key; null: by none */
  owner?: string | null;
  /**
   * in one of these states (sdk ListState: `stopped` is a dead record whose reason is one of
   * `stoppedReasons`, `dead` every other dead one)
   */
  state?: readonly string[];
  /** the reasons of a stopped record (lab/lifecycle/stopped.ts) */
  stoppedReasons?: readonly string[];
  /** made at or after this time */
  createdSince?: number;
  /** the rows after this one in the order asked (a page's cursor, sdk/paging.ts) */
  after?: { createdAt: number; id: string };
  /** newest first; default oldest first */
  order?: 'asc' | 'desc';
  limit?: number;
}

/**
 * A metadata filter whose values match at most this many rows is read from them (the side table's
 * index, then sorted); one that matches more walks the list's order until it has its page (a page
 * of 100 at 10 000 rows: ~0.5 ms either way, where the other way took up to 17 ms; docs/architecture.md "Density").
 */
const DRIVE_MAX = 1000;

/** A listed sandbox: its record and its labels and lifetime, read together. */
export interface ListedRecord {
  record: SandboxRecord;
  meta: SandboxMeta | null;
}

/** A list's state filter (SandboxQuery.state) as SQL, its arguments after it. */
function stateFilter(states: readonly string[], stopped: readonly string[]): unknown[] {
  const conds: string[] = [];
  const args: unknown[] = [];
  const reasons = stopped.map(() => '?').join(', ');
  const plain = states.filter((x) => x !== 'stopped' && x !== 'dead');
  if (plain.length) {
    conds.push(`s.state IN (${plain.map(() => '?').join(', ')})`);
    args.push(...plain);
  }
  if (states.includes('stopped') && stopped.length) {
    conds.push(`(s.state = 'dead' AND s.reason IN (${reasons}))`);
    args.push(...stopped);
  }
  if (states.includes('dead')) {
    conds.push(
      stopped.length ? `(s.state = 'dead' AND (s.reason IS NULL OR s.reason NOT IN (${reasons})))` : "s.state = 'dead'",
    );
    args.push(...stopped);
  }
  return [conds.length ? `(${conds.join(' OR ')})` : '0', ...args];
}

const quoted = (types: readonly string[]): string => types.map((t) => `'${t}'`).join(', ');
/** Drop the events up to a mark, but each sandbox's newest state-telling one unless an end came after. */
const TRIM_EVENTS = `DELETE FROM events WHERE id <= ? AND id NOT IN (
  SELECT id FROM (
    SELECT MAX(id) AS id, type FROM events
      WHERE sandbox IS NOT NULL AND type IN (${quoted([...STATE_EVENTS, ...END_EVENTS])}) GROUP BY sandbox
  ) WHERE type NOT IN (${quoted(END_EVENTS)}))`;

/** How many changes a removal is kept in sandbox_changes (its migration's trigger says the same). */
const REMOVALS_KEPT = 100_000;

/** What changed among the sandboxes since a mark (Store.sandboxChanges). */
export interface SandboxChanges {
  /** pass it as `since` next time */
  mark: number;
  /** every sandbox was read (no mark given, or one too old): one not among them is gone */
  complete: boolean;
  rows: ListedRecord[];
  /** ids removed since the mark (or asked for again and not there) */
  removed: string[];
}

/** Where a reader of the changes got to, and the ids it wants to read again (Store.watchMark). */
export interface WatchMark {
  mark: number;
  again: string[];
}

/** sandbox_meta's columns after a listed sandbox's SANDBOX_COLUMNS (listedMeta reads them) */
const META_COLUMNS = 'm.id, m.labels, m.metadata, m.owner, m.timeout_s, m.on_timeout, m.expires_at';

/** The labels and lifetime after a listed sandbox's columns; null: it has no sandbox_meta row. */
function listedMeta(a: unknown[]): SandboxMeta | null {
  const [id, labels, metadata, owner, timeoutS, onTimeout, expiresAt] = a.slice(SANDBOX_COLUMNS.length);
  if (id === null || id === undefined) return null;
  return toMeta({ id, labels, metadata, owner, timeout_s: timeoutS, on_timeout: onTimeout, expires_at: expiresAt });
}

/** Typed queries over the state database. The only place that writes SQL. */
export class Store {
  private readonly statements = new Map<string, Database.Statement>();
  /** statements in raw mode (rows as arrays): sandboxes' */
  private readonly arrays = new Map<string, Database.Statement>();

  constructor(readonly db: Db) {}

  /** Prepared once, reused: preparing a statement costs more than running it. */
  private stmt(sql: string): Database.Statement {
    let st = this.statements.get(sql);
    if (!st) this.statements.set(sql, (st = this.db.prepare(sql)));
    return st;
  }

  /** Sandboxes from a statement that selects SANDBOX_COLUMNS first, its rows read as arrays (see there). */
  private sandboxes(sql: string, ...args: unknown[]): unknown[][] {
    let st = this.arrays.get(sql);
    if (!st) this.arrays.set(sql, (st = this.db.prepare(sql).raw(true)));
    return st.all(...args) as unknown[][];
  }

  // images
  getImage(name: string): ImageRecord | undefined {
    const r = this.stmt('SELECT * FROM images WHERE name = ?').get(name) as Row | undefined;
    return r && toImage(r);
  }
  findImageByBuildKey(key: string): ImageRecord | undefined {
    const r = this.stmt('SELECT * FROM images WHERE build_key = ? ORDER BY created_at LIMIT 1').get(key) as
      | Row
      | undefined;
    return r && toImage(r);
  }
  listImages(): ImageRecord[] {
    return (this.stmt('SELECT name FROM images ORDER BY name').all() as Row[]).map(
      (r) => this.getImage(r.name as string)!,
    );
  }
  /** False when an image of that name is already recorded. */
  putImage(i: ImageRecord): boolean {
    return inserted(() =>
      this.stmt(
        'INSERT INTO images (name, source, path, size_bytes, created_at, config, provenance, build_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?)',
      ).run(
        i.name,
        i.source,
        i.path,
        i.sizeBytes,
        i.createdAt,
        i.config ? JSON.stringify(i.config) : null,
        i.provenance ? JSON.stringify(i.provenance) : null,
        i.buildKey ?? null,
      ),
    );
  }
  deleteImage(name: string): void {
    this.stmt('DELETE FROM images WHERE name = ?').run(name);
  }
  getImageVolume(image: string, storage: StorageKind): Volume | undefined {
    const r = this.stmt('SELECT volume FROM image_volumes WHERE image = ? AND storage = ?').get(image, storage) as
      | Row
      | undefined;
    return r && json<Volume>(r.volume);
  }
  listImageVolumes(image?: string): { image: string; storage: StorageKind; volume: Volume }[] {
    const rows = (
      image === undefined
        ? this.stmt('SELECT * FROM image_volumes').all()
        : this.stmt('SELECT * FROM image_volumes WHERE image = ?').all(image)
    ) as Row[];
    return rows.map((r) => ({
      image: r.image as string,
      storage: r.storage as StorageKind,
      volume: json<Volume>(r.volume),
    }));
  }
  putImageVolume(image: string, storage: StorageKind, v: Volume): void {
    this.stmt('INSERT OR REPLACE INTO image_volumes (image, storage, volume) VALUES (?, ?, ?)').run(
      image,
      storage,
      JSON.stringify(v),
    );
  }

  // sandboxes
  getSandbox(idOrName: string): SandboxRecord | undefined {
    const [r] = this.sandboxes(
      `SELECT ${sandboxColumns()} FROM sandboxes WHERE id = ? OR name = ?`,
      idOrName,
      idOrName,
    );
    return r && toSandbox(r);
  }
  /** id and state only: the daemon's check that a sandbox it holds is as it left it */
  sandboxState(idOrName: string): { id: string; state: SandboxRecord['state'] } | undefined {
    return this.stmt('SELECT id, state FROM sandboxes WHERE id = ? OR name = ?').get(idOrName, idOrName) as
      | { id: string; state: SandboxRecord['state'] }
      | undefined;
  }
  /** The names of the first `limit` sandboxes made (a not-found error's hint names a few: the rest are not read). */
  sandboxNames(limit: number): string[] {
    return (this.stmt('SELECT name FROM sandboxes ORDER BY created_at LIMIT ?').all(limit) as { name: string }[]).map(
      (r) => r.name,
    );
  }
  listSandboxes(): SandboxRecord[] {
    return this.sandboxes(`SELECT ${sandboxColumns()} FROM sandboxes ORDER BY created_at`).map(toSandbox);
  }
  /** Those not dead: what a reconcile asks the host about (a dead record is as it stays). */
  unsettledSandboxes(): SandboxRecord[] {
    return this.sandboxes(`SELECT ${sandboxColumns()} FROM sandboxes WHERE state != 'dead' ORDER BY created_at`).map(
      toSandbox,
    );
  }
  /** Of those not dead, what a quick check pass asks the host about first (lab/lifecycle/check.ts). */
  unsettledProbes(): Pick<SandboxRecord, 'id' | 'state' | 'pid' | 'pool' | 'templateOf'>[] {
    return this.stmt(
      "SELECT id, state, pid, pool, template_of AS templateOf FROM sandboxes WHERE state != 'dead'",
    ).all() as Pick<SandboxRecord, 'id' | 'state' | 'pid' | 'pool' | 'templateOf'>[];
  }
  /**
   * Sandboxes with their labels and lifetime (null: no sandbox_meta row), in the list's order
   * (sdk/paging.ts: creation time, then id), filtered and paged here, in
   * one statement: only the rows after the cursor that pass the filters are read, at most
   * `limit`, walking the index on (created_at, id). A page costs the same with 10 or 10 000 rows
   * when its rows are dense in that order (no filter, or one most rows pass).
   */
  pageSandboxes(q: SandboxQuery): ListedRecord[] {
    const { where, args } = this.filtered(q);
    const dir = q.order === 'desc' ? 'DESC' : 'ASC';
    if (q.after) {
      where.unshift(`(s.created_at, s.id) ${q.order === 'desc' ? '<' : '>'} (?, ?)`);
      args.unshift(q.after.createdAt, q.after.id);
    }
    if (q.limit !== undefined) args.push(q.limit);
    const sql = `SELECT ${sandboxColumns('s')}, ${META_COLUMNS} FROM sandboxes s LEFT JOIN sandbox_meta m ON m.id = s.id
      ${where.length ? `WHERE ${where.join(' AND ')}` : ''}
      ORDER BY s.created_at ${dir}, s.id ${dir}${q.limit !== undefined ? ' LIMIT ?' : ''}`;
    return this.sandboxes(sql, ...args).map((a) => ({ record: toSandbox(a), meta: listedMeta(a) }));
  }
  /**
   * How many sandboxes pass a list's filters (its page aside), in all and by state as a list
   * filters it (a dead one whose reason is among `stoppedReasons` is `stopped`): one statement,
   * no row made into a record.
   */
  countSandboxes(q: Omit<SandboxQuery, 'after' | 'order' | 'limit'>, stoppedReasons: readonly string[]): SandboxCount {
    const { where, args } = this.filtered(q);
    const rows = this.stmt(
      `SELECT CASE WHEN s.state = 'dead' AND s.reason IN (SELECT value FROM json_each(?)) THEN 'stopped' ELSE s.state END AS st,
        COUNT(*) AS n FROM sandboxes s LEFT JOIN sandbox_meta m ON m.id = s.id
        ${where.length ? `WHERE ${where.join(' AND ')}` : ''} GROUP BY st`,
    ).all(JSON.stringify(stoppedReasons), ...args) as { st: string; n: number }[];
    return { total: rows.reduce((t, r) => t + r.n, 0), byState: Object.fromEntries(rows.map((r) => [r.st, r.n])) };
  }
  /** A list's filters as SQL conditions over `sandboxes s LEFT JOIN sandbox_meta m`, and their arguments in order. */
  private filtered(q: SandboxQuery): { where: string[]; args: unknown[] } {
    const where: string[] = [];
    const args: unknown[] = [];
    if (q.createdSince !== undefined) {
      where.push('s.created_at >= ?');
      args.push(q.createdSince);
    }
    if (q.state) {
      const [cond, ...stateArgs] = stateFilter(q.state, q.stoppedReasons ?? []);
      where.push(cond as string);
      args.push(...stateArgs);
    }
    if (q.owner === null) where.push('m.owner IS NULL');
    else if (q.owner !== undefined) {
      // `=`, not IS: the join is then an inner one, read from the owner's index (a key's rows only)
      where.push('m.owner = ?');
      args.push(q.owner);
    }
    // (json_each, not a JSON path: a key is compared as it is, whatever characters it holds)
    for (const [k, v] of Object.entries(q.labels ?? {})) {
      where.push('EXISTS (SELECT 1 FROM json_each(m.labels) j WHERE j.key = ? AND j.value = ?)');
      args.push(k, v);
    }
    const meta = Object.entries(q.metadata ?? {});
    const drive = this.drivingFilter(meta);
    // a key's alternatives are one JSON parameter: the statement's text has a shape of its own per
    // number of keys only (each kept prepared), never per number of values a caller sends
    for (const [k, alts] of meta) {
      const values = alts.filter((x): x is string => x !== null);
      const marks = 'SELECT value FROM json_each(?)';
      if (k === drive) {
        // few rows have it: read from them (the side table's primary key), not walked to
        where.push(`s.id IN (SELECT id FROM sandbox_metadata WHERE key = ? AND value IN (${marks}))`);
        args.push(k, JSON.stringify(values));
        continue;
      }
      const has = `EXISTS (SELECT 1 FROM sandbox_metadata x WHERE x.id = s.id AND x.key = ? AND x.value IN (${marks}))`;
      const lacks = 'NOT EXISTS (SELECT 1 FROM sandbox_metadata x WHERE x.id = s.id AND x.key = ?)';
      const conds = [...(values.length ? [has] : []), ...(values.length < alts.length ? [lacks] : [])];
      where.push(conds.length ? `(${conds.join(' OR ')})` : '0');
      if (values.length) args.push(k, JSON.stringify(values));
      if (values.length < alts.length) args.push(k);
    }
    return { where, args };
  }
  /**
   * The metadata filter a page is read from (its key), when one matches at most DRIVE_MAX rows:
   * the one that matches fewest, counted on the side table's index (each count stops past
   * DRIVE_MAX). A filter that also keeps rows without the key cannot be read from.
   */
  private drivingFilter(meta: [string, readonly (string | null)[]][]): string | undefined {
    let best: [string, number] | undefined;
    for (const [k, alts] of meta) {
      if (alts.includes(null) || alts.length === 0) continue;
      const n = (
        this.stmt(
          'SELECT COUNT(*) AS n FROM (SELECT 1 FROM sandbox_metadata WHERE key = ? AND value IN (SELECT value FROM json_each(?)) LIMIT ?)',
        ).get(k, JSON.stringify(alts), DRIVE_MAX + 1) as { n: number }
      ).n;
      if (n <= DRIVE_MAX && (!best || n < best[1])) best = [k, n];
    }
    return best?.[0];
  }
  /**
   * The sandboxes whose record changed after `since` (inserted; its state, reason, name or pool
   * changed: sandbox_changes, kept by triggers whoever writes), with those of `again` however they
   * are, read with their labels and lifetime, in the list's order; the ids of those removed; and
   * the mark to pass next time, all in one read transaction. Without a mark, or with one older than
   * the removals kept (or newer than any: another state.db), every sandbox (`complete`).
   */
  sandboxChanges(since: number | undefined, again: readonly string[] = []): SandboxChanges {
    return this.db.transaction((): SandboxChanges => {
      const mark = (this.stmt('SELECT MAX(seq) AS n FROM sandbox_changes').get() as { n: number | null }).n ?? 0;
      if (since === undefined || since > mark || since < mark - REMOVALS_KEPT)
        return { mark, complete: true, rows: this.pageSandboxes({}), removed: [] };
      const changed = this.stmt('SELECT id FROM sandbox_changes WHERE seq > ?').all(since) as { id: string }[];
      const ids = new Set([...changed.map((c) => c.id), ...again]);
      if (!ids.size) return { mark, complete: false, rows: [], removed: [] };
      const rows = this.sandboxes(
        `SELECT ${sandboxColumns('s')}, ${META_COLUMNS} FROM sandboxes s LEFT JOIN sandbox_meta m ON m.id = s.id
          WHERE s.id IN (SELECT value FROM json_each(?)) ORDER BY s.created_at, s.id`,
        JSON.stringify([...ids]),
      ).map((a) => ({ record: toSandbox(a), meta: listedMeta(a) }));
      const present = new Set(rows.map((r) => r.record.id));
      return { mark, complete: false, rows, removed: [...ids].filter((id) => !present.has(id)) };
    })();
  }
  /** Sandboxes whose timeout's clock (expires_at) ends at or before `by`, soonest first, read by that index. */
  expiredSandboxes(by: number): ListedRecord[] {
    return this.sandboxes(
      `SELECT ${sandboxColumns('s')}, ${META_COLUMNS} FROM sandbox_meta m JOIN sandboxes s ON s.id = m.id
        WHERE m.expires_at <= ? ORDER BY m.expires_at`,
      by,
    ).map((a) => ({ record: toSandbox(a), meta: listedMeta(a) }));
  }
  /** Where the reader `name` of the changes got to (undefined: it has not read them yet). */
  watchMark(name: string): WatchMark | undefined {
    const r = this.stmt('SELECT mark, again FROM watch_marks WHERE name = ?').get(name) as Row | undefined;
    return r && { mark: r.mark as number, again: json<string[]>(r.again) };
  }
  setWatchMark(name: string, m: WatchMark): void {
    this.stmt('INSERT OR REPLACE INTO watch_marks (name, mark, again) VALUES (?, ?, ?)').run(
      name,
      m.mark,
      JSON.stringify(m.again),
    );
  }
  // what gc and a check pass ask of the store now, after their one read of every record: a
  // column or two, not every record made again
  /** ids of the sandboxes that hold a user namespace range */
  sandboxesWithRange(): Set<string> {
    return new Set(this.sandboxes('SELECT id FROM sandboxes WHERE uid_base IS NOT NULL').map((a) => a[0] as string));
  }
  /** the user namespace ranges sandboxes record (first id, ids or null: the default), scenario machines' aside */
  sandboxRanges(): [number, number | null][] {
    return this.sandboxes(
      'SELECT uid_base, uid_count FROM sandboxes WHERE uid_base IS NOT NULL AND scenario IS NULL',
    ) as [number, number | null][];
  }
  /** the egress slots recorded */
  egressSlots(): Set<number> {
    return new Set(
      this.sandboxes('SELECT egress_slot FROM sandboxes WHERE egress_slot IS NOT NULL').map((a) => a[0] as number),
    );
  }
  /** the ids of the volumes sandboxes record */
  sandboxVolumeIds(): string[] {
    return this.sandboxes(
      "SELECT json_extract(volume, '$.id') FROM sandboxes WHERE json_extract(volume, '$.id') IS NOT NULL",
    ).map((a) => a[0] as string);
  }
  /** is any sandbox recorded on this storage? */
  sandboxOn(storage: StorageKind): boolean {
    return this.sandboxes('SELECT 1 FROM sandboxes WHERE storage = ? LIMIT 1', storage).length > 0;
  }
  /** dead records whose owner's step was 'create' (an interrupted create), outside pools and scenarios */
  interruptedCreates(): SandboxRecord[] {
    return this.sandboxes(
      `SELECT ${sandboxColumns()} FROM sandboxes WHERE state = 'dead' AND owner_op = 'create' AND scenario IS NULL AND pool IS NULL ORDER BY created_at`,
    ).map(toSandbox);
  }
  /**
   * False when its name (or id) is already taken. A record with egress is given the lowest free
   * slot in the same write transaction (s.egress.slot is set).
   */
  insertSandbox(s: SandboxRecord): boolean {
    const { owner, egress, ...rest } = s;
    const insert = (): boolean => {
      const slot = egress ? this.freeEgressSlot() : null;
      const ok = this.insertSandboxRow(rest, owner, egress ?? null, slot);
      if (ok && egress && slot !== null) egress.slot = slot;
      return ok;
    };
    return egress ? this.db.transaction(insert).immediate() : insert();
  }
  private freeEgressSlot(): number {
    const row = this.stmt(
      `SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM sandboxes WHERE egress_slot = 1) THEN 1
         ELSE (SELECT MIN(a.egress_slot) + 1 FROM sandboxes a WHERE a.egress_slot IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM sandboxes b WHERE b.egress_slot = a.egress_slot + 1)) END AS slot`,
    ).get() as { slot: number };
    return row.slot;
  }
  private insertSandboxRow(
    rest: Omit<SandboxRecord, 'owner' | 'egress'>,
    owner: SandboxRecord['owner'],
    egress: SandboxEgress | null,
    slot: number | null,
  ): boolean {
    const s = rest;
    return inserted(() =>
      this.stmt(
        `INSERT INTO sandboxes (id, name, image, storage, driver, state, reason, volume, pid, pid_start, limits, origin, created_at, pool, baseline, scenario, uid_base, uid_count, init, owner_pid, owner_start, owner_op, template_of, egress, egress_slot)
         VALUES (@id, @name, @image, @storage, @driver, @state, @reason, @volume, @pid, @pidStart, @limits, @origin, @createdAt, @pool, @baseline, @scenario, @uidBase, @ids, @init, @ownerPid, @ownerStart, @ownerOp, @templateOf, @egress, @egressSlot)`,
      ).run({
        ...rest,
        ...ownerParams(owner),
        egress: egress && JSON.stringify({ allow: egress.allow, deny: egress.deny, mark: egress.mark }),
        egressSlot: slot,
        init: s.init ?? null,
        ids: s.ids ?? null,
        templateOf: s.templateOf ?? null,
        volume: s.volume && JSON.stringify(s.volume),
        limits: JSON.stringify(s.limits),
        baseline: s.baseline && JSON.stringify(s.baseline),
      }),
    );
  }
  updateSandbox(
    id: string,
    patch: Partial<
      Pick<
        SandboxRecord,
        'state' | 'reason' | 'volume' | 'pid' | 'pidStart' | 'pool' | 'baseline' | 'limits' | 'owner' | 'templateOf'
      >
    >,
  ): void {
    const cols: string[] = [];
    const vals: unknown[] = [];
    const map: Record<string, string> = {
      state: 'state',
      reason: 'reason',
      volume: 'volume',
      pid: 'pid',
      pidStart: 'pid_start',
      pool: 'pool',
      baseline: 'baseline',
      limits: 'limits',
      templateOf: 'template_of',
    };
    for (const [k, v] of Object.entries(patch)) {
      if (k === 'owner') {
        const o = ownerParams(v as Owner | null);
        cols.push('owner_pid = ?', 'owner_start = ?', 'owner_op = ?');
        vals.push(o.ownerPid, o.ownerStart, o.ownerOp);
        continue;
      }
      cols.push(`${map[k]} = ?`);
      vals.push((k === 'volume' || k === 'baseline' || k === 'limits') && v ? JSON.stringify(v) : v);
    }
    if (cols.length) this.stmt(`UPDATE sandboxes SET ${cols.join(', ')} WHERE id = ?`).run(...vals, id);
  }
  /** A machine's egress lists (its slot stays). */
  setSandboxEgress(id: string, e: { allow: string[]; deny: string[]; mark: number }): void {
    this.stmt('UPDATE sandboxes SET egress = ? WHERE id = ? AND egress_slot IS NOT NULL').run(
      JSON.stringify({ allow: e.allow, deny: e.deny, mark: e.mark }),
      id,
    );
  }
  renameSandbox(id: string, name: string): void {
    this.stmt('UPDATE sandboxes SET name = ? WHERE id = ?').run(name, id);
  }
  deleteSandbox(id: string): void {
    this.stmt('DELETE FROM sandboxes WHERE id = ?').run(id);
    this.stmt('DELETE FROM sandbox_meta WHERE id = ?').run(id);
    this.stmt('DELETE FROM e2b_sessions WHERE id = ?').run(id);
  }

  // the E2B front's sessions (e2b_sessions), sealed by the front: rows it alone reads
  listE2bSessions(): { id: string; sealed: string }[] {
    return this.stmt('SELECT id, sealed FROM e2b_sessions').all() as { id: string; sealed: string }[];
  }
  putE2bSession(id: string, sealed: string): void {
    this.stmt('INSERT OR REPLACE INTO e2b_sessions (id, sealed, created_at) VALUES (?, ?, ?)').run(
      id,
      sealed,
      Date.now(),
    );
  }
  deleteE2bSession(id: string): void {
    this.stmt('DELETE FROM e2b_sessions WHERE id = ?').run(id);
  }

  // labels, metadata and lifetimes (sandbox_meta); a sandbox without a row has none
  getMeta(id: string): SandboxMeta | undefined {
    const r = this.stmt('SELECT * FROM sandbox_meta WHERE id = ?').get(id) as Row | undefined;
    return r && toMeta(r);
  }
  putMeta(m: SandboxMeta): void {
    this.stmt(
      // an upsert, not a REPLACE: a REPLACE deletes the row it replaces without its delete
      // triggers, and owner_held's would then count the sandbox twice (migrations.ts)
      `INSERT INTO sandbox_meta (id, labels, metadata, owner, timeout_s, on_timeout, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (id) DO UPDATE SET labels = excluded.labels, metadata = excluded.metadata, owner = excluded.owner,
         timeout_s = excluded.timeout_s, on_timeout = excluded.on_timeout, expires_at = excluded.expires_at`,
    ).run(m.id, JSON.stringify(m.labels), JSON.stringify(m.metadata), m.owner, m.timeoutS, m.onTimeout, m.expiresAt);
  }
  /**
   * The sandboxes made with this key and still recorded, as much of each as what they hold needs
   * (lab/ceilings.ts heldBy): their driver, their limits, whether they hold room (all but the dead
   * that were not stopped: a reason of `stoppedReasons`), those alike counted together (`count`).
   * Read from owner_held, the counts that triggers keep as the key's sandboxes change
   * (migrations.ts): a few rows a key, whatever its count or the host's (docs/benchmarks.md).
   */
  ownedLimits(
    owner: string,
    stoppedReasons: readonly string[],
  ): { driver: string; limits: Limits; holdsRoom: boolean; count: number }[] {
    const groups = new Map<string, { driver: string; limits: Limits; holdsRoom: boolean; count: number }>();
    const rows = this.stmt(
      'SELECT driver, limits, dead, reason, count FROM owner_held WHERE owner = ? AND count > 0',
    ).all(owner) as Row[];
    for (const r of rows) {
      const holdsRoom = r.dead === 0 || stoppedReasons.includes(r.reason as string);
      const key = JSON.stringify([r.driver, r.limits, holdsRoom]);
      const g = groups.get(key);
      if (g) g.count += r.count as number;
      else
        groups.set(key, {
          driver: r.driver as string,
          limits: json<Limits>(r.limits),
          holdsRoom,
          count: r.count as number,
        });
    }
    return [...groups.values()];
  }

  /**
   * owner_held counted again from the rows (gc): its triggers keep it, but a writer that REPLACEs a
   * sandbox_meta row (a snaplab from before them, still running) makes it drift. True when it had.
   */
  recountOwned(): boolean {
    const all = (): string => JSON.stringify(this.stmt('SELECT * FROM owner_held ORDER BY 1, 2, 3, 4, 5').all());
    // immediate: a deferred one, which reads first, fails at its write if another process wrote meanwhile
    return this.db
      .transaction(() => {
        const was = all();
        this.db.exec(`DELETE FROM owner_held; ${OWNER_HELD_COUNT}`);
        return all() !== was;
      })
      .immediate();
  }

  /** How many snapshots this key's sandboxes have (its snapshots ceiling), by the owner's index. */
  countSnapshotsOf(owner: string): number {
    return (this.stmt('SELECT COUNT(*) AS n FROM snapshots WHERE owner = ?').get(owner) as { n: number }).n;
  }

  // API keys
  getKeyByHash(hash: string): ApiKeyRecord | undefined {
    const r = this.stmt('SELECT * FROM api_keys WHERE hash = ?').get(hash) as Row | undefined;
    return r && toKey(r);
  }
  listKeys(): ApiKeyRecord[] {
    return (this.stmt('SELECT * FROM api_keys ORDER BY name').all() as Row[]).map(toKey);
  }
  insertKey(k: ApiKeyRecord): void {
    this.stmt(
      'INSERT INTO api_keys (name, hash, scopes, max_sandboxes, max_execs, ceilings, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)',
    ).run(k.name, k.hash, k.scopes.join(','), k.maxSandboxes, k.maxExecs, JSON.stringify(k.ceilings), k.createdAt);
  }
  deleteKey(name: string): boolean {
    return this.stmt('DELETE FROM api_keys WHERE name = ?').run(name).changes > 0;
  }

  /**
   * The event log: ids only grow. Past the newest `keep` events, the older are dropped, but for
   * each sandbox not ended its newest event that told its state (STATE_EVENTS): a restart rebuilds
   * from them what the log last told of every sandbox, so one made 10 000 events ago still has its
   * removal told (a `destroyed`), and a change of it is not told as a creation. What is kept past
   * `keep` is one row a sandbox that is there.
   */
  appendEvent(e: Omit<EventRecord, 'id'>, keep = 10_000): EventRecord {
    const id = Number(
      this.stmt('INSERT INTO events (at, type, sandbox, name, reason, data) VALUES (?, ?, ?, ?, ?, ?)').run(
        e.at,
        e.type,
        e.sandbox,
        e.name,
        e.reason,
        e.data ? JSON.stringify(e.data) : null,
      ).lastInsertRowid,
    );
    if (id % 1000 === 0) this.stmt(TRIM_EVENTS).run(id - keep);
    return { ...e, id };
  }
  eventsAfter(id: number, limit = 1000): EventRecord[] {
    return (this.stmt('SELECT * FROM events WHERE id > ? ORDER BY id LIMIT ?').all(id, limit) as Row[]).map((r) => ({
      id: r.id as number,
      at: r.at as number,
      type: r.type as string,
      sandbox: (r.sandbox as string | null) ?? null,
      name: (r.name as string | null) ?? null,
      reason: (r.reason as string | null) ?? null,
      data: r.data ? json(r.data) : null,
    }));
  }
  lastEventId(): number {
    return (this.stmt('SELECT MAX(id) AS id FROM events').get() as { id: number | null }).id ?? 0;
  }

  // pools
  getPool(name: string): PoolRecord | undefined {
    const r = this.stmt('SELECT * FROM pools WHERE name = ?').get(name) as Row | undefined;
    return r && toPool(r);
  }
  listPools(): PoolRecord[] {
    return (this.stmt('SELECT * FROM pools ORDER BY name').all() as Row[]).map(toPool);
  }
  insertPool(p: PoolRecord): void {
    this.stmt(
      'INSERT INTO pools (name, image, storage, limits, target, recycle, created_at, driver, userns, egress, warm) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
    ).run(
      p.name,
      p.image,
      p.storage,
      JSON.stringify(p.limits),
      p.target,
      p.recycle ? 1 : 0,
      p.createdAt,
      p.driver,
      p.userns === null ? null : p.userns ? 1 : 0,
      p.egress ? JSON.stringify(p.egress) : null,
      p.warm ?? null,
    );
  }
  setPoolTemplate(name: string, template: string | null): void {
    this.stmt('UPDATE pools SET template = ? WHERE name = ?').run(template, name);
  }
  setPoolTarget(name: string, target: number): void {
    this.stmt('UPDATE pools SET target = ? WHERE name = ?').run(target, name);
  }
  countPool(name: string, counter: PoolCounter, by = 1): void {
    this.stmt(`UPDATE pools SET ${counter} = ${counter} + ? WHERE name = ?`).run(by, name);
  }
  deletePool(name: string): void {
    this.stmt('DELETE FROM pools WHERE name = ?').run(name);
  }
  /** How many members of the pool are in each state. */
  poolCounts(name: string): Record<string, number> {
    const rows = this.stmt('SELECT state, COUNT(*) AS n FROM sandboxes WHERE pool = ? GROUP BY state').all(name) as {
      state: string;
      n: number;
    }[];
    return Object.fromEntries(rows.map((r) => [r.state, r.n]));
  }
  /**
   * The holders (pids) of the pool's members being raised by a process other than `pid`: those
   * creating, and those running with a reason that starts with `raising` (a standby not yet handed
   * over: lab/pools/runner.ts). One row each; a handful at most.
   */
  poolRaisingHolders(name: string, pid: number, raising: string): number[] {
    return (
      this.stmt(
        `SELECT owner_pid AS pid FROM sandboxes WHERE pool = ? AND owner_pid IS NOT NULL AND owner_pid != ?
           AND (state = 'creating' OR (state = 'running' AND substr(reason, 1, length(?)) = ?))`,
      ).all(name, pid, raising, raising) as { pid: number }[]
    ).map((r) => r.pid);
  }
  poolMembers(name: string): SandboxRecord[] {
    return this.sandboxes(`SELECT ${sandboxColumns()} FROM sandboxes WHERE pool = ? ORDER BY created_at`, name).map(
      toSandbox,
    );
  }
  /**
   * Mark a sandbox dead only if its record is still as `seen` (state and reason): another process
   * may have moved it on (a create that finished, an rm) since it was read. True when it was marked.
   * Its owner stays: the step it died in (an interrupted create is told by it).
   */
  markDead(seen: Pick<SandboxRecord, 'id' | 'state' | 'reason'>, reason: string): boolean {
    const r = this.stmt(
      `UPDATE sandboxes SET state = 'dead', reason = ? WHERE id = ? AND state = ? AND reason IS ?`,
    ).run(reason, seen.id, seen.state, seen.reason);
    return r.changes === 1;
  }

  /** A dead sandbox whose processes are all gone gives its user namespace range back. */
  clearUidBase(id: string): void {
    this.stmt(`UPDATE sandboxes SET uid_base = NULL WHERE id = ? AND state = 'dead'`).run(id);
  }

  /** Set a dead record's reason, unless another process has moved it on (an rm began) meanwhile. */
  setDeadReason(id: string, reason: string): void {
    this.stmt(`UPDATE sandboxes SET reason = ? WHERE id = ? AND state = 'dead'`).run(reason, id);
  }

  /**
   * Take one paused standby of the pool, atomically across processes: the UPDATE marks it
   * running (taken) in the same statement that finds it, so two takers never get the same one.
   * `warm`: only a standby warmed so (its warm_version; null: one warmed with nothing), where a
   * taker asks; omitted, any (a trim's).
   */
  claimStandby(pool: string, reason: string, holder: Owner, warm?: string | null): SandboxRecord | undefined {
    const o = ownerParams(holder);
    const [r] = this.sandboxes(
      `UPDATE sandboxes SET state = 'running', reason = ?, owner_pid = ?, owner_start = ?, owner_op = ?
         WHERE id = (SELECT id FROM sandboxes WHERE pool = ? AND state = 'paused'${warm === undefined ? '' : ' AND warm_version IS ?'}
           ORDER BY created_at LIMIT 1)
         RETURNING ${sandboxColumns()}`,
      reason,
      o.ownerPid,
      o.ownerStart,
      o.ownerOp,
      pool,
      ...(warm === undefined ? [] : [warm]),
    );
    return r && toSandbox(r);
  }

  /** What a warm standby runs (interpreter/start.ts interpreterVersion), set before it is paused. */
  setWarmVersion(id: string, version: string): void {
    this.stmt('UPDATE sandboxes SET warm_version = ? WHERE id = ?').run(version, id);
  }

  /** The pool's paused standbys warmed so (`IS`: null matches those warmed with nothing). */
  poolReady(pool: string, warm: string | null): number {
    return (
      this.stmt("SELECT COUNT(*) AS n FROM sandboxes WHERE pool = ? AND state = 'paused' AND warm_version IS ?").get(
        pool,
        warm,
      ) as { n: number }
    ).n;
  }

  /** The pool's paused standbys warmed otherwise than `warm` (by another build of snaplab). */
  poolStale(pool: string, warm: string | null): SandboxRecord[] {
    return this.sandboxes(
      `SELECT ${sandboxColumns()} FROM sandboxes WHERE pool = ? AND state = 'paused' AND warm_version IS NOT ?`,
      pool,
      warm,
    ).map(toSandbox);
  }

  /**
   * Take a sandbox for removal if it is still as it was read (same state and reason): one caller
   * wins, so a leak found by two reapers at once is removed and counted once.
   */
  claimRemoval(s: { id: string; state: string; reason: string | null }, remover: Owner): boolean {
    const o = ownerParams(remover);
    const r = this.stmt(
      `UPDATE sandboxes SET state = 'removing', reason = ?, owner_pid = ?, owner_start = ?, owner_op = ?
         WHERE id = ? AND state = ? AND reason IS ?`,
    ).run(`being removed by pid ${o.ownerPid}`, o.ownerPid, o.ownerStart, o.ownerOp, s.id, s.state, s.reason);
    return r.changes === 1;
  }

  // scenarios
  getScenario(name: string): ScenarioRecord | undefined {
    const r = this.stmt('SELECT * FROM scenarios WHERE name = ?').get(name) as Row | undefined;
    return r && toScenario(r);
  }
  listScenarios(): ScenarioRecord[] {
    return (this.stmt('SELECT * FROM scenarios ORDER BY created_at').all() as Row[]).map(toScenario);
  }
  insertScenario(x: ScenarioRecord): void {
    const o = ownerParams(x.owner);
    this.stmt(
      'INSERT INTO scenarios (name, id, file, hash, spec, state, reason, created_at, owner_pid, owner_start, owner_op) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
    ).run(
      x.name,
      x.id,
      x.file,
      x.hash,
      JSON.stringify(x.spec),
      x.state,
      x.reason,
      x.createdAt,
      o.ownerPid,
      o.ownerStart,
      o.ownerOp,
    );
  }
  /** `owner`: the process that now takes it through this state (null: none, as once up or failed). */
  setScenarioState(
    name: string,
    state: ScenarioRecord['state'],
    reason: string | null = null,
    owner: Owner | null = null,
  ): void {
    const o = ownerParams(owner);
    this.stmt(
      'UPDATE scenarios SET state = ?, reason = ?, owner_pid = ?, owner_start = ?, owner_op = ? WHERE name = ?',
    ).run(state, reason, o.ownerPid, o.ownerStart, o.ownerOp, name);
  }
  setScenarioStandby(name: string, standby: ScenarioStandby | null): void {
    this.stmt('UPDATE scenarios SET standby = ? WHERE name = ?').run(standby ? JSON.stringify(standby) : null, name);
  }
  /**
   * Set a scenario's standby only if it is still what `expect` says (its state and worker pid):
   * a worker whose raise was cancelled meanwhile must not write over its canceller. One
   * transaction, so two processes cannot both see the old value.
   */
  updateScenarioStandby(
    name: string,
    expect: (now: ScenarioStandby | null) => boolean,
    next: ScenarioStandby | null,
  ): boolean {
    return this.db
      .transaction(() => {
        const r = this.stmt('SELECT standby FROM scenarios WHERE name = ?').get(name) as Row | undefined;
        if (!r || !expect(r.standby ? json<ScenarioStandby>(r.standby) : null)) return false;
        this.setScenarioStandby(name, next);
        return true;
      })
      .immediate();
  }
  setScenarioStandbyWanted(name: string, wanted: boolean | null): void {
    this.stmt('UPDATE scenarios SET standby_wanted = ? WHERE name = ?').run(
      wanted === null ? null : wanted ? 1 : 0,
      name,
    );
  }
  /** Rename several sandboxes at once (a swap): all or none. Each pair: id, new name. */
  renameSandboxes(pairs: [string, string][]): void {
    this.db.transaction(() => {
      // through a free name first: two records may trade names
      for (const [id] of pairs) this.renameSandbox(id, `~swap~${id}`);
      for (const [id, name] of pairs) this.renameSandbox(id, name);
    })();
  }
  deleteScenario(name: string): void {
    this.stmt('DELETE FROM scenario_snapshots WHERE scenario = ?').run(name);
    this.stmt('DELETE FROM scenarios WHERE name = ?').run(name);
  }
  scenarioMachines(name: string): SandboxRecord[] {
    return this.sandboxes(`SELECT ${sandboxColumns()} FROM sandboxes WHERE scenario = ? ORDER BY created_at`, name).map(
      toSandbox,
    );
  }
  putScenarioSnapshot(x: ScenarioSnapshotRecord): void {
    this.stmt('INSERT INTO scenario_snapshots (scenario, name, manifest, created_at) VALUES (?, ?, ?, ?)').run(
      x.scenario,
      x.name,
      JSON.stringify(x.manifest),
      x.createdAt,
    );
  }
  getScenarioSnapshot(scenario: string, name: string): ScenarioSnapshotRecord | undefined {
    const r = this.stmt('SELECT * FROM scenario_snapshots WHERE scenario = ? AND name = ?').get(scenario, name) as
      | Row
      | undefined;
    return (
      r && {
        scenario: r.scenario as string,
        name: r.name as string,
        manifest: json(r.manifest),
        createdAt: r.created_at as number,
      }
    );
  }
  listScenarioSnapshots(scenario: string): ScenarioSnapshotRecord[] {
    return (
      this.stmt('SELECT * FROM scenario_snapshots WHERE scenario = ? ORDER BY created_at').all(scenario) as Row[]
    ).map((r) => ({
      scenario: r.scenario as string,
      name: r.name as string,
      manifest: json(r.manifest),
      createdAt: r.created_at as number,
    }));
  }
  deleteScenarioSnapshot(scenario: string, name: string): void {
    this.stmt('DELETE FROM scenario_snapshots WHERE scenario = ? AND name = ?').run(scenario, name);
  }

  // operations that are making volumes: gc must not take what they have not recorded yet
  beginInflight(id: string, kind: string): void {
    this.stmt('INSERT INTO inflight (id, pid, kind, started_at) VALUES (?, ?, ?, ?)').run(
      id,
      process.pid,
      kind,
      Date.now(),
    );
  }
  endInflight(id: string): void {
    this.stmt('DELETE FROM inflight WHERE id = ?').run(id);
  }
  listInflight(): { id: string; pid: number; kind: string; startedAt: number }[] {
    return (this.stmt('SELECT * FROM inflight').all() as Row[]).map((r) => ({
      id: r.id as string,
      pid: r.pid as number,
      kind: r.kind as string,
      startedAt: r.started_at as number,
    }));
  }

  // snapshots
  getSnapshot(name: string): SnapshotRecord | undefined {
    const r = this.stmt('SELECT * FROM snapshots WHERE name = ? OR id = ?').get(name, name) as Row | undefined;
    return r && toSnapshot(r);
  }
  /** The names of the first `limit` snapshots taken (for a hint, as sandboxNames). */
  snapshotNames(limit: number): string[] {
    return (this.stmt('SELECT name FROM snapshots ORDER BY created_at LIMIT ?').all(limit) as { name: string }[]).map(
      (r) => r.name,
    );
  }
  listSnapshots(): SnapshotRecord[] {
    return (this.stmt('SELECT * FROM snapshots ORDER BY created_at').all() as Row[]).map(toSnapshot);
  }
  /** False when a snapshot of that name (or id) is already recorded. */
  insertSnapshot(s: SnapshotRecord): boolean {
    return inserted(() =>
      this.stmt(
        'INSERT INTO snapshots (name, id, sandbox, image, storage, volume, limits, created_at, memory, driver, init, owner, ids) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
      ).run(
        s.name,
        s.id,
        s.sandbox,
        s.image,
        s.storage,
        JSON.stringify(s.volume),
        JSON.stringify(s.limits),
        s.createdAt,
        s.memory ? JSON.stringify(s.memory) : null,
        s.driver ?? null,
        s.init ?? null,
        s.owner ?? null,
        s.ids ?? null,
      ),
    );
  }
  deleteSnapshot(name: string): void {
    this.stmt('DELETE FROM snapshots WHERE name = ?').run(name);
  }

  // operations (traces)
  putOperation(t: TraceSummary, details?: unknown): void {
    this.stmt(
      `INSERT OR REPLACE INTO operations (id, kind, target, started_at, total_ms, unattributed_ms, status, error, error_code, error_hint, phases, details)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
    ).run(
      t.id,
      t.kind,
      t.target,
      t.startedAt,
      t.totalMs,
      t.unattributedMs,
      t.status,
      t.error,
      t.errorCode ?? null,
      t.errorHint ?? null,
      JSON.stringify(t.phases),
      details === undefined ? null : JSON.stringify(details),
    );
  }
  getOperation(id: string): (TraceSummary & { details: unknown }) | undefined {
    const r = this.stmt('SELECT * FROM operations WHERE id = ?').get(id) as Row | undefined;
    return r && rowToOperation(r);
  }
  /**
   * A target's operations of these kinds stored after `cursor` (the order they were stored in,
   * which is the order they ended: a slow one that started first is not passed over), oldest
   * first, with the cursor to ask from next. Without a cursor: those that started after `since`.
   */
  operationsStored(
    target: string,
    kinds: string[],
    from: { cursor: number } | { since: number },
    limit = 5000,
  ): { next: number; ops: (TraceSummary & { details: unknown })[] } {
    // (lists as one JSON parameter: one prepared statement whatever their length)
    const k = JSON.stringify(kinds);
    const rows = (
      'cursor' in from
        ? this.stmt(
            'SELECT rowid AS seq, * FROM operations WHERE rowid > ? AND target = ? AND kind IN (SELECT value FROM json_each(?)) ORDER BY rowid LIMIT ?',
          ).all(from.cursor, target, k, limit)
        : this.stmt(
            'SELECT rowid AS seq, * FROM operations WHERE started_at > ? AND target = ? AND kind IN (SELECT value FROM json_each(?)) ORDER BY rowid LIMIT ?',
          ).all(from.since, target, k, limit)
    ) as Row[];
    const last =
      rows.length === limit
        ? (rows.at(-1)!.seq as number)
        : ((this.stmt('SELECT max(rowid) AS m FROM operations').get() as { m: number | null }).m ?? 0);
    return { next: Math.max(last, 'cursor' in from ? from.cursor : 0), ops: rows.map(rowToOperation) };
  }
  listOperations(limit = 20, targets?: string[]): (TraceSummary & { details: unknown })[] {
    if (targets) {
      if (!targets.length) return [];
      return (
        this.stmt(
          'SELECT * FROM operations WHERE target IN (SELECT value FROM json_each(?)) ORDER BY started_at DESC LIMIT ?',
        ).all(JSON.stringify(targets), limit) as Row[]
      ).map(rowToOperation);
    }
    return (this.stmt('SELECT * FROM operations ORDER BY started_at DESC LIMIT ?').all(limit) as Row[]).map(
      rowToOperation,
    );
  }
}

function rowToOperation(r: Row): TraceSummary & { details: unknown } {
  return {
    id: r.id as string,
    kind: r.kind as string,
    target: (r.target as string | null) ?? null,
    startedAt: r.started_at as number,
    totalMs: r.total_ms as number,
    unattributedMs: r.unattributed_ms as number,
    status: r.status as 'ok' | 'error',
    error: (r.error as string | null) ?? null,
    ...(r.error
      ? { errorCode: (r.error_code as string | null) ?? null, errorHint: (r.error_hint as string | null) ?? null }
      : {}),
    phases: json(r.phases),
    details: r.details ? json(r.details) : null,
  };
}
