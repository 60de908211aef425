/**
 * E2B's code interpreter (`@e2b/code-interpreter`, docs/e2b.md): requests to the sandbox URL with
 * `E2b-Sandbox-Port: 49999` are carried to snaplab's own interpreter server inside the machine
 * (deploy/code-interpreter/server.py, Jupyter kernels), started there on the first such request.
 * Each request is one HTTP exchange over one `snaplab-agent connect 49999` the front spawns in the
 * machine through the Lab API (as `snaplab port-forward` carries a connection), so it reaches
 * 127.0.0.1:49999 from inside the machine's own network; nothing listens outside it.
 */
import { request, type IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { SnaplabError } from '../errors.js';
import type { SandboxApi } from '../sdk/api.js';
import { readBody } from './connect.js';
import { sandboxEnvs } from './envd.js';
import { sendError, type E2bState } from './state.js';
import { INTERPRETER_PORT, tunnel, type Interpreters } from '../interpreter/server.js';

/** Where the front's routes see an interpreter request (rewritten from the port header). */
export const INTERPRETER_PREFIX = '/.code-interpreter';

/** The URL a request is routed by: interpreter requests under INTERPRETER_PREFIX (Fastify's rewriteUrl). */
export function rewriteUrl(req: { url?: string; headers: Record<string, string | string[] | undefined> }): string {
  const url = req.url ?? '/';
  return String(req.headers['e2b-sandbox-port']) === String(INTERPRETER_PORT) ? INTERPRETER_PREFIX + url : url;
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
      reject(
        new SnaplabError('AGENT_ERROR', `the code interpreter in ${box.id}: ${e.message}`, 'try again', { cause: e }),
      ),
    );
    up.end(body);
  });
}

/**
 * An execution carries the sandbox's own variables (E2B_SANDBOX, its id, its create's envVars), which
 * the server sets in a kernel at its first execution, as E2B's reads them from envd's /envs.
 */
function withSandboxEnvs(box: SandboxApi, path: string, body: Buffer): Buffer {
  // by the path as the server routes it (its query and any fragment cut off)
  if (new URL(path, 'http://in').pathname !== '/execute') return body;
  let m: unknown;
  try {
    m = JSON.parse(body.toString());
  } catch {
    return body; // the server answers it 400
  }
  if (typeof m !== 'object' || m === null || Array.isArray(m)) return body;
  const global_env_vars = sandboxEnvs(box);
  return Buffer.from(JSON.stringify({ ...m, global_env_vars }));
}

async function handle(
  state: E2bState,
  interpreters: Interpreters,
  req: FastifyRequest,
  reply: FastifyReply,
): Promise<FastifyReply> {
  // the SDK sends the traffic token, not the access token, on its context calls: either serves
  // there; running code (`/execute`) needs the access token
  const path = req.url.slice(INTERPRETER_PREFIX.length);
  const box = await state.envdSandbox(req, { traffic: /^\/(contexts|health)(\/|\?|$)/.test(path) });
  const body = withSandboxEnvs(box, path, await readBody(req.body));
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

export function registerInterpreter(app: FastifyInstance, state: E2bState): void {
  const interpreters = state.interpreters;
  app.all(`${INTERPRETER_PREFIX}/*`, async (req, reply) => {
    try {
      return await handle(state, interpreters, req, reply);
    } catch (e) {
      return sendError(reply, state.unavailable(req, e));
    }
  });
}
