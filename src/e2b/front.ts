/**
 * The E2B-compatible front (docs/e2b.md): code written for E2B's SDK runs unchanged with
 * `E2B_API_URL` and `E2B_SANDBOX_URL` pointed here. One HTTP listener answers both E2B's control
 * API (X-API-Key) and envd, the agent E2B runs in each sandbox, reached through the sandbox URL
 * with the header `E2b-Sandbox-Id` (X-Access-Token). It stands on the Lab API only: each caller's
 * key opens a KeyedLabApi (`labFor`, the daemon's own API with that key), so scopes, quotas, ceilings
 * and ownership are the daemon's, as for any other client.
 */
import type { Server } from 'node:http';
import type { Socket } from 'node:net';
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify';
import type { KeyedLabApi } from '../sdk/api.js';
import { SnaplabError } from '../errors.js';
import { routingError } from '../server/http-errors.js';
import { ConnectError, sendUnaryError } from './connect.js';
import { registerControl } from './control.js';
import { registerSnapshots } from './snapshots.js';
import { registerEnvd } from './envd.js';
import { registerInterpreter, rewriteUrl } from './interpreter.js';
import { registerMetrics } from './metrics.js';
import { E2bState, sendError } from './state.js';
import type { SessionStore } from './sessions.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** how far a request had got at each of its phases, in ms from its start (a Start's: sandbox, user, pid), for its log line */
    phases: Record<string, number> | null;
  }
}

export interface E2bFrontOptions {
  /** the Lab API as the holder of this key sees it (rejects with UNAUTHORIZED for an unknown key) */
  labFor: (apiKey: string) => Promise<KeyedLabApi>;
  log?: (line: Record<string, unknown>) => void;
  /** the HTTP server's timeouts (the daemon's TCP listener's, server/limits.ts) */
  server?: Record<string, unknown>;
  /** caps on connections: told of each connection, and of one whose caller proved who it is */
  guard?: { attach(server: Server): void; authenticated(socket: Socket): void };
  /** where the sessions (access tokens) outlive the front: the daemon's store (sessions.ts); else memory */
  sessions?: SessionStore;
  /** the name of the key an API key is (logged with each request it made), if it is one */
  keyName?: (apiKey: string) => string | undefined;
  /**
   * Tells the front of each sandbox whose record is gone however it went (the daemon's `destroyed`
   * and `failed` events: a TTL, `snaplab rm`, another front), so that it keeps nothing of it (its
   * session, handle, users, streams); returns what stops the telling. Without it, what the front
   * keeps of a sandbox removed elsewhere goes only when a call comes for it.
   */
  ended?: (forget: (id: string) => void) => () => void;
}

declare module 'fastify' {
  interface FastifyInstance {
    /** how many sandboxes the front keeps a session of (the daemon's metrics: snaplab_e2b_sessions) */
    e2bSessions(): number;
  }
}

/** The URL a listening app answers at. */
export function urlOf(app: FastifyInstance): string {
  const addr = app.server.address();
  if (typeof addr !== 'object' || !addr)
    throw new SnaplabError('DAEMON_ERROR', 'the E2B front is not listening', 'this is a bug of snaplab');
  return `http://${addr.family === 'IPv6' ? `[${addr.address}]` : addr.address}:${addr.port}`;
}

/** the most a JSON request body may hold before its sender is known (the control API's) */
const JSON_BODY_MAX = 1 << 20;
/** the most an envd call's body may hold (its token checked first) */
const ENVD_BODY_MAX = 16 << 20;
/** envd's Connect services, each call of which carries the sandbox's access token */
const ENVD_PATH = /^\/(process\.Process|filesystem\.Filesystem)\//;

export function buildE2bApp(opts: E2bFrontOptions): FastifyInstance {
  // requests for the code interpreter's port (E2b-Sandbox-Port: 49999) are routed apart (interpreter.ts)
  // a close ends the streams it serves (commands', watches'): a stop does not wait on a command's timeout
  const app = Fastify({
    bodyLimit: JSON_BODY_MAX,
    logger: false,
    forceCloseConnections: true,
    ...opts.server,
    rewriteUrl,
    // a path routing refuses: its only parameter is a sandbox's id, and none is that long (E2B's 404)
    frameworkErrors: (e, _req, reply) =>
      void sendError(
        reply,
        e.code === 'FST_ERR_MAX_PARAM_LENGTH'
          ? new SnaplabError('SANDBOX_NOT_FOUND', 'no sandbox has an id that long', 'ids are at most 100 characters')
          : routingError(e, 100),
      ),
  });
  opts.guard?.attach(app.server);
  const state = new E2bState(opts.labFor, (socket) => opts.guard?.authenticated(socket), opts.sessions);
  // bodies other than JSON come as streams: envelopes, multipart and octet-stream uploads
  app.removeAllContentTypeParsers();
  // JSON bodies are read whole before a handler checks who sent them: the control API's are small
  // (a create's metadata and envs), so 1 MiB; envd's calls may carry more (SendInput's stdin, in
  // base64), so theirs take 16 MiB, their token checked before the body is read (onRoute below)
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (_req, body, done) => done(null, body));
  app.addHook('onRoute', (route) => {
    if (!ENVD_PATH.test(route.url)) return;
    route.bodyLimit = ENVD_BODY_MAX;
    const before = route.preParsing === undefined ? [] : [route.preParsing].flat();
    route.preParsing = [
      async (req: FastifyRequest) => {
        state.envdToken(req); // a payload is what a preParsing hook returns: nothing, the body as it is
      },
      ...before,
    ];
  });
  app.addContentTypeParser('*', (_req, payload, done) => done(null, payload));
  app.decorateRequest('phases', null);
  app.setErrorHandler((e, req, reply) =>
    // an envd call's body over its limit: said as Connect says it, not as an unknown error
    ENVD_PATH.test(req.url) && (e as { code?: string }).code === 'FST_ERR_CTP_BODY_TOO_LARGE'
      ? sendUnaryError(
          reply,
          new ConnectError('resource_exhausted', `the request body is over ${ENVD_BODY_MAX >> 20} MiB`),
        )
      : sendError(reply, e),
  );
  app.setNotFoundHandler((req, reply) =>
    sendError(
      reply,
      new SnaplabError('BAD_INPUT', `no route ${req.method} ${req.url.split('?')[0]}`, 'see docs/e2b.md'),
    ),
  );
  app.addHook('onResponse', async (req, reply) => {
    const actor = state.actor(req);
    opts.log?.({
      // who did it: as the daemon's own request lines name their key
      key: actor === undefined ? null : (opts.keyName?.(actor) ?? null),
      method: req.method,
      url: req.url.split('?')[0],
      status: reply.statusCode,
      ms: Math.round(reply.elapsedTime * 10) / 10,
      ...(req.phases ? { phases: req.phases } : {}),
      front: 'e2b',
    });
  });
  // (most sandboxes that end were never the front's: nothing to forget, no store row to drop; each
  // is remembered as ended a while, for a connect that looked it up before its end)
  const unsubscribe = opts.ended?.((id) => state.endedElsewhere(id));
  app.decorate('e2bSessions', () => state.sessionCount);
  app.addHook('preClose', async () => {
    unsubscribe?.();
    state.processes.close();
    state.watchers.close();
  });
  registerControl(app, state);
  registerSnapshots(app, state);
  registerMetrics(app, state);
  registerEnvd(app, state);
  registerInterpreter(app, state);
  return app;
}
