/**
 * `snaplab serve --gateway --cluster etcd://…`: one API in front of many node daemons, the same
 * API a single daemon serves (docs/api.md), so the remote library and the CLI work against it
 * unchanged. A gateway keeps no state of its own: keys, nodes and where each sandbox lives are in
 * etcd (view.ts keeps a watched copy), so several can run at once and any can serve any call.
 *
 * The gateway is ClusterCore (core.ts: placement, claims, lookups, shared with the in-process
 * GatewayLab) plus this HTTP server: the daemon's Fastify app (server/app.ts) with the routes a
 * daemon and a gateway share (server/routes-shared.ts) over the cluster (gateway-host.ts), and,
 * asked first, the gateway's own routes for what those do not serve yet (gateway-routes.ts).
 *
 * - A create is placed (placement.ts), its name taken in the store for that node before it
 *   starts, then sent on (create.ts); one that never reached its node is placed once more, elsewhere.
 * - A call on a sandbox goes to the node that holds it; its body and answer are streamed, and
 *   WebSockets (exec streams, terminals) are joined byte for byte, /rpc relayed call by call
 *   (streams.ts: a capability of the GatewayLab, over proxy.ts and rpc-relay.ts).
 * - Lists are asked of every node and merged; a sandbox whose node lapsed is listed `lost`.
 * - Long operations that ran on several nodes (a pool defined on each) have one id that names
 *   them all (`c.` + their node and id), so any gateway can answer for it.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { SnaplabError } from '../errors.js';
import { requireScope, type Caller } from '../server/keys.js';
import { VERSION } from '../version.js';
import type { GatewayApi } from './gateway-api.js';
import { clusterRoutes } from './gateway-routes.js';
import { asSnaplab, errorBody, forward, sendError } from './proxy.js';
import { statusOf } from '../server/http-errors.js';
import { ClusterCore, openCluster, type ClusterParts } from './core.js';
import { GatewayLab } from './gateway-lab.js';
import type { Socket } from 'node:net';
import { ConnectionGuard, resolveLimits, type ConnectionLimits } from '../server/limits.js';
import type { FastifyInstance, FastifyPluginAsync } from 'fastify';
import { baseApp } from '../server/app.js';
import { sharedRoutes } from '../server/routes-shared.js';
import { gatewayHost, gatewayRoutes } from './gateway-host.js';

export interface GatewayOptions {
  cluster: string;
  /** host:port (127.0.0.1 unless another address is meant) */
  listen: string;
  /** K of power-of-K placement (default 2) */
  choices?: number;
  log?: (line: Record<string, unknown>) => void;
  /** the daemon's connection caps and timeouts (server/limits.ts); no request timeout here */
  limits?: Partial<ConnectionLimits>;
}

export class Gateway extends ClusterCore implements GatewayApi {
  private server: Server | undefined;
  /** the routes it shares with a single daemon (Fastify, on `server`) */
  private app: FastifyInstance | undefined;
  /** the TCP connection caps (server/limits.ts), told when a request carried a valid key */
  private guard: ConnectionGuard | undefined;
  url = '';

  private constructor(parts: ClusterParts, opts: GatewayOptions) {
    super(parts, opts);
  }

  static async start(opts: GatewayOptions): Promise<Gateway> {
    const g = new Gateway(await openCluster(opts.cluster, opts.log), opts);
    try {
      await g.listen(opts.listen, opts.limits);
      return g;
    } catch (e) {
      await g.closeCore();
      throw e;
    }
  }

