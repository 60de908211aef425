/**
 * `GET /rpc` (WebSocket): one-shot execs multiplexed on one connection, for clients that run many
 * small commands (the remote library uses it for exec and pool runs). A request is one text
 * frame `{id, op: "exec", sandbox, argv, env?, cwd?, user?, timeoutMs?, stdin? (base64)}` or
 * `{id, op: "run", pool, ...}`; its answer is `{id, result}` or `{id, error}`, in the order the
 * commands end. HTTP costs a request and a response object, headers and a parse each way per
 * call; a frame costs a JSON parse. A connection that goes kills its commands still running. A
 * gateway relays each call to the node of its sandbox (sandbox-calls.ts, cluster/rpc-relay.ts).
 */
import type { FastifyInstance } from 'fastify';
import type { WebSocket } from 'ws';
import { SnaplabError } from '../errors.js';
import type { Daemon } from './daemon.js';
import type { Caller } from './keys.js';
import { socketServedBy, type SandboxCalls } from './sandbox-calls.js';
import { toSnaplab } from './http-errors.js';
import { execView, poolRunView } from './exec-view.js';

interface Call {
  id: number | string;
  op: 'exec' | 'run';
  sandbox?: string;
  pool?: string;
  argv: string[];
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
  timeoutMs?: number;
  stdin?: string;
}

function check(c: Partial<Call>): Call {
  const bad = (what: string): never => {
    throw new SnaplabError('BAD_INPUT', `rpc: invalid ${what}`, 'see docs/api.md, /rpc');
  };
  if (typeof c.id !== 'number' && typeof c.id !== 'string') bad('id');
  if (c.op !== 'exec' && c.op !== 'run') bad('op (exec or run)');
  if (c.op === 'exec' && typeof c.sandbox !== 'string') bad('sandbox');
  if (c.op === 'run' && typeof c.pool !== 'string') bad('pool');
  if (!Array.isArray(c.argv) || c.argv.some((a) => typeof a !== 'string')) bad('argv');
  if (
    c.env !== undefined &&
    (typeof c.env !== 'object' || c.env === null || Object.values(c.env).some((v) => typeof v !== 'string'))
  )
    bad('env');
  for (const k of ['cwd', 'user', 'stdin'] as const) if (c[k] !== undefined && typeof c[k] !== 'string') bad(k);
  if (c.timeoutMs !== undefined && (!Number.isSafeInteger(c.timeoutMs) || c.timeoutMs < 0)) bad('timeoutMs');
  return c as Call;
}

export async function rpcRoutes(app: FastifyInstance, s: SandboxCalls): Promise<void> {
  app.get(
    '/rpc',
    {
      websocket: true,
      schema: {
        hide: true,
        tags: ['processes'],
        summary: 'One-shot execs and pool runs multiplexed on a WebSocket (docs/api.md)',
      },
    },
    socketServedBy(s, (d) => (ws: WebSocket, req) => serveRpc(d, ws, req.caller)),
  );
}

/** One client's connection: its calls run as they come, answered as they end. */
function serveRpc(d: Daemon, ws: WebSocket, caller: Caller): void {
  const running = new Set<{ kill(sig: number): void }>();
  ws.once('close', d.track(caller, ws));
  ws.on('close', () => {
    for (const p of running) p.kill(9);
  });
  ws.on('message', (data, isBinary) => {
    let id: Call['id'] | null = null;
    void (async () => {
      if (isBinary) throw new SnaplabError('BAD_INPUT', 'rpc: send JSON text frames', 'see docs/api.md, /rpc');
      const parsed = JSON.parse(String(data)) as unknown;
      // null, a number, an array: not a call (null once answered INTERNAL, from `null.id`)
      if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed))
        throw new SnaplabError('BAD_INPUT', 'rpc: a frame is a JSON object {id, op, …}', 'see docs/api.md, /rpc');
      const raw = parsed as Partial<Call>;
      id = raw.id ?? null;
      const c = check(raw);
      // a key removed since the socket opened answers no more calls
      if (!d.stillValid(caller)) {
        ws.close(1008, 'key removed');
        throw new SnaplabError(
          'UNAUTHORIZED',
          'the API key is not known (any more)',
          'make a new one with `snaplab key create NAME`',
        );
      }
      const stdin = c.stdin !== undefined ? { stdin: Buffer.from(c.stdin, 'base64') } : {};
      const opts = { env: c.env, cwd: c.cwd, user: c.user, timeoutMs: c.timeoutMs, ...stdin };
      if (c.op === 'exec') {
        const box = await d.sandbox(c.sandbox!, caller);
        let p: { kill(signal: number): void } | undefined;
        try {
          const r = await d.runExec(caller, box, c.argv, opts, 'rpc', (started) => {
            p = started;
            if (ws.readyState !== ws.OPEN) started.kill(9); // the socket went while it started
            running.add(started);
          });
          return execView(r, 'base64');
        } finally {
          if (p) running.delete(p);
        }
      }
      // a pool's run: held to the key's ceilings and exec quota as HTTP's is; the connection going kills it, as it does an exec
      const gone = new AbortController();
      const kill = { kill: () => gone.abort() };
      running.add(kill);
      try {
        return poolRunView(await d.run(caller, c.pool!, { ...opts, argv: c.argv }, gone.signal), 'base64');
      } finally {
        running.delete(kill);
      }
    })().then(
      (result) => ws.readyState === ws.OPEN && ws.send(JSON.stringify({ id, result })),
      (e) => {
        const err = toSnaplab(
          e instanceof SyntaxError
            ? new SnaplabError('BAD_INPUT', `rpc: not JSON: ${e.message}`, 'send JSON text frames', { cause: e })
            : e,
        );
        if (ws.readyState === ws.OPEN)
          ws.send(
            JSON.stringify({
              id,
              error: {
                ...err.toJSON(),
                // which quota, or what a key may not have (egress): as HTTP's answers say it
                ...((err as { limit?: string }).limit ? { limit: (err as { limit?: string }).limit } : {}),
              },
            }),
          );
      },
    );
  });
}
