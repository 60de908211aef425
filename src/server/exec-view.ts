/** A command's result as the API answers it (an exec, a pool run, an /rpc call). */
import type { ExecResult } from '../lab/io/sandbox-ops.js';
import type { RunOutcome } from '../lab/pools/run.js';
import type { TraceSummary } from '../timing/trace.js';

export function execView(r: ExecResult, encoding: 'utf8' | 'base64' = 'utf8'): Record<string, unknown> {
  return {
    exitCode: r.exitCode,
    signal: r.signal,
    timedOut: r.timedOut,
    notFound: r.notFound,
    oomKilled: r.oomKilled,
    truncated: r.truncated,
    stdout: r.stdout.toString(encoding),
    stderr: r.stderr.toString(encoding),
    encoding,
    usage: r.usage,
  };
}

/** A pool run's answer: the command's result, its sandbox, and how the pool served it. */
export function poolRunView(
  r: RunOutcome & { trace?: TraceSummary },
  encoding?: 'utf8' | 'base64',
): Record<string, unknown> {
  return {
    ...execView(r, encoding),
    sandbox: r.sandbox,
    hit: r.hit,
    recycled: r.recycled,
    operationId: r.trace?.id ?? null,
  };
}
