-- The SQL that the C command (native/cli.c, the `snaplab exec` fast path) runs against state.db,
-- kept here beside migrations.ts so that the one schema and every reader of it are changed together.
-- The build embeds it: native/queries.awk turns each `-- name: NAME` block into a C string
-- SQL_NAME in native/build/queries.h. src/store/native-queries.test.ts prepares every statement
-- against a database migrated by migrations.ts, and checks that native/ has no SQL of its own.
-- Comments and blank lines are dropped; one statement per name, ending with ';'.

-- name: lookup_sandbox
-- ?1: an id or a name (a scenario machine's SCENARIO.MACHINE). The same row Node's getSandbox
-- takes: its id, driver, whether it has a memory limit, and its state.
SELECT id, driver, json_extract(limits, '$.memoryBytes') IS NOT NULL, state FROM sandboxes
WHERE id = ?1 OR name = ?1;
