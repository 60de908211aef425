/** A command's result as the API answers it (an exec, a pool run, an /rpc call). */
import type { ExecResult } from '../lab/io/sandbox-ops.js';

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
