import type { Command } from 'commander';
import { SnaplabError } from '../errors.js';
import { keyValues } from '../lab/io/exec.js';
import type { SandboxApi, SandboxCount } from '../sdk/api.js';
import { addTraceOption, collect, interruptible, showTrace, withApi, type CommonOptions } from './common.js';
import { printJson, printTable } from './output.js';
import { parsePositiveInt } from '../lab/sizes.js';
import { nextCursor } from '../sdk/paging.js';
import { BulkError, removeMany } from '../sdk/bulk.js';

function age(ts: number): string {
  const s = Math.round((Date.now() - ts) / 1000);
  return s < 120 ? `${s}s` : s < 7200 ? `${Math.round(s / 60)}m` : `${Math.round(s / 3600)}h`;
}

/**
 * ls's NOTE: what a reader should know first (host root), then the init, whether it reaches out
 * (egress), then why it is in its state.
 */
function note(b: SandboxApi): string {
  return [
    b.hostRoot ? 'NO USER NAMESPACE (root inside is host root)' : '',
    b.init === 'systemd' ? 'systemd' : '',
    b.egress ? 'egress' : '',
    b.reason ?? (b.origin ? `from ${b.origin}` : ''),
  ]
    .filter(Boolean)
    .join('; ');
}

interface LsOptions extends CommonOptions {
  label: string[];
  limit?: string;
  after?: string;
  count?: boolean;
}

/** ls's table: one row a sandbox. */
function printRows(all: SandboxApi[]): void {
  printTable(
    ['ID', 'NAME', 'STATE', 'IMAGE', 'STORAGE', 'DRIVER', 'AGE', 'EXPIRES', 'NOTE'],
    all.map((b) => [
      b.id,
      b.name,
      b.state,
      b.image,
      b.storage,
      b.driver,
      age(b.createdAt),
      b.expiresAt === null ? '-' : new Date(b.expiresAt).toISOString(),
      note(b),
    ]),
  );
}

/** `ls --count`: how many, by state, in one line (or one JSON object); no row is printed. */
function printCount(c: SandboxCount, json: boolean | undefined): void {
  if (json) {
    printJson(c);
    return;
  }
  const parts = Object.entries(c.byState)
    .sort(([a], [b]) => (a < b ? -1 : 1))
    .map(([state, n]) => `${n} ${state}`);
  process.stdout.write(
    `${c.total} sandbox${c.total === 1 ? '' : 'es'}${parts.length ? `: ${parts.join(', ')}` : ''}\n`,
  );
}

function registerLs(program: Command): void {
  program
    .command('ls')
    .description('list sandboxes (state checked against the host)')
    .option('--label <k=v>', 'only those with this label (repeatable)', collect, [])
    .option('--limit <n>', 'a page: at most n, oldest first (only the page is checked); the next cursor is printed')
    .option('--after <cursor>', 'the page after this cursor (printed by the page before)')
    .option('--count', 'only how many, by state, in one line')
    .option('--json', 'print JSON')
    .action((o: LsOptions) =>
      withApi(o, async (lab) => {
        if (o.count && (o.limit !== undefined || o.after !== undefined))
          throw new SnaplabError('BAD_INPUT', '--count counts them all: not with --limit or --after', 'drop one');
        const labels = keyValues(o.label, 'label filter', { unique: true });
        // counted where the records are (a daemon's store, or this home's): no list is read
        if (o.count) return printCount(await lab.count({ labels }), o.json);
        const limit = o.limit === undefined ? undefined : parsePositiveInt(o.limit, 'limit');
        const all = await lab.list({ labels, limit, after: o.after });
        const next = nextCursor(all, limit);
        // a page's JSON says its continuation, as other tools' paged lists do (a "next" token beside
        // the items); the whole list stays a bare array
        if (o.json)
          return printJson(
            limit === undefined && o.after === undefined
              ? all.map((b) => b.toJSON())
              : { sandboxes: all.map((b) => b.toJSON()), nextCursor: next ?? null },
          );
        printRows(all);
        if (next !== undefined)
          process.stderr.write(`next page: snaplab ls --limit ${limit}${labelArgs(o.label)} --after ${next}\n`);
      }),
    );
}

const labelArgs = (labels: string[]): string => labels.map((l) => ` --label '${l.replaceAll("'", "'\\''")}'`).join('');

