/**
 * The daemon's HTTP application (Fastify): one per listener. On the Unix socket (`trusted`) a
 * request needs no key; on TCP every route but /healthz and /openapi.json needs a bearer key with
 * the route's scope. Every request is logged once, with its key and the operation it traced.
 */
import { publicOrFail, registeredScope } from './scopes.js';
import Fastify, {
  type FastifyInstance,
  type FastifyPluginAsync,
  type FastifyRequest,
  type FastifyServerFactory,
  type RouteOptions,
} from 'fastify';
import swagger from '@fastify/swagger';
import websocket from '@fastify/websocket';
import { CALLER_HEADER, LOCAL, authenticate, gatewayCaller, requireScope, type Caller } from './keys.js';
import { routingError, sendError } from './http-errors.js';
import type { Daemon } from './daemon.js';
import type { Scope } from '../store/records.js';
import { sandboxRoutes } from './routes-sandboxes.js';
import { egressRoutes } from './routes-egress.js';
import { streamRoutes } from './routes-streams.js';
import { fileRoutes } from './routes-files.js';
import { sharedRoutes } from './routes-shared.js';
import { rpcRoutes } from './routes-rpc.js';
import type { SandboxCalls } from './sandbox-calls.js';
import { uiRoutes } from './routes-ui.js';
import { VERSION } from '../version.js';
import { serverOptions, type ConnectionGuard, type ResolvedLimits, type StreamLimiter } from './limits.js';

declare module 'fastify' {
  interface FastifyRequest {
    caller: Caller;
    /** the traced operation this request ran, for the log line */
    opId: string | null;
  }
  interface FastifyContextConfig {
    scope?: Scope;
    /** needs no key (server/scopes.ts publicOrFail): /healthz, /openapi.json, the dashboard's files */
    public?: boolean;
  }
}

/** The URL for the log: any query parameter that decodes to `token` shown as … */
function logUrl(req: FastifyRequest): string {
  const [path, query] = req.url.split('?', 2);
  if (!query) return req.url;
  const params = new URLSearchParams(query);
  for (const k of [...params.keys()]) if (k.toLowerCase() === 'token') params.set(k, '…');
  return `${path}?${params.toString()}`;
}

export interface AppOptions {
  trusted: boolean;
  /** a cluster node: requests bearing the cluster's token act for the caller the gateway names */
  clusterToken?: string;
  /** TCP: the connection caps, stream caps and timeouts (limits.ts) */
  limits?: { resolved: ResolvedLimits; guard: ConnectionGuard; streams: StreamLimiter };
}

export interface BaseAppOptions {
  /** the caller of a request to a route of this scope (none: a public route), or an error (UNAUTHORIZED, FORBIDDEN) */
  caller(req: FastifyRequest, scope: Scope | undefined): Caller | undefined;
  /** TCP: the timeouts (limits.ts) */
  resolved?: ResolvedLimits;
  /** WebSocket routes (a cluster gateway joins its WebSockets to its nodes' itself: gateway.ts) */
  websocket?: boolean;
  /** the HTTP server, made by the caller (a cluster gateway's logs each request and routes upgrades) */
  serverFactory?: FastifyServerFactory;
  /** GET /healthz's answer (no key needed) */
  health: () => Record<string, unknown>;
  /** the longest path parameter (Fastify's default: 100; a cluster's operation ids name their parts) */
  maxParamLength?: number;
}

/**
 * What a daemon's app and a cluster gateway's share: bodies checked by the routes' schemas, the
 * OpenAPI document made from them, the caller of each request, errors as SnaplabErrors' bodies.
 */
