/**
 * The code interpreter's server inside each machine (deploy/code-interpreter/server.py, Jupyter
 * kernels on 127.0.0.1:49999 there): started on a front's first request for it (the E2B front's
 * port 49999, the MCP server's run_code), once per sandbox while that front runs; a sandbox the
 * front forgets (killed) is forgotten here too. Reached only through the Lab API: `tunnel` carries
 * one connection over a `snaplab-agent connect` spawned in the machine.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Duplex } from 'node:stream';
import { packageRoot } from '../agent/binary.js';
import { MACHINE_AGENT_PATH } from '../drivers/driver.js';
import { SnaplabError } from '../errors.js';
import type { ProcessApi, SandboxApi } from '../sdk/api.js';

/** The port E2B's code-interpreter SDK names in `E2b-Sandbox-Port`. */
export const INTERPRETER_PORT = 49999;
const SERVER_IN_MACHINE = '/usr/local/lib/snaplab/code_interpreter.py';

/**
 * Probe the server; if it is not there, write it (from stdin) and start it in a session of its own
 * (it outlives this exec), then wait for its port.
 */
const START = `probe() { python3 -c 'import socket; socket.create_connection(("127.0.0.1", ${INTERPRETER_PORT}), 1)' 2>/dev/null; }
probe && exit 0
command -v python3 >/dev/null || { echo 'no python3 in this image (use the code-interpreter-v1 image, docs/e2b.md)' >&2; exit 3; }
mkdir -p ${SERVER_IN_MACHINE.replace(/\/[^/]+$/, '')} && cat > ${SERVER_IN_MACHINE}
setsid python3 ${SERVER_IN_MACHINE} </dev/null >>/var/log/snaplab-code-interpreter.log 2>&1 &
i=0
while ! probe; do
  i=$((i + 1))
  [ $i -gt 300 ] && { tail -n 5 /var/log/snaplab-code-interpreter.log >&2; exit 4; }
  sleep 0.1
done`;

let source: Buffer | undefined;
const serverSource = (): Buffer => {
  source ??= readFileSync(join(packageRoot(), 'deploy', 'code-interpreter', 'server.py'));
  return source;
};

/**
 * A front keeps at most this many sandboxes' starts; past it the oldest is forgotten. Forgetting is
 * always safe (the next request for it probes the server first, ~10 ms, and finds it running), so
 * the bound only keeps a long session whose sandboxes end out of its sight (their TTL, another
 * client) from growing without end.
 */
const MAX_REMEMBERED = 1024;

/** Starts (once per sandbox, while this front runs) the interpreter server inside the machine. */
export class Interpreters {
  private readonly started = new Map<string, Promise<void>>();

  ensure(box: SandboxApi): Promise<void> {
    let p = this.started.get(box.id);
    if (!p) {
      p = start(box);
      this.started.set(box.id, p);
      // a start that failed is tried again by the next request
      p.catch(() => this.started.delete(box.id));
      // a Map iterates in insertion order: the first key is the oldest
      if (this.started.size > MAX_REMEMBERED) this.started.delete(this.started.keys().next().value!);
    }
    return p;
  }

  forget(id: string): void {
    this.started.delete(id);
  }

  /** Forget every sandbox not in `live` (the ids a list of the lab gave: the others are gone). */
  retain(live: Iterable<string>): void {
    const keep = new Set(live);
    for (const id of this.started.keys()) if (!keep.has(id)) this.started.delete(id);
  }

  /** the sandboxes whose server this front started (for tests and diagnostics) */
  get size(): number {
    return this.started.size;
  }
}

async function start(box: SandboxApi): Promise<void> {
  const r = await box.exec(['/bin/sh', '-c', START], { stdin: serverSource() });
  if (r.exitCode !== 0)
    throw new SnaplabError(
      'AGENT_ERROR',
      `the code interpreter did not start in ${box.id}: ${r.stderr.toString().trim() || `exit ${r.exitCode}`}`,
      'make the sandbox from the code-interpreter-v1 image (python3 with ipykernel; docs/e2b.md)',
    );
}

/**
 * A connection to the interpreter's port inside the machine: one `snaplab-agent connect` carrying
 * its bytes. The server closes once it has answered (HTTP/1.0), and that is the end: without
 * --no-linger, connect would wait half a second more for input that never comes (measured: every
 * runCode took ~520 ms, ~12 ms of it the server's).
 */
export async function tunnel(box: SandboxApi): Promise<Duplex> {
  let proc: ProcessApi | undefined;
  const pending: Buffer[] = [];
  const duplex = new Duplex({
    write(chunk: Buffer, _enc, done) {
      if (!proc) pending.push(chunk);
      else if (!proc.write(chunk)) return void proc.drained().then(() => done(), done);
      done();
    },
    final(done) {
      proc?.end();
      done();
    },
    read() {},
    destroy(err, done) {
      proc?.kill(9);
      done(err);
    },
  });
  proc = await box.spawn([MACHINE_AGENT_PATH, 'connect', '--no-linger', String(INTERPRETER_PORT)], {
    stdin: true,
    onStdout: (b) => duplex.push(b),
  });
  for (const b of pending.splice(0)) proc.write(b);
  proc.result.then(
    () => duplex.push(null),
    (e: unknown) => duplex.destroy(e instanceof Error ? e : new Error(String(e))),
  );
  return duplex;
}
