import type { Command } from 'commander';
import { parsePut, type PutFile } from '../lab/pools/run.js';
import { parseSeconds } from '../lab/sizes.js';
import { withLab, type CommonOptions, collect } from './common.js';
import { badPoolArgs } from './pool.js';
import { EXIT_EXEC_FAILURE, printJson } from './output.js';

interface RunCli extends CommonOptions {
  pool?: string;
  image?: string;
  put: string[];
  env: string[];
  cwd?: string;
  user?: string;
  timeout?: string;
}

export function registerRun(program: Command): void {
  program
    .command('run [argv...]')
    .description(
      "run argv in a fresh sandbox (from a pool, or raised for it), then give the sandbox back or destroy it; with no argv, the image's Entrypoint and Cmd",
    )
    .usage('[--pool NAME | --image NAME] [options] -- argv...')
    .option('--pool <name>', 'take a standby from this pool (a miss raises one)')
    .option('--image <name>', 'no pool: raise a sandbox of this image for this execution (default busybox)')
    .option('--put <local:remote>', 'copy a host file into the sandbox first (repeatable)', collect, [])
    .option('-e, --env <K=V>', 'set an environment variable (repeatable)', collect, [])
    .option('--cwd <dir>', "working directory inside the sandbox (default: the image's WorkingDir)")
    .option('-u, --user <user[:group]>', "run as this user (default: the image's User, else root)")
    .option('--timeout <seconds>', 'kill the command after this long (exit 124)')
    .option('--json', 'print the result (exit code, output, timings) as JSON instead of streaming')
    .option('--trace', 'print the phases of the run (stderr)')
    .action((argv: string[], o: RunCli) =>
      withLab(
        o,
        async (lab) => {
          if (argv[0] === '--') argv = argv.slice(1);
          if (o.pool && o.image) throw badPoolArgs();
          const put: PutFile[] = o.put.map(parsePut);
          const r = await lab.run(argv, {
            pool: o.pool,
            image: o.image,
            put,
            env: o.env,
            cwd: o.cwd,
            user: o.user,
            timeoutMs: o.timeout === undefined ? undefined : parseSeconds(o.timeout),
            onStdout: o.json ? undefined : (b) => process.stdout.write(b),
            onStderr: o.json ? undefined : (b) => process.stderr.write(b),
          });
          if (o.json) {
            printJson({
              exitCode: r.exitCode,
              signal: r.signal,
              timedOut: r.timedOut,
              oomKilled: r.oomKilled,
              stdout: r.stdout.toString(),
              stderr: r.stderr.toString(),
              sandbox: r.sandbox,
              hit: r.hit,
              recycled: r.recycled,
              dirt: r.dirt,
              usage: r.usage,
              totalMs: r.trace.totalMs,
              operation: r.trace.id,
            });
          }
          if (o.trace) {
            const { renderWaterfall } = await import('../timing/waterfall.js');
            process.stderr.write(`${renderWaterfall(r.trace)}\n`);
          }
          return r.exitCode;
        },
        EXIT_EXEC_FAILURE,
      ),
    );
}
