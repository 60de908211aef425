import type { Command } from 'commander';
import { parseSeconds } from '../lab/sizes.js';
import { withApi, withLab, type CommonOptions, collect } from './common.js';
import { EXIT_EXEC_FAILURE } from './output.js';
import { SnaplabError } from '../errors.js';

interface ExecCli extends CommonOptions {
  env: string[];
  cwd?: string;
  user?: string;
  timeout?: string;
  interactive?: boolean;
  tty?: boolean;
}

export function registerExec(program: Command): void {
  program
    .command('exec <sandbox> <argv...>')
    .description('run argv in a sandbox (no shell), streaming its output; exits with its exit code')
    .usage('<sandbox> [options] -- argv...')
    .option('-e, --env <K=V>', 'set an environment variable (repeatable)', collect, [])
    .option('--cwd <dir>', 'working directory inside the sandbox')
    .option(
      '-u, --user <user[:group]>',
      "run as this user of the machine (a name or uid; from the machine's /etc/passwd)",
    )
    .option('--timeout <seconds>', 'kill the command after this long (exit 124)')
    .option('-i, --interactive', 'forward stdin to the command')
    .option(
      '-t, --tty',
      'run the command on a terminal inside the machine (with -i: the local terminal goes raw and follows its size)',
    )
    .option('--json', 'errors as JSON')
    .addHelpText(
      'after',
      "\nExit codes: the command's own; 124 timed out; 127 not found; 128+N killed by signal N; 125 snaplab failed.",
    )
    .action((sandbox: string, argv: string[], o: ExecCli) =>
      withApi(
        o,
        async (lab) => {
          const timeoutMs = o.timeout === undefined ? undefined : parseSeconds(o.timeout);
          if (argv[0] === '--') argv = argv.slice(1);
          const box = await lab.get(sandbox);
          // a reader that went away (`| head`): stop as a command writing to a closed pipe does,
          // and the agent kills the command when the connection closes (native/cli.c does the same)
          const outputFailed = (e: NodeJS.ErrnoException): void => {
            if (e.code !== 'EPIPE')
              process.stderr.write(
                `error[OUTPUT_FAILED]: cannot write the command's output (${e.code ?? 'error'})\nhint: is there room where stdout goes?\n`,
              );
            process.exit(e.code === 'EPIPE' ? 141 : EXIT_EXEC_FAILURE);
          };
          process.stdout.on('error', outputFailed);
          process.stderr.on('error', outputFailed);
          try {
            if (o.tty) {
              // as docker: a terminal's end of input is a key (^D), not the end of a pipe, so piped
              // input would never end the command
              if (o.interactive && !process.stdin.isTTY)
                throw new SnaplabError(
                  'BAD_INPUT',
                  'the input is not a terminal (-t -i needs one)',
                  'drop -t to pipe input into the command (exec -i), or run it from a terminal',
                );
              const { runOnTerminal } = await import('./terminal.js');
              const r = await runOnTerminal(box, argv, {
                env: o.env,
                cwd: o.cwd,
                user: o.user,
                timeoutMs,
                input: o.interactive === true,
              });
              if (r.timedOut) process.stderr.write(`snaplab: timed out after ${o.timeout} s; killed\n`);
              return r.exitCode;
            }
            const r = await box.exec(argv, {
              env: o.env,
              cwd: o.cwd,
              user: o.user,
              timeoutMs,
              stdin: o.interactive ? process.stdin : undefined,
              onStdout: (b) => process.stdout.write(b),
              onStderr: (b) => process.stderr.write(b),
            });
            if (r.oomKilled)
              process.stderr.write(`snaplab: the command was killed by the OOM killer (sandbox memory limit)\n`);
            else if (r.timedOut) process.stderr.write(`snaplab: timed out after ${o.timeout} s; killed\n`);
            return r.exitCode;
          } finally {
            box.close();
            if (o.interactive) process.stdin.destroy();
          }
        },
        EXIT_EXEC_FAILURE,
      ),
    );
}

interface ShellCli extends CommonOptions {
  user?: string;
  env: string[];
}

export function registerShell(program: Command): void {
  program
    .command('shell <machine>')
    .description(
      "a login shell in a machine (its user's shell from /etc/passwd, else /bin/bash, else /bin/sh) on a terminal",
    )
    .option('-u, --user <user[:group]>', 'log in as this user of the machine (default root)')
    .option('-e, --env <K=V>', 'set an environment variable (repeatable)', collect, [])
    .option('--json', 'errors as JSON')
    .addHelpText(
      'after',
      "\nExits with the shell's exit code. Ctrl-C, Ctrl-Z and Ctrl-D go to the machine; `exit` leaves.",
    )
    .action((machine: string, o: ShellCli) =>
      withApi(
        o,
        async (lab) => {
          if (!process.stdin.isTTY)
            throw new SnaplabError(
              'BAD_INPUT',
              'shell needs a terminal (the input is not one)',
              'pipe a script into `snaplab exec -i MACHINE -- sh` instead',
            );
          const { loginShell, runOnTerminal } = await import('./terminal.js');
          const box = await lab.get(machine);
          try {
            const sh = await loginShell(box, o.user);
            const r = await runOnTerminal(box, sh.argv, {
              env: [...sh.env, ...o.env],
              cwd: sh.home,
              user: o.user,
              input: true,
            });
            return r.exitCode;
          } finally {
            box.close();
            process.stdin.destroy();
          }
        },
        EXIT_EXEC_FAILURE,
      ),
    );
}

/**
 * The exec fast path (native/cli.c) lost its connection after the command may have started: the
 * same error the Node path gives then (the sandbox died, and why; or the agent went away).
 */
export function registerExecLost(program: Command): void {
  program
    .command('_exec-lost <sandbox>', { hidden: true })
    .option('--json', 'errors as JSON')
    .action((sandbox: string, o: CommonOptions) =>
      withLab(
        o,
        async (lab) => {
          const box = await lab.get(sandbox); // reconciled: a machine that died is dead now, with its reason
          box.close();
          const { deadError } = await import('../drivers/namespaces/driver.js');
          if (box.info.state === 'dead') throw deadError(box.name, box.info.reason ?? undefined);
          throw new SnaplabError(
            'AGENT_UNREACHABLE',
            'connection to agent closed with 1 request(s) pending',
            `see \`snaplab ls\`; is sandbox ${box.name} still running?`,
          );
        },
        EXIT_EXEC_FAILURE,
      ),
    );
}

/** The exec fast path's agent answered the exec with ERROR: the error as the Node path reports it. */
export function registerExecError(program: Command): void {
  program
    .command('_exec-error <errno> <message>', { hidden: true })
    .option('--json', 'errors as JSON')
    .action((errno: string, message: string, o: CommonOptions) =>
      withLab(
        o,
        async () => {
          const { execErrorOf } = await import('../agent/agent-errors.js');
          throw execErrorOf(Number(errno), message);
        },
        EXIT_EXEC_FAILURE,
      ),
    );
}
