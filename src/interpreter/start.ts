/**
 * Starting the code interpreter's server (deploy/code-interpreter/server.py, Jupyter kernels on
 * 127.0.0.1:49999) inside a machine: one command, given whatever runs a command there. The fronts
 * run it through the Lab API (server.ts, on their first request for a sandbox's interpreter); a
 * pool with warm interpreters runs it in each standby it raises (lab/pools/runner.ts), so a take
 * finds the server and its kernel already up. It depends on no layer of snaplab's: both sides share it.
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { packageRoot } from '../agent/binary.js';
import { MACHINE_AGENT_PATH } from '../drivers/driver.js';
import { SnaplabError } from '../errors.js';

/** The port E2B's code-interpreter SDK names in `E2b-Sandbox-Port`. */
export const INTERPRETER_PORT = 49999;
const SERVER_IN_MACHINE = '/usr/local/lib/snaplab/code_interpreter.py';
const LOG = '/var/log/snaplab-code-interpreter.log';

/**
 * Probe the server (the agent's own `connect --check`, ~1 ms, where python3 took ~20); if it is not
 * there, write it (from stdin) and start it in a session of its own (it outlives this command),
 * then wait for its port. With `kernel`, then ask it for its contexts, which it answers once its
 * default kernel is up (the server starts that kernel beside its port, and a kernel takes
 * seconds): a pool's warm standby waits for that, else it would be frozen with its kernel half started.
 */
const start = (
  kernel: boolean,
): string => `probe() { ${MACHINE_AGENT_PATH} connect --check ${INTERPRETER_PORT} 2>/dev/null; }
if ! probe; then
  command -v python3 >/dev/null || { echo 'no python3 in this image (use the code-interpreter-v1 image, docs/e2b.md)' >&2; exit 3; }
  mkdir -p ${SERVER_IN_MACHINE.replace(/\/[^/]+$/, '')} && cat > ${SERVER_IN_MACHINE}
  setsid python3 ${SERVER_IN_MACHINE} </dev/null >>${LOG} 2>&1 &
  i=0
  while ! probe; do
    i=$((i + 1))
    [ $i -gt 300 ] && { tail -n 5 ${LOG} >&2; exit 4; }
    sleep 0.1
  done
fi
${
  kernel
    ? `printf 'GET /contexts HTTP/1.0\\r\\n\\r\\n' | ${MACHINE_AGENT_PATH} connect --no-linger ${INTERPRETER_PORT} | head -n 1 | grep -q ' 200 ' ||
  { echo 'the code interpreter did not start its kernel' >&2; tail -n 5 ${LOG} >&2; exit 5; }`
    : ''
}`;

let source: Buffer | undefined;
const serverSource = (): Buffer => {
  source ??= readFileSync(join(packageRoot(), 'deploy', 'code-interpreter', 'server.py'));
  return source;
};

/**
 * What a warm standby was started with: a hash of the server and of the command that starts it.
 * Each warm standby records it (sandboxes.warm_version); a take claims only those of its own build,
 * so after an upgrade none is handed out with the old server (lab/pools/runner.ts).
 */
let version: string | undefined;
export function interpreterVersion(): string {
  version ??= createHash('sha256').update(start(true)).update(serverSource()).digest('hex').slice(0, 16);
  return version;
}

/** Runs argv in the machine with `stdin` as its input; its exit code and stderr. */
export type RunInMachine = (argv: string[], stdin: Buffer) => Promise<{ exitCode: number; stderr: Buffer | string }>;

/**
 * Start the server in the machine `id` (nothing when it already answers); throws when it does not
 * come up. `kernel`: wait for its default kernel too.
 */
export async function startInterpreter(id: string, run: RunInMachine, opts: { kernel?: boolean } = {}): Promise<void> {
  const r = await run(['/bin/sh', '-c', start(opts.kernel === true)], serverSource());
  if (r.exitCode !== 0)
    throw new SnaplabError(
      'AGENT_ERROR',
      `the code interpreter did not start in ${id}: ${r.stderr.toString().trim() || `exit ${r.exitCode}`}`,
      'use an image with python3 and ipykernel: the code-interpreter-v1 image (`--image code-interpreter-v1`; docs/e2b.md)',
    );
}
