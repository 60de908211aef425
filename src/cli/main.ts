#!/usr/bin/env node
// Many cgroup, /proc and storage file operations run at once (a scenario's machines in
// parallel): libuv's default of 4 threads would queue them behind each other.
process.env.UV_THREADPOOL_SIZE ??= '16';
import { Command, CommanderError } from 'commander';
import { COMMANDS } from './commands.js';
import { EXIT_EXEC_FAILURE, EXIT_USAGE, reportError } from './output.js';
import { throughDaemonRefused } from './common.js';
import { VERSION } from '../version.js';

const program = new Command('snaplab')
  .description('isolated Linux sandboxes: fast to raise, snapshot, restore and exec in, every phase timed')
  .version(VERSION)
  .showSuggestionAfterError()
  .enablePositionalOptions()
  .exitOverride()
  .configureOutput({
    outputError: (text, write) =>
      write(
        `error[BAD_INPUT]: ${text.replace(/^error: /, '').trimEnd()}\nhint: see \`snaplab --help\` or \`snaplab <command> --help\`\n`,
      ),
  });

// `--host URL` before the command is SNAPLAB_HOST for this call
if (process.argv[2] === '--host' && process.argv[3] !== undefined) {
  process.env.SNAPLAB_HOST = process.argv[3];
  process.argv.splice(2, 2);
}
const invoked = process.argv[2];
const one = COMMANDS.find(([names]) => invoked !== undefined && names.includes(invoked));
if (process.env.SNAPLAB_HOST && one?.[2] === 'local') {
  // a daemon does the Lab API's commands; this one needs the embedded lab
  const served = COMMANDS.filter(([, , reach]) => reach === 'lab').flatMap(([names]) => names);
  program
    .command(invoked!, { hidden: true })
    .allowUnknownOption()
    .allowExcessArguments()
    .action(() => {
      reportError(throughDaemonRefused(invoked!, served), false);
      process.exitCode = EXIT_USAGE;
    });
} else for (const [, register] of one ? [one] : COMMANDS) register(program);

// a reader that went away (`snaplab status | head -1`) ends the command quietly, as it would a
// shell tool; exec sets its own handler (its exit code says so)
const quietOnEpipe = (e: NodeJS.ErrnoException): void => {
  if (e.code !== 'EPIPE') throw e;
  process.exit(process.exitCode ?? 0);
};
if (invoked !== 'exec') process.stdout.on('error', quietOnEpipe);

program.parseAsync(process.argv).catch((e: unknown) => {
  if (e instanceof CommanderError) {
    // commander already printed its message; help and version are not failures; exec's own
    // failures use 125 so that they cannot be mistaken for the command's exit code
    process.exitCode =
      e.exitCode === 0
        ? 0
        : ['exec', 'run', '_exec-lost', '_exec-error'].includes(process.argv[2] ?? '')
          ? EXIT_EXEC_FAILURE
          : EXIT_USAGE;
    return;
  }
  process.stderr.write(`error[INTERNAL]: ${(e as Error).stack ?? String(e)}\n`);
  process.exitCode = EXIT_USAGE;
});