  private async listen(listen: string, given: Partial<ConnectionLimits> = {}): Promise<void> {
    const { parseListen } = await import('../server/serve.js');
    const { host, port } = parseListen(listen);
    const routes = clusterRoutes(this);
    // long uploads (archives, stdin) are streamed: no overall deadline on a request, as on a node
    const limits = resolveLimits({ requestTimeoutMs: 0, ...given });
    const timeouts = { headersTimeout: limits.headersTimeoutMs, connectionsCheckingInterval: 1000 };
    // the daemon's app and routes (server/app.ts, routes-shared.ts) over the cluster; what they do
    // not serve yet is answered first by the gateway's own routes (gateway-routes.ts)
    const app = await baseApp({
      websocket: false,
      health: () => this.health(),
      // an operation's id names each node's part and each refusal (operations.ts)
      maxParamLength: 16_384,
      // ?token= only where a browser cannot send a header: the event stream (WebSockets: upgrade())
      caller: (req, scope) =>
        scope ? this.authenticate(req.raw, scope, req.routeOptions.url === '/events') : undefined,
      serverFactory: (handler) =>
        createServer(timeouts, (req, res) => {
          const t0 = performance.now();
          res.once('finish', () =>
            this.log({
              method: req.method,
              url: req.url?.split('?')[0],
              status: res.statusCode,
              ms: Math.round((performance.now() - t0) * 10) / 10,
            }),
          );
          const own = routes(req, res);
          if (own) void own().catch((e: unknown) => sendError(res, e));
          else handler(req, res);
        }),
    });
    const served: FastifyPluginAsync = async (r) => {
      await sharedRoutes(r, gatewayHost(this));
      gatewayRoutes(r, this);
    };
    await app.register(served);
    await app.ready();
    this.app = app;
    this.server = app.server;
    this.server.on('upgrade', (req, socket, head) => this.upgrade(req, socket, head));
    this.server.requestTimeout = 0;
    this.server.keepAliveTimeout = limits.keepAliveTimeoutMs;
    this.guard = new ConnectionGuard(limits, this.log);
    this.guard.attach(this.server);
    await new Promise<void>((resolve, reject) => {
      this.server!.once('error', reject);
      this.server!.listen(port, host, () => resolve());
    });
    const a = this.server.address() as { address: string; port: number; family: string };
    this.url = `http://${a.family === 'IPv6' ? `[${a.address}]` : a.address}:${a.port}`;
  }

  /** The caller a request's key stands for (keys live in the store: `snaplab key create --cluster`). */
  authenticate(req: IncomingMessage, scope: 'read' | 'exec' | 'admin', headerless = false): Caller {
    const m = /^Bearer\s+(\S+)$/i.exec(req.headers.authorization ?? '');
    const q = headerless ? new URL(req.url!, 'http://x').searchParams.get('token') : null;
    const token = m?.[1] ?? q ?? undefined;
    if (!token)
      throw new SnaplabError(
        'UNAUTHORIZED',
        'no API key given',
        'send `Authorization: Bearer KEY` (make one with `snaplab key create NAME --cluster …`)',
      );
    const caller = this.callerOf(token);
    requireScope(caller, scope);
    this.guard?.authenticated(req.socket as Socket);
    return caller;
  }

  forward(req: IncomingMessage, res: ServerResponse, node: string, caller: Caller): void {
    forward(req, res, this.node(node).url, node, this.token, caller);
  }

  private upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void {
    // a client that resets the connection must not become an uncaught exception
    socket.on('error', () => socket.destroy());
    const refuse = (e: unknown): void => {
      const err = asSnaplab(e);
      const body = JSON.stringify(errorBody(err));
      if (socket.writable)
        socket.end(
          `HTTP/1.1 ${statusOf(err.code)} Refused\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
        );
    };
    try {
      // joined byte for byte (or, /rpc, relayed call by call): the GatewayLab's capability
      const caller = this.authenticate(req, 'exec', true);
      void new GatewayLab(this, caller).joinUpgrade(req, socket, head).catch(refuse);
    } catch (e) {
      refuse(e);
    }
  }

  health(): Record<string, unknown> {
    return { ok: true, version: VERSION, pid: process.pid, role: 'gateway', nodes: this.view.nodes.size };
  }

  override async close(): Promise<void> {
    this.endStreams();
    // event streams and joined sockets never end by themselves: closed, not waited for
    const closed = new Promise<void>((r) => (this.server ? this.server.close(() => r()) : r()));
    this.server?.closeAllConnections();
    await closed;
    await this.app?.close();
    await this.closeCore();
  }

  private closeCore(): Promise<void> {
    return super.close();
  }
}
