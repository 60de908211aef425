/**
 * The CLI as a client of a daemon: with SNAPLAB_HOST (or --host) set, these commands go through
 * the daemon's API (the remote library) instead of the embedded lab; the rest say they need a
 * local lab. Output and exit codes are those of the embedded commands.
 */
import type { Command } from 'commander';
import type { RemoteLab, RemoteSandbox } from '../client/remote.js';
import { addLimitOptions, limitsFrom, type LimitOptions } from './limits.js';
import { EXIT_USAGE, printJson, printTable, reportError } from './output.js';
import { SnaplabError } from '../errors.js';
import { keyValues } from '../lab/exec.js';
import { registerExec, registerShell, type Opener } from './exec.js';

/** The commands a daemon serves; every other one needs the embedded lab. */
export const REMOTE_COMMANDS = ['ls', 'create', 'rm', 'exec', 'shell', 'pause', 'resume', 'snapshot', 'restore'];

async function withRemote(
  o: { json?: boolean },
  body: (lab: RemoteLab) => Promise<number | void>,
  failureCode = EXIT_USAGE,
): Promise<void> {
  let lab: RemoteLab | undefined;
  try {
    // the remote library alone: the embedded lab (drivers, storage, SQLite) is not loaded
    const { RemoteLab } = await import('../client/remote.js');
    lab = new RemoteLab();
    process.exitCode = (await body(lab)) ?? 0;
  } catch (e) {
    reportError(e, !!o.json);
    process.exitCode = failureCode;
  } finally {
    lab?.close();
  }
}

const collectKv = (v: string, prev: string[]): string[] => [...prev, v];

const labelsFrom = (kvs: string[]): Record<string, string> => keyValues(kvs, 'label');

function printBox(box: RemoteSandbox, json?: boolean): void {
  if (json) printJson(box.toJSON());
  else process.stdout.write(`${box.name}\n`);
}

export function registerRemote(program: Command, invoked: string | undefined): void {
  if (invoked !== undefined && !REMOTE_COMMANDS.includes(invoked) && !invoked.startsWith('-') && invoked !== 'help') {
    program
      .command(invoked, { hidden: true })
      .allowUnknownOption()
      .allowExcessArguments()
      .action(() => {
        reportError(
          new SnaplabError(
            'BAD_INPUT',
            `\`snaplab ${invoked}\` runs on the embedded lab, not through a daemon`,
            `the daemon (SNAPLAB_HOST=${process.env.SNAPLAB_HOST}) serves: ${REMOTE_COMMANDS.join(', ')}; unset SNAPLAB_HOST to run it here`,
          ),
          false,
        );
        process.exitCode = EXIT_USAGE;
      });
    return;
  }
  program
    .command('ls')
    .description('list sandboxes (through the daemon)')
    .option('--label <k=v>', 'only those with this label (repeatable)', collectKv, [])
    .option('--json', 'print JSON')
    .action((o: { json?: boolean; label: string[] }) =>
      withRemote(o, async (lab) => {
        const all = await lab.list({ labels: labelsFrom(o.label) });
        if (o.json) return printJson(all.map((b) => b.toJSON()));
        printTable(
          ['ID', 'NAME', 'STATE', 'IMAGE', 'DRIVER', 'EXPIRES', 'NOTE'],
          all.map((b) => [
            b.id,
            b.name,
            b.state,
            b.image,
            b.driver,
            (b.info.expiresAt as string | null) ?? '-',
            (b.info.reason as string | null) ?? '',
          ]),
        );
      }),
    );

  addLimitOptions(
    program
      .command('create')
      .description('create a sandbox (through the daemon)')
      .option('--image <name>', 'image to start from', 'busybox')
      .option('--name <name>', 'a name for the sandbox')
      .option('--pool <name>', 'take a ready standby of this pool')
      .option('--label <k=v>', 'a label (repeatable)', collectKv, [])
      .option('--timeout <s>', "its TTL in seconds (0: none; default: the daemon's)")
      .option('--on-timeout <what>', 'kill or pause at the end of its TTL', 'kill')
      .option('--json', 'print the sandbox as JSON'),
  ).action(
    (
      o: LimitOptions & {
        image: string;
        name?: string;
        pool?: string;
        label: string[];
        timeout?: string;
        onTimeout: string;
        json?: boolean;
      },
    ) =>
      withRemote(o, async (lab) => {
        const limits = limitsFrom(o);
        const box = await lab.create({
          ...(o.pool
            ? { pool: o.pool }
            : { image: o.image, name: o.name, ...(Object.keys(limits).length ? { limits } : {}) }),
          labels: labelsFrom(o.label),
          ...(o.timeout !== undefined ? { timeoutS: Number(o.timeout) } : {}),
          onTimeout: o.onTimeout as 'kill' | 'pause',
        } as never);
        printBox(box, o.json);
      }),
  );

  program
    .command('rm')
    .description('destroy sandboxes (through the daemon)')
    .argument('[sandboxes...]')
    .option('--all', 'remove every sandbox')
    .option('--json', 'print JSON')
    .action((names: string[], o: { all?: boolean; json?: boolean }) =>
      withRemote(o, async (lab) => {
        if (!o.all && !names.length)
          throw new SnaplabError('BAD_INPUT', 'no sandbox given', 'name one or more, or use --all');
        const targets = o.all ? (await lab.list()).map((b) => b.name) : names;
        for (const n of targets) await (await lab.get(n)).destroy();
        if (o.json) printJson({ removed: targets });
        else process.stdout.write(targets.length ? `removed ${targets.join(', ')}\n` : 'nothing to remove\n');
      }),
    );

  for (const verb of ['pause', 'resume'] as const) {
    program
      .command(verb)
      .description(`${verb} sandboxes (through the daemon)`)
      .argument('<sandboxes...>')
      .option('--json', 'print JSON')
      .action((names: string[], o: { json?: boolean }) =>
        withRemote(o, async (lab) => {
          for (const n of names) await (await lab.get(n))[verb]();
          if (o.json) printJson({ [verb === 'pause' ? 'paused' : 'resumed']: names });
        }),
      );
  }

  program
    .command('snapshot')
    .description('snapshot a sandbox (through the daemon)')
    .argument('<sandbox>')
    .requiredOption('--name <name>', 'name of the new snapshot')
    .option('--memory', 'the whole machine state too (VM driver)')
    .option('--json', 'print the snapshot as JSON')
    .action((sandbox: string, o: { name: string; memory?: boolean; json?: boolean }) =>
      withRemote(o, async (lab) => {
        const snap = await (await lab.get(sandbox)).snapshot(o.name, { memory: o.memory });
        if (o.json) printJson(snap.toJSON());
        else process.stdout.write(`${snap.name}\n`);
      }),
    );

  addLimitOptions(
    program
      .command('restore')
      .description('a new sandbox from a snapshot (through the daemon)')
      .argument('<snapshot>')
      .option('--name <name>', 'a name for the new sandbox')
      .option('--json', 'print the sandbox as JSON'),
  ).action((snapshot: string, o: LimitOptions & { name?: string; json?: boolean }) =>
    withRemote(o, async (lab) => {
      const limits = limitsFrom(o);
      printBox(
        await lab.restore(snapshot, { name: o.name, ...(Object.keys(limits).length ? { limits } : {}) }),
        o.json,
      );
    }),
  );

  // exec and shell are the embedded commands themselves, given the daemon's lab
  registerExec(program, withRemote as Opener);
  registerShell(program, withRemote as Opener);
}
