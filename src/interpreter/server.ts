/**
 * The code interpreter's server inside each machine (deploy/code-interpreter/server.py, Jupyter
 * kernels on 127.0.0.1:49999 there): started on a front's first request for it (the E2B front's
 * port 49999, the MCP server's run_code), once per sandbox while that front runs; a sandbox the
 * front forgets (killed) is forgotten here too. Reached only through the Lab API: `tunnel` carries
 * one connection over a `snaplab-agent connect` spawned in the machine.
 */
import { Duplex } from 'node:stream';
import { MACHINE_AGENT_PATH } from '../drivers/driver.js';
import type { ProcessApi, SandboxApi } from '../sdk/api.js';
import { INTERPRETER_PORT, startInterpreter } from './start.js';

export { INTERPRETER_PORT } from './start.js';

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

const start = (box: SandboxApi): Promise<void> => startInterpreter(box.id, (argv, stdin) => box.exec(argv, { stdin }));

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
