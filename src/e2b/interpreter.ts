/**
 * E2B's code interpreter (`@e2b/code-interpreter`, docs/e2b.md): requests to the sandbox URL with
 * `E2b-Sandbox-Port: 49999` are carried to snaplab's own interpreter server inside the machine
 * (deploy/code-interpreter/server.py, Jupyter kernels), started there on the first such request.
 * Each request is one HTTP exchange over one `snaplab-agent connect 49999` the front spawns in the
 * machine through the Lab API (as `snaplab port-forward` carries a connection), so it reaches
 * 127.0.0.1:49999 from inside the machine's own network; nothing listens outside it.
 */
import { readFileSync } from 'node:fs';
import { request, type IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import { join } from 'node:path';
import { Duplex } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { packageRoot } from '../agent/binary.js';
import { MACHINE_AGENT_PATH } from '../drivers/driver.js';
import { SnaplabError } from '../errors.js';
import type { ProcessApi, SandboxApi } from '../sdk/api.js';
import { readBody } from './connect.js';
import { sendError, type E2bState } from './state.js';

/** The port E2B's code-interpreter SDK names in `E2b-Sandbox-Port`. */
export const INTERPRETER_PORT = 49999;
/** Where the front's routes see an interpreter request (rewritten from the port header). */
export const INTERPRETER_PREFIX = '/.code-interpreter';
const SERVER_IN_MACHINE = '/usr/local/lib/snaplab/code_interpreter.py';

/** The URL a request is routed by: interpreter requests under INTERPRETER_PREFIX (Fastify's rewriteUrl). */
export function rewriteUrl(req: { url?: string; headers: Record<string, string | string[] | undefined> }): string {
  const url = req.url ?? '/';
  return String(req.headers['e2b-sandbox-port']) === String(INTERPRETER_PORT) ? INTERPRETER_PREFIX + url : url;
}

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
    }
    return p;
  }

  forget(id: string): void {
    this.started.delete(id);
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

/** A connection to the interpreter's port inside the machine: one `snaplab-agent connect` carrying its bytes. */
async function tunnel(box: SandboxApi): Promise<Duplex> {
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
  proc = await box.spawn([MACHINE_AGENT_PATH, 'connect', String(INTERPRETER_PORT)], {
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

/** One request carried to the server inside; its answer streamed back as it comes. */
async function carry(box: SandboxApi, req: FastifyRequest, body: Buffer): Promise<IncomingMessage> {
  const conn = await tunnel(box);
  const path = req.url.slice(INTERPRETER_PREFIX.length) || '/';
  return new Promise((resolve, reject) => {
    const up = request({
      method: req.method,
      path,
      headers: { 'content-type': 'application/json', 'content-length': body.length, connection: 'close' },
      createConnection: () => conn as unknown as Socket,
    });
    up.on('response', resolve);
    up.on('error', (e) =>
      reject(new SnaplabError('AGENT_ERROR', `the code interpreter in ${box.id}: ${e.message}`, 'try again', e)),
    );
    up.end(body);
  });
}

async function handle(
  state: E2bState,
  interpreters: Interpreters,
  req: FastifyRequest,
  reply: FastifyReply,
): Promise<FastifyReply> {
  const box = await state.envdSandbox(req, { tokenOptional: true });
  const body = await readBody(req.body);
  await interpreters.ensure(box);
  const res = await carry(box, req, body).catch((e: unknown) => {
    interpreters.forget(box.id); // the server may have died: the next request probes (and starts) it again
    throw e;
  });
  // the SDK gone before the end (its timeout): the connection inside ends, and the server interrupts the kernel
  reply.raw.once('close', () => {
    if (!reply.raw.writableFinished) res.destroy();
  });
  reply.code(res.statusCode ?? 502);
  const type = res.headers['content-type'];
  if (type) reply.type(type);
  return reply.send(res);
}

export function registerInterpreter(app: FastifyInstance, state: E2bState): Interpreters {
  const interpreters = new Interpreters();
  app.all(`${INTERPRETER_PREFIX}/*`, async (req, reply) => {
    try {
      return await handle(state, interpreters, req, reply);
    } catch (e) {
      return sendError(reply, e);
    }
  });
  return interpreters;
}
