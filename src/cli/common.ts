import type { Command } from 'commander';
import type { Lab } from '../sdk/lab.js';
import type { LabApi } from '../sdk/api.js';
import type { TraceSummary } from '../timing/trace.js';
import { renderWaterfall } from '../timing/waterfall.js';
import { EXIT_USAGE, reportError } from './output.js';
import { SnaplabError } from '../errors.js';

/** commander's collector for a repeatable option (`--label a=1 --label b=2`): every value, in order */
export const collect = (v: string, prev: string[]): string[] => [...prev, v];

export interface CommonOptions {
  json?: boolean;
  trace?: boolean;
}

/**
 * Open a lab, run the command, and turn any failure into a clean error and an exit code (2, or
 * 125 for exec and run). `body` returns the exit code for success paths; the lab is closed after.
 */
async function withOpened<L extends { close(): void }>(
  open: () => Promise<L>,
  opts: CommonOptions,
  // biome-ignore lint/suspicious/noConfusingVoidType: a body returns its exit code, or nothing for 0
  body: (lab: L) => Promise<number | void>,
  failureCode: number,
): Promise<void> {
  let lab: L | undefined;
  try {
    lab = await open();
    process.exitCode = (await body(lab)) ?? 0;
  } catch (e) {
    reportError(e, !!opts.json);
    process.exitCode = failureCode;
  } finally {
    lab?.close();
  }
}

/**
 * Run long work that ^C, SIGTERM or a hang-up interrupts: the first aborts its signal with
 * `stop.error` (saying `stop.first`, if given); the handlers stay until the work has settled, so a
 * second one does not end this process while the work undoes what it made (it says `stop.still`
 * instead). A third ends it at once (exit 130), saying `stop.left`: what may be left and how to
 * remove it (a cleanup that hangs is not waited for forever).
 */
export async function interruptible<T>(
  stop: { first?: string; still: string; left: string; error: SnaplabError },
  work: (signal: AbortSignal) => Promise<T>,
): Promise<T> {
  const ac = new AbortController();
  let signals = 0;
  const interrupt = (): void => {
    signals++;
    if (signals >= 3) {
      process.stderr.write(`\n… stopped before its cleanup ended: ${stop.left}\n`);
      process.exit(130);
    }
    if (ac.signal.aborted) return void process.stderr.write(`… ${stop.still} (once more to stop at once)\n`);
    if (stop.first) process.stderr.write(`\n… ${stop.first}\n`);
    ac.abort(stop.error);
  };
  const names = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;
  for (const s of names) process.on(s, interrupt);
  try {
    return await work(ac.signal);
  } finally {
    for (const s of names) process.off(s, interrupt);
  }
}

/** The embedded lab (loaded here, not at start-up: `--help`, `--version` and usage errors need none of it). */
export function withLab(
  opts: CommonOptions,
  // biome-ignore lint/suspicious/noConfusingVoidType: as withOpened's
  body: (lab: Lab) => Promise<number | void>,
  failureCode = EXIT_USAGE,
): Promise<void> {
  return withOpened(async () => (await import('../sdk/lab.js')).Lab.open(), opts, body, failureCode);
}

/**
 * For a command written over the Lab API: the daemon's (the remote library, when SNAPLAB_HOST
 * names one: the embedded lab, drivers and SQLite are not loaded) or the embedded one.
 */
export function withApi(
  opts: CommonOptions,
  // biome-ignore lint/suspicious/noConfusingVoidType: as withOpened's
  body: (lab: LabApi) => Promise<number | void>,
  failureCode = EXIT_USAGE,
): Promise<void> {
  const open = async (): Promise<LabApi> =>
    process.env.SNAPLAB_HOST
      ? new (await import('../client/remote.js')).RemoteLab()
      : (await import('../sdk/lab.js')).Lab.open();
  return withOpened(open, opts, body, failureCode);
}

/** A command that needs the embedded lab, asked for with SNAPLAB_HOST set. */
export function throughDaemonRefused(command: string, served?: string[]): SnaplabError {
  return new SnaplabError(
    'BAD_INPUT',
    `\`snaplab ${command}\` runs on the embedded lab, not through a daemon`,
    `${served ? `the daemon (SNAPLAB_HOST=${process.env.SNAPLAB_HOST}) serves: ${served.join(', ')}; ` : ''}unset SNAPLAB_HOST to run it here`,
  );
}

/** Print a trace's waterfall on stderr when --trace was given (stdout stays clean for --json). */
export function showTrace(opts: CommonOptions, trace: TraceSummary | undefined): void {
  if (opts.trace && trace) process.stderr.write(`${renderWaterfall(trace)}\n`);
}

export function addTraceOption(cmd: Command): Command {
  return cmd.option('--trace', 'print the phases of this operation as a waterfall (stderr)');
}

/** TARGET names a scenario (`lab`), not a machine (`box`, or a scenario's `lab/web`). */
export function isScenario(lab: Lab, target: string): boolean {
  return !target.includes('/') && lab.scenarios().some((s) => s.name === target);
}
