/**
 * Schema migrations, applied in order; `PRAGMA user_version` holds how many have run.
 * Never edit a migration that has shipped: append a new one.
 */
// The helpers below write owner_held's migration: like a migration, never edit them once shipped.

/** owner_held's group of sandbox row `s` (its reason kept only when it is dead: a running one's changes with every take) */
const reasonOf = (s: string): string => `CASE WHEN ${s}.state = 'dead' THEN coalesce(${s}.reason, '') ELSE '' END`;

/** Where a sandbox trigger finds the owner of row `row` (OLD or NEW): its sandbox_meta row, with an owner. */
const META_OF = (row: string) => ({
  owner: 'm.owner',
  from: `sandbox_meta m WHERE m.id = ${row}.id AND m.owner IS NOT NULL`,
});
/** Where a sandbox_meta trigger finds the sandbox of row `row` (OLD or NEW), when it has an owner. */
const SANDBOX_OF = (row: string) => ({
  owner: `${row}.owner`,
  from: `sandboxes s WHERE s.id = ${row}.id AND ${row}.owner IS NOT NULL`,
});

/** owner_held counted from the rows themselves: its first fill, and gc's recount (Store.recountOwned). */
export const OWNER_HELD_COUNT = `INSERT INTO owner_held (owner, driver, limits, dead, reason, count)
    SELECT m.owner, s.driver, s.limits, s.state = 'dead', ${reasonOf('s')}, COUNT(*)
    FROM sandbox_meta m JOIN sandboxes s ON s.id = m.id WHERE m.owner IS NOT NULL
    GROUP BY 1, 2, 3, 4, 5;`;

/** A trigger's step: the group of sandbox row `s` counted once more (+1) or once less (-1), if both its rows are there. */
function held(sign: 1 | -1, s: string, at: { owner: string; from: string }): string {
  const group = `${at.owner}, ${s}.driver, ${s}.limits, ${s}.state = 'dead', ${reasonOf(s)}`;
  if (sign > 0)
    return `INSERT INTO owner_held (owner, driver, limits, dead, reason, count) SELECT ${group}, 1 FROM ${at.from}
      ON CONFLICT (owner, driver, limits, dead, reason) DO UPDATE SET count = count + 1;`;
  return `UPDATE owner_held SET count = count - 1 WHERE (owner, driver, limits, dead, reason) IN (SELECT ${group} FROM ${at.from});
    DELETE FROM owner_held WHERE count <= 0 AND owner IN (SELECT ${at.owner} FROM ${at.from});`;
}