const RM_STOP = {
  first: 'stopping: the removals under way finish, no more begin',
  still: 'still finishing the removals under way',
  left: 'those not removed yet are left: `snaplab ls` shows them, `snaplab rm` removes them',
  error: new SnaplabError('ABORTED', 'the removal was interrupted', 'run it again: one gone already is skipped'),
};

/** how many names `rm` prints before it prints a count instead */
const RM_NAMES_SHOWN = 10;

function registerRm(program: Command): void {
  const rm = program
    .command('rm [sandboxes...]')
    .description('destroy sandboxes: kill their processes, delete their filesystems')
    .option('--all', 'remove every sandbox')
    .option('--label <k=v>', 'remove every sandbox with this label (repeatable: all of them)', collect, [])
    .option('--json', 'print JSON');
  addTraceOption(rm);
  rm.action((names: string[], o: CommonOptions & { all?: boolean; label: string[] }) =>
    withApi(o, async (lab) => {
      const select = o.all || o.label.length > 0;
      if (select === names.length > 0 || (o.all && o.label.length > 0))
        throw new SnaplabError(
          'BAD_INPUT',
          !select
            ? 'which sandboxes?'
            : o.all && o.label.length
              ? '--all or --label, not both'
              : 'give names, or --all / --label, not both',
          'give ids or names, or --all, or --label k=v',
        );
      const skipped: string[] = [];
      const said = (removed: string[]): void => {
        if (o.json) printJson(skipped.length ? { removed, skipped } : { removed });
        else if (removed.length === 0) process.stdout.write('nothing to remove\n');
        // (names given are all said, as the command without Node says them: native/daemon.c)
        else if (!select || removed.length <= RM_NAMES_SHOWN) process.stdout.write(`removed ${removed.join(', ')}\n`);
        else process.stdout.write(`removed ${removed.length} sandboxes\n`);
      };
      if (select) {
        const boxes = await lab.list({ labels: keyValues(o.label, 'label filter', { unique: true }) });
        // ^C: the removals under way finish, no more begin; what was removed is said, failed or not
        const removed = await interruptible(RM_STOP, (signal) =>
          removeMany(lab, boxes, {
            signal,
            onTrace: (t) => showTrace(o, t),
            onSkipped: (name, why) => {
              skipped.push(name);
              if (!o.json) process.stderr.write(`skipped ${name}: ${why.message}\n`);
            },
            ...(o.json ? {} : { onProgress: (p) => void process.stderr.write(`… ${p.done}/${p.total} removed\n`) }),
          }),
        ).catch((e: unknown) => {
          if (e instanceof BulkError && e.removed.length) said(e.removed);
          throw e;
        });
        return said(removed);
      }
      // one after the other, as given: a name that is not there stops the command, and says which
      for (const n of names) showTrace(o, await (await lab.get(n)).destroy());
      said(names);
    }),
  );
}

/** What pause, resume, stop and start say of themselves, and of what they did. */
const STATE_VERBS = {
  pause: { done: 'paused', about: 'freeze every process of a sandbox (cgroup freezer)' },
  resume: { done: 'resumed', about: 'thaw a paused sandbox' },
  stop: {
    done: 'stopped',
    about:
      'stop machines and keep their filesystems: a system machine halts cleanly (killed past a 10 s grace); then start, snapshot or rm',
  },
  start: {
    done: 'started',
    about: 'raise stopped machines again on their filesystems, under the same ids: a fresh boot (new processes)',
  },
} as const;

/** pause, resume, stop and start: one after the other, as given; a daemon's routes of the same names. */
function registerStateVerbs(program: Command): void {
  for (const verb of ['pause', 'resume', 'stop', 'start'] as const) {
    const { done, about } = STATE_VERBS[verb];
    const cmd = program.command(`${verb} <sandboxes...>`).description(about).option('--json', 'print JSON');
    addTraceOption(cmd);
    cmd.action((names: string[], o: CommonOptions) =>
      withApi(o, async (lab) => {
        for (const n of names) {
          const b = await lab.get(n);
          try {
            showTrace(o, await b[verb]());
          } finally {
            b.close(); // a started machine's connection (it keeps running)
          }
        }
        if (o.json) printJson({ [done]: names });
        else process.stdout.write(`${done} ${names.join(', ')}\n`);
      }),
    );
  }
}

/** ls, rm, pause, resume, stop and start: the Lab API's, so also through a daemon (SNAPLAB_HOST). */
export function registerLifecycle(program: Command): void {
  registerLs(program);
  registerRm(program);
  registerStateVerbs(program);
}
