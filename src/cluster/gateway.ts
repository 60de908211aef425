/**
 * `snaplab serve --gateway --cluster etcd://…`: one API in front of many node daemons, the same
 * API a single daemon serves (docs/api.md), so the remote library and the CLI work against it
 * unchanged. A gateway keeps no state of its own: keys, nodes and where each sandbox lives are in
 * etcd (view.ts keeps a watched copy), so several can run at once and any can serve any call.
 *
 * The gateway is ClusterCore (core.ts: placement, claims, lookups, shared with the in-process
 * GatewayLab) plus this HTTP server: the daemon's Fastify app (server/app.ts) with the daemon's
 * own routes and schemas, over the cluster (gateway-host.ts); a sandbox's own calls are passed to
 * its node (server/sandbox-calls.ts, streams.ts). Its OpenAPI document is its own app's: a
 * daemon's, with the cluster's one route of its own (`/cluster/nodes`) and without the dashboard's
 * (a node's).
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
import { createServer, ServerResponse, type IncomingMessage, type Server } from 'node:http';
import type { Duplex } from 'node:stream';
import { SnaplabError } from '../errors.js';
import { requireScope, type Caller } from '../server/keys.js';
import { VERSION } from '../version.js';
import type { GatewayApi } from './gateway-api.js';
import { ClusterCore, openCluster, type ClusterParts } from './core.js';
import type { Socket } from 'node:net';
import { ConnectionGuard, resolveLimits, type ConnectionLimits } from '../server/limits.js';
import type { FastifyInstance, FastifyPluginAsync } from 'fastify';
import { sharedRoutes } from '../server/routes-shared.js';
import { baseApp, sandboxCallRoutes } from '../server/app.js';
import { gatewayHost, gatewayRoutes } from './gateway-host.js';
import { holdUpgrade } from './streams.js';

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
  /** the single daemon's routes over the cluster (Fastify, on `server`) */
  private app: FastifyInstance | undefined;
  /** the app's request handler, which the server's upgrades are routed through too */
  private handle: ((req: IncomingMessage, res: ServerResponse) => void) | undefined;
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
    // long uploads (archives, stdin) are streamed: no overall deadline on a request, as on a node
    const limits = resolveLimits({ requestTimeoutMs: 0, ...given });
    const timeouts = { headersTimeout: limits.headersTimeoutMs, connectionsCheckingInterval: 1000 };
    // the daemon's app and routes (server/app.ts) over the cluster
    const app = await baseApp({
      websocket: false,
      health: () => this.health(),
      // an operation's id names each node's part and each refusal (operations.ts)
      maxParamLength: 16_384,
      // ?token= only where a browser cannot send a header: WebSockets and the event stream
      caller: (req, scope) =>
        scope
          ? this.authenticate(
              req.raw,
              scope,
              req.headers.upgrade?.toLowerCase() === 'websocket' || req.routeOptions.url === '/events',
            )
          : undefined,
      serverFactory: (handler) => {
        this.handle = handler;
        return createServer(timeouts, (req, res) => {
          const t0 = performance.now();
          res.once('finish', () =>
            this.log({
              method: req.method,
              url: req.url?.split('?')[0],
              status: res.statusCode,
              ms: Math.round((performance.now() - t0) * 10) / 10,
            }),
          );
          handler(req, res);
        });
      },
    });
    const cluster = gatewayHost(this);
    const served: FastifyPluginAsync = async (r) => {
      await sandboxCallRoutes(r, cluster);
      await sharedRoutes(r, cluster);
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

  /**
   * A WebSocket upgrade, routed by the app as any request (its route's scope and schema checked,
   * a refusal answered as an HTTP error), then joined to its node by the route's handler
   * (gateway-host.ts): the app has no WebSocket plugin, which would end the socket here.
   */
  private upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void {
    // a client that resets the connection must not become an uncaught exception
    socket.on('error', () => socket.destroy());
    holdUpgrade(req, { socket, head });
    const res = new ServerResponse(req);
    res.shouldKeepAlive = false;
    res.assignSocket(socket as Socket);
    // refused (not joined): the answer written, the connection ends
    res.once('finish', () => socket.end());
    this.handle!(req, res);
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