export const migrations: string[] = [
  `
  CREATE TABLE images (
    name        TEXT PRIMARY KEY,
    source      TEXT NOT NULL,
    path        TEXT NOT NULL,
    size_bytes  INTEGER NOT NULL,
    created_at  INTEGER NOT NULL
  );
  CREATE TABLE image_volumes (
    image    TEXT NOT NULL REFERENCES images(name) ON DELETE CASCADE,
    storage  TEXT NOT NULL,
    volume   TEXT NOT NULL,
    PRIMARY KEY (image, storage)
  );
  CREATE TABLE sandboxes (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    image       TEXT NOT NULL,
    storage     TEXT NOT NULL,
    driver      TEXT NOT NULL,
    state       TEXT NOT NULL,
    reason      TEXT,
    volume      TEXT,
    pid         INTEGER,
    pid_start   INTEGER,
    limits      TEXT NOT NULL,
    origin      TEXT,
    created_at  INTEGER NOT NULL
  );
  CREATE TABLE snapshots (
    name        TEXT PRIMARY KEY,
    id          TEXT NOT NULL UNIQUE,
    sandbox     TEXT,
    image       TEXT NOT NULL,
    storage     TEXT NOT NULL,
    volume      TEXT NOT NULL,
    limits      TEXT NOT NULL,
    created_at  INTEGER NOT NULL
  );
  CREATE TABLE operations (
    id               TEXT PRIMARY KEY,
    kind             TEXT NOT NULL,
    target           TEXT,
    started_at       INTEGER NOT NULL,
    total_ms         REAL NOT NULL,
    unattributed_ms  REAL NOT NULL,
    status           TEXT NOT NULL,
    error            TEXT,
    phases           TEXT NOT NULL,
    details          TEXT
  );
  CREATE INDEX operations_started ON operations(started_at);
  `,
  `
  CREATE TABLE pools (
    name           TEXT PRIMARY KEY,
    image          TEXT NOT NULL,
    storage        TEXT NOT NULL,
    limits         TEXT NOT NULL,
    target         INTEGER NOT NULL,
    recycle        INTEGER NOT NULL DEFAULT 1,
    hits           INTEGER NOT NULL DEFAULT 0,
    misses         INTEGER NOT NULL DEFAULT 0,
    recycled       INTEGER NOT NULL DEFAULT 0,
    refused_dirty  INTEGER NOT NULL DEFAULT 0,
    leaks          INTEGER NOT NULL DEFAULT 0,
    created_at     INTEGER NOT NULL
  );
  CREATE TABLE inflight (
    id          TEXT PRIMARY KEY,
    pid         INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    started_at  INTEGER NOT NULL
  );
  CREATE TABLE scenarios (
    name        TEXT PRIMARY KEY,
    id          TEXT NOT NULL UNIQUE,
    file        TEXT NOT NULL,
    hash        TEXT NOT NULL,
    spec        TEXT NOT NULL,
    state       TEXT NOT NULL,
    reason      TEXT,
    created_at  INTEGER NOT NULL
  );
  CREATE TABLE scenario_snapshots (
    scenario    TEXT NOT NULL,
    name        TEXT NOT NULL,
    manifest    TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (scenario, name)
  );
  ALTER TABLE sandboxes ADD COLUMN scenario TEXT;
  ALTER TABLE snapshots ADD COLUMN memory TEXT;
  ALTER TABLE sandboxes ADD COLUMN pool TEXT;
  ALTER TABLE sandboxes ADD COLUMN baseline TEXT;
  CREATE INDEX sandboxes_pool ON sandboxes(pool, state);
  `,
  `
  ALTER TABLE snapshots ADD COLUMN driver TEXT;
  `,
  `
  ALTER TABLE pools ADD COLUMN driver TEXT;
  ALTER TABLE pools ADD COLUMN template TEXT;
  `,
  // the first host id of a sandbox's user namespace (NULL: none); two records never share one
  `
  ALTER TABLE sandboxes ADD COLUMN uid_base INTEGER;
  CREATE UNIQUE INDEX sandboxes_uid_base ON sandboxes(uid_base);
  `,
  // a pool's standbys without a user namespace (pool create --no-userns); NULL: wherever allowed
  `
  ALTER TABLE pools ADD COLUMN userns INTEGER;
  `,
  // ranges are claimed host-wide (host/userns/registry.ts); a scenario machine's old and new sandbox
  // share the machine's range during a reset, so the column is not unique
  `
  DROP INDEX IF EXISTS sandboxes_uid_base;
  `,
  // an image's run config (OCI/docker: Env, Cmd, ...), where it came from, and for built images
  // the hash of their inputs (the build cache's key)
  `
  ALTER TABLE images ADD COLUMN config TEXT;
  ALTER TABLE images ADD COLUMN provenance TEXT;
  ALTER TABLE images ADD COLUMN build_key TEXT;
  CREATE INDEX images_build_key ON images(build_key);
  `,
  // system machines: the image's init is PID 1 ('systemd'); NULL: the agent is
  `
  ALTER TABLE sandboxes ADD COLUMN init TEXT;
  ALTER TABLE snapshots ADD COLUMN init TEXT;
  `,
  // the daemon (snaplab serve): labels and metadata of a sandbox, who made it, its lifetime;
  // API keys (only a hash kept); the event log, whose ids a client resumes from
  `
  CREATE TABLE sandbox_meta (
    id          TEXT PRIMARY KEY,
    labels      TEXT NOT NULL,
    metadata    TEXT NOT NULL,
    owner       TEXT,
    timeout_s   INTEGER,
    on_timeout  TEXT,
    expires_at  INTEGER
  );
  CREATE TABLE api_keys (
    name           TEXT PRIMARY KEY,
    hash           TEXT NOT NULL UNIQUE,
    scopes         TEXT NOT NULL,
    max_sandboxes  INTEGER,
    max_execs      INTEGER,
    created_at     INTEGER NOT NULL
  );
  CREATE TABLE events (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       INTEGER NOT NULL,
    type     TEXT NOT NULL,
    sandbox  TEXT,
    name     TEXT,
    reason   TEXT,
    data     TEXT
  );
  `,
  // a failed operation keeps its error's code and hint beside the message (the dashboard shows them)
  `
  ALTER TABLE operations ADD COLUMN error_code TEXT;
  ALTER TABLE operations ADD COLUMN error_hint TEXT;
  `,
  // the owner of a record as data (records.ts Owner), not prose in reason: its pid, its start
  // time, its step; a pool's template VM names its pool. Rows written before carried the owner
  // only in reason ('being created by pid N', 'being removed by pid N', 'taken by pid N',
  // 'template of pool P (held by pid N)', 'being raised by pid N'): parsed here, once. Their
  // start time was never written (NULL: the pid alone is checked for them); a dead row whose
  // creation was interrupted keeps its step with no pid. CAST reads the digits up to the ')'.
  `
  ALTER TABLE sandboxes ADD COLUMN owner_pid INTEGER;
  ALTER TABLE sandboxes ADD COLUMN owner_start INTEGER;
  ALTER TABLE sandboxes ADD COLUMN owner_op TEXT;
  ALTER TABLE sandboxes ADD COLUMN template_of TEXT;
  ALTER TABLE scenarios ADD COLUMN owner_pid INTEGER;
  ALTER TABLE scenarios ADD COLUMN owner_start INTEGER;
  ALTER TABLE scenarios ADD COLUMN owner_op TEXT;
  UPDATE sandboxes SET owner_op = CASE state WHEN 'creating' THEN 'create' ELSE 'remove' END,
    owner_pid = NULLIF(CAST(substr(reason, instr(reason, 'pid ') + 4) AS INTEGER), 0)
    WHERE state IN ('creating', 'removing') AND instr(reason, 'pid ') > 0;
  UPDATE sandboxes SET owner_op = 'hold',
    owner_pid = NULLIF(CAST(substr(reason, instr(reason, 'taken by pid ') + 13) AS INTEGER), 0)
    WHERE state = 'running' AND pool IS NOT NULL AND instr(reason, 'taken by pid ') > 0;
  UPDATE sandboxes SET owner_op = 'hold',
    template_of = substr(reason, 18, instr(reason, ' (held by pid ') - 18),
    owner_pid = NULLIF(CAST(substr(reason, instr(reason, ' (held by pid ') + 14) AS INTEGER), 0)
    WHERE reason LIKE 'template of pool % (held by pid %)';
  UPDATE sandboxes SET owner_op = 'create' WHERE state = 'dead' AND reason LIKE 'creation was interrupted%';
  UPDATE scenarios SET owner_op = CASE state WHEN 'creating' THEN 'create' ELSE 'remove' END,
    owner_pid = NULLIF(CAST(substr(reason, instr(reason, 'pid ') + 4) AS INTEGER), 0)
    WHERE state IN ('creating', 'removing') AND instr(reason, 'pid ') > 0;
  `,
  // an API key's ceilings (lab/ceilings.ts): JSON of those it was made with (null inside: lifted);
  // NULL, and every ceiling not named, is the defaults, so keys made before get them too
  `
  ALTER TABLE api_keys ADD COLUMN ceilings TEXT;
  `,
  // a snapshot's owner: the API key whose sandbox it was taken of (its snapshots ceiling counts them)
  `
  ALTER TABLE snapshots ADD COLUMN owner TEXT;
  `,
  // a scenario's standby copy (records.ts ScenarioStandby, JSON) and whether it wants one
  // (NULL: its file's \`standby\` key decides)
  `
  ALTER TABLE scenarios ADD COLUMN standby TEXT;
  ALTER TABLE scenarios ADD COLUMN standby_wanted INTEGER;
  `,
  // egress (host/net/egress.ts): a machine's lists (JSON) and its slot under the home's router,
  // which gives its address and its names; unique while its record lives
  `
  ALTER TABLE sandboxes ADD COLUMN egress TEXT;
  ALTER TABLE sandboxes ADD COLUMN egress_slot INTEGER;
  CREATE UNIQUE INDEX sandboxes_egress_slot ON sandboxes(egress_slot);
  `,
  // a pool's egress lists (JSON; NULL: its standbys have none)
  `
  ALTER TABLE pools ADD COLUMN egress TEXT;
  `,
  // the E2B front's sessions (src/e2b/sessions.ts): a sandbox's envd access token and the key that
  // drives it, sealed (AES-GCM) with a secret kept beside the db; read by the daemon only, never
  // through the API. Kept so that a daemon restart does not end them
  `
  CREATE TABLE e2b_sessions (
    id          TEXT PRIMARY KEY,
    sealed      TEXT NOT NULL,
    created_at  INTEGER NOT NULL
  );
  `,
  // a user namespace of fewer ids than 65536 (create's \`ids\`; NULL: 65536): the sandbox's, and a
  // snapshot's (a restore keeps the size)
  `
  ALTER TABLE sandboxes ADD COLUMN uid_count INTEGER;
  ALTER TABLE snapshots ADD COLUMN ids INTEGER;
  `,
  // the list's order (sdk/paging.ts: creation time, then id): a page is read from here, only its
  // rows, after its cursor (store.ts pageSandboxes), not every record sorted
  `
  CREATE INDEX IF NOT EXISTS sandboxes_created ON sandboxes(created_at, id);
  `,
  // a sandbox's metadata a row a key (its text values), for a list's metadata filter (store.ts
  // pageSandboxes): a filter few rows pass is read from its index, not walked to through every
  // row's JSON. Kept by triggers from sandbox_meta.metadata, which stays the record: whoever writes
  // that (any process, any version from this one on) keeps this true. (putMeta's INSERT OR REPLACE
  // fires no delete trigger: the insert's first clears the id's rows.)
  `
  CREATE TABLE sandbox_metadata (
    id     TEXT NOT NULL,
    key    TEXT NOT NULL,
    value  TEXT NOT NULL,
    PRIMARY KEY (key, value, id)
  ) WITHOUT ROWID;
  CREATE INDEX sandbox_metadata_id ON sandbox_metadata(id);
  CREATE TRIGGER sandbox_metadata_insert AFTER INSERT ON sandbox_meta BEGIN
    DELETE FROM sandbox_metadata WHERE id = NEW.id;
    INSERT OR IGNORE INTO sandbox_metadata (id, key, value)
      SELECT NEW.id, key, value FROM json_each(NEW.metadata) WHERE type = 'text';
  END;
  CREATE TRIGGER sandbox_metadata_update AFTER UPDATE OF id, metadata ON sandbox_meta BEGIN
    DELETE FROM sandbox_metadata WHERE id = OLD.id;
    INSERT OR IGNORE INTO sandbox_metadata (id, key, value)
      SELECT NEW.id, key, value FROM json_each(NEW.metadata) WHERE type = 'text';
  END;
  CREATE TRIGGER sandbox_metadata_delete AFTER DELETE ON sandbox_meta BEGIN
    DELETE FROM sandbox_metadata WHERE id = OLD.id;
  END;
  INSERT OR IGNORE INTO sandbox_metadata (id, key, value)
    SELECT m.id, j.key, j.value FROM sandbox_meta m, json_each(m.metadata) j WHERE j.type = 'text';
  `,
  // what changed among the sandboxes, for a reader that keeps up (a daemon's tick: Store.sandboxChanges):
  // an insert, a change of state, reason, name or pool, and a delete each take the next seq, one row
  // per sandbox (its last change; gone = 1 once deleted), so a reader asks for what came after the
  // seq it read last instead of every record. Kept by triggers, whoever writes; a deleted sandbox's
  // row is kept for 100 000 changes (a reader further behind reads everything). And the due
  // timeouts, read by their end (Store.expiredSandboxes), not found in every record. watch_marks:
  // where a reader (the daemon's event log) got to, so that a restart reads on from there.
  `
  CREATE TABLE sandbox_changes (
    seq   INTEGER PRIMARY KEY AUTOINCREMENT,
    id    TEXT NOT NULL UNIQUE,
    gone  INTEGER NOT NULL DEFAULT 0
  );
  CREATE INDEX sandbox_changes_gone ON sandbox_changes(seq) WHERE gone = 1;
  CREATE TRIGGER sandbox_changes_insert AFTER INSERT ON sandboxes BEGIN
    INSERT OR REPLACE INTO sandbox_changes (id, gone) VALUES (NEW.id, 0);
  END;
  CREATE TRIGGER sandbox_changes_update AFTER UPDATE OF state, reason, name, pool ON sandboxes BEGIN
    INSERT OR REPLACE INTO sandbox_changes (id, gone) VALUES (NEW.id, 0);
  END;
  CREATE TRIGGER sandbox_changes_delete AFTER DELETE ON sandboxes BEGIN
    INSERT OR REPLACE INTO sandbox_changes (id, gone) VALUES (OLD.id, 1);
    DELETE FROM sandbox_changes WHERE gone = 1 AND seq < (SELECT MAX(seq) FROM sandbox_changes) - 100000;
  END;
  CREATE INDEX sandbox_meta_expires ON sandbox_meta(expires_at);
  CREATE TABLE watch_marks (
    name   TEXT PRIMARY KEY,
    mark   INTEGER NOT NULL,
    again  TEXT NOT NULL
  );
  `,
  // a key's sandboxes found by their owner (a keyed create's quota and ceilings, a keyed list),
  // not by walking every sandbox of the host
  `
  CREATE INDEX sandbox_meta_owner ON sandbox_meta(owner);
  `,
  // what a key's sandboxes hold, kept as they change (Store.ownedLimits): a count of its sandboxes
  // alike (driver, limits, dead or not and why), a few rows a key whatever its count, where a
  // keyed create read every sandbox of the key twice (~0.5 µs each: 4.4 ms a read at 10 000).
  // Which of them hold room (a stop's reasons) is the library's rule, applied to these rows as
  // read. A sandbox counts while both its rows are there with an owner; triggers on both tables
  // keep that, in whichever order the rows are written (putMeta is an upsert: a REPLACE's silent
  // delete would skip the decrement). A writer that REPLACEs anyway (a snaplab from before this,
  // still running) makes it drift: gc counts it again from the rows (Store.recountOwned). And a
  // key's snapshots counted by their owner's index (its snapshots ceiling), not found among every
  // snapshot of the host.
  `
  CREATE TABLE owner_held (
    owner   TEXT NOT NULL,
    driver  TEXT NOT NULL,
    limits  TEXT NOT NULL,
    dead    INTEGER NOT NULL,
    reason  TEXT NOT NULL,
    count   INTEGER NOT NULL,
    PRIMARY KEY (owner, driver, limits, dead, reason)
  ) WITHOUT ROWID;
  CREATE TRIGGER owner_held_sandbox_insert AFTER INSERT ON sandboxes BEGIN
    ${held(+1, 'NEW', META_OF('NEW'))}
  END;
  CREATE TRIGGER owner_held_sandbox_delete AFTER DELETE ON sandboxes BEGIN
    ${held(-1, 'OLD', META_OF('OLD'))}
  END;
  CREATE TRIGGER owner_held_sandbox_update AFTER UPDATE OF id, driver, limits, state, reason ON sandboxes BEGIN
    ${held(-1, 'OLD', META_OF('OLD'))}
    ${held(+1, 'NEW', META_OF('NEW'))}
  END;
  CREATE TRIGGER owner_held_meta_insert AFTER INSERT ON sandbox_meta BEGIN
    ${held(+1, 's', SANDBOX_OF('NEW'))}
  END;
  CREATE TRIGGER owner_held_meta_delete AFTER DELETE ON sandbox_meta BEGIN
    ${held(-1, 's', SANDBOX_OF('OLD'))}
  END;
  CREATE TRIGGER owner_held_meta_update AFTER UPDATE OF id, owner ON sandbox_meta BEGIN
    ${held(-1, 's', SANDBOX_OF('OLD'))}
    ${held(+1, 's', SANDBOX_OF('NEW'))}
  END;
  ${OWNER_HELD_COUNT}
  CREATE INDEX snapshots_owner ON snapshots(owner);
  `,
  // a sandbox's labels and owner are among its changes too (sandbox_meta), so that a reader of the
  // changes (a cluster node's heartbeat: cluster/node.ts) need not read every record to see a
  // relabel. Only when one of them is new: putMeta rewrites the whole row on every timeout change.
  // (A delete and an insert, not INSERT OR REPLACE: putMeta is an upsert, and the conflict clause of
  // the statement that fires a trigger overrides the trigger's own, so REPLACE would fail there.)
  `
  CREATE TRIGGER sandbox_changes_meta_insert AFTER INSERT ON sandbox_meta
    WHEN EXISTS (SELECT 1 FROM sandboxes WHERE id = NEW.id) BEGIN
    DELETE FROM sandbox_changes WHERE id = NEW.id;
    INSERT INTO sandbox_changes (id, gone) VALUES (NEW.id, 0);
  END;
  CREATE TRIGGER sandbox_changes_meta_update AFTER UPDATE OF labels, owner ON sandbox_meta
    WHEN (NEW.labels IS NOT OLD.labels OR NEW.owner IS NOT OLD.owner)
      AND EXISTS (SELECT 1 FROM sandboxes WHERE id = NEW.id) BEGIN
    DELETE FROM sandbox_changes WHERE id = NEW.id;
    INSERT INTO sandbox_changes (id, gone) VALUES (NEW.id, 0);
  END;
  `,
  // what a pool starts in each standby before it waits (lab/pools/runner.ts): 'interpreter', the
  // code interpreter's server and its kernel; null, nothing
  `ALTER TABLE pools ADD COLUMN warm TEXT;`,
  // which server a warm pool's standbys run (interpreter/start.ts interpreterVersion): one warmed
  // by another build of snaplab is raised again, not handed out (lab/pools/runner.ts)
  `ALTER TABLE pools ADD COLUMN warm_version TEXT;`,
  // the server a warm standby runs is its own, not its pool's (one column on the pool could not
  // say which of its standbys another build warmed, nor keep a take from being handed one while
  // they were replaced): a take claims only standbys warmed as its build warms them
  `
  ALTER TABLE sandboxes ADD COLUMN warm_version TEXT;
  UPDATE sandboxes SET warm_version = (SELECT p.warm_version FROM pools p WHERE p.name = sandboxes.pool)
    WHERE pool IS NOT NULL;
  ALTER TABLE pools DROP COLUMN warm_version;
  `,
];