export async function baseApp(o: BaseAppOptions): Promise<FastifyInstance> {
  // ajv: a property the schema does not know is an error (Fastify's default drops it silently)
  const app = Fastify({
    logger: false,
    bodyLimit: 8 << 20,
    forceCloseConnections: true,
    return503OnClosing: true,
    ajv: { customOptions: { removeAdditional: false } },
    ...(o.resolved ? serverOptions(o.resolved) : {}),
    ...(o.serverFactory ? { serverFactory: o.serverFactory } : {}),
    ...(o.maxParamLength ? { maxParamLength: o.maxParamLength } : {}),
    // a path routing refuses (a part too long, bad percent-encoding) answers in snaplab's shape too
    frameworkErrors: (e, _req, reply) => void sendError(reply, routingError(e, o.maxParamLength ?? 100)),
  });
  app.decorateRequest('caller', null as unknown as Caller);
  app.decorateRequest('opId', null);
  // each route's scope from the one table (server/scopes.ts), which the keyed lab reads too. The
  // config is replaced, not changed in place: the HEAD route Fastify adds for a GET is made from
  // the GET's options as given, and comes through here in turn. One the table does not name must
  // be marked public, which a hook of its own context may do after this one: checked when ready.
  const unscoped: (RouteOptions & { websocket?: boolean })[] = [];
  app.addHook('onRoute', (r) => {
    const scope = registeredScope(r.method, r.url ?? '', r.config?.scope);
    if (scope) r.config = { ...r.config, scope };
    else unscoped.push(r);
  });
  app.addHook('onReady', (done) => {
    try {
      unscoped.forEach(publicOrFail);
      done();
    } catch (e) {
      done(e as Error);
    }
  });
  await app.register(swagger, {
    openapi: {
      openapi: '3.0.3',
      info: {
        title: 'snaplab',
        version: VERSION,
        description: 'Isolated Linux machines: raise, exec, snapshot, reset. See docs/api.md.',
      },
      components: { securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } } },
      security: [{ bearer: [] }],
    },
  });
  if (o.websocket !== false) await app.register(websocket, { options: { maxPayload: 16 << 20 } });
  // uploads are streamed to the machine as they come, never gathered here
  app.addContentTypeParser(['application/octet-stream', 'application/x-tar'], (_req, payload, done) =>
    done(null, payload),
  );
  // (callback hooks, not async ones: a promise each per request is measurable at exec rates)
  app.addHook('onRequest', (req: FastifyRequest, _reply, done) => {
    try {
      const caller = o.caller(req, req.routeOptions.config?.scope);
      if (caller) req.caller = caller;
    } catch (e) {
      return done(e as Error);
    }
    done();
  });
  app.setErrorHandler((e, _req, reply) => sendError(reply, e));
  app.setNotFoundHandler((req, reply) =>
    reply.status(404).send({
      code: 'BAD_INPUT',
      message: `no route ${req.method} ${req.url.split('?')[0]}`,
      hint: 'see /openapi.json',
    }),
  );
  app.get('/healthz', { config: { public: true }, schema: { hide: true } }, async () => o.health());
  app.get('/openapi.json', { config: { public: true }, schema: { hide: true } }, async () => app.swagger());
  return app;
}

export async function buildApp(daemon: Daemon, opts: AppOptions): Promise<FastifyInstance> {
  const app = await baseApp({
    resolved: opts.limits?.resolved,
    health: () => ({ ok: true, version: VERSION, pid: process.pid }),
    caller: (req, scope) => {
      if (opts.trusted) return LOCAL;
      if (!scope) return undefined;
      // ?token= only where a browser cannot send a header: WebSockets and the event stream
      const q = req.query as Record<string, unknown> | undefined;
      const headerless = req.headers.upgrade?.toLowerCase() === 'websocket' || req.routeOptions.url === '/events';
      const viaGateway = opts.clusterToken
        ? gatewayCaller(opts.clusterToken, req.headers.authorization, req.headers[CALLER_HEADER])
        : undefined;
      const caller =
        viaGateway ?? authenticate(daemon.lab.keys, req.headers.authorization, headerless ? q?.token : undefined);
      requireScope(caller, scope);
      opts.limits?.guard.authenticated(req.raw.socket);
      if (headerless) opts.limits?.streams.admit(caller.key, req.raw.socket);
      return caller;
    },
  });
  // before any byte of a connection is parsed: refused or admitted at the caps
  opts.limits?.guard.attach(app.server);
  app.addHook('onResponse', (req, reply, done) => {
    const route = req.routeOptions.url ?? 'unknown';
    daemon.metrics.request(route, reply.statusCode);
    daemon.log({
      req: req.id,
      method: req.method,
      url: logUrl(req),
      status: reply.statusCode,
      ms: Math.round(reply.elapsedTime * 10) / 10,
      key: req.caller?.key ?? null,
      op: req.opId,
    });
    done();
  });
  // each group of routes is a Fastify plugin of its own (its hooks and decorations stay its own)
  const group =
    (routes: (r: FastifyInstance, d: Daemon) => Promise<void>): FastifyPluginAsync =>
    (r) =>
      routes(r, daemon);
  // the routes a cluster gateway serves too: a sandbox's own calls (served here), and the rest
  await sandboxCallRoutes(app, daemon);
  await app.register(group(sharedRoutes));
  await app.register(group(uiRoutes));
  return app;
}

/**
 * A sandbox's own calls (its create, view and destroy are routes-shared.ts's), each group a
 * plugin of its own: the Daemon serves them, a cluster gateway passes them to the sandbox's node
 * (sandbox-calls.ts). The same routes and schemas on both, so the same OpenAPI entries.
 */
export async function sandboxCallRoutes(app: FastifyInstance, s: SandboxCalls): Promise<void> {
  const group =
    (routes: (r: FastifyInstance, s: SandboxCalls) => Promise<void>): FastifyPluginAsync =>
    (r) =>
      routes(r, s);
  await app.register(group(sandboxRoutes));
  await app.register(group(egressRoutes));
  await app.register(group(streamRoutes));
  await app.register(group(fileRoutes));
  await app.register(group(rpcRoutes));
}
