/**
 * What keeps the daemon from being stalled from outside (issue 30): anyone who can open a TCP
 * connection, with no key, once held 22 500 idle half-requests, took the daemon to its open-file
 * limit, and every request hung, on the root-only Unix socket too. Each bound here has a default
 * and a `snaplab serve` option (docs/api.md, Limits; docs/security.md says what each bounds):
 *
 * - timeouts: a request's headers must arrive within `headersTimeoutMs`, the whole request within
 *   `requestTimeoutMs`; an idle keep-alive connection closes after `keepAliveTimeoutMs`;
 * - TCP connections in total, and those not yet authenticated (no request with a valid key) in
 *   total and per peer address. At its own cap, a peer's new connection displaces that peer's
 *   oldest unauthenticated one at least a second old, else it is closed; at a cap for all, the
 *   peer holding the most unauthenticated connections gives up its oldest (see evictHeaviest);
 *   a connection that made a keyed request is never displaced;
 * - file descriptors: the TCP cap stays `fdReserve` below the process's limit, so the Unix socket,
 *   the store, agents and /proc always have descriptors (Node raises the soft RLIMIT_NOFILE to the
 *   hard one at start; the limit read here is that one);
 * - WebSocket and event streams per key (StreamLimiter).
 */
import type { Server } from 'node:net';
import type { Socket } from 'node:net';
import { SnaplabError } from '../errors.js';
import { fdLimit, tcpRoom } from '../host/procs.js';
import { QuotaError } from './http-errors.js';

export interface ConnectionLimits {
  /** TCP connections at once, all peers (capped at the fd limit less fdReserve) */
  maxConnections: number;
  /**
   * TCP connections at once from one address that have not yet made a keyed request (keyed ones,
   * a cluster gateway's many included, count against maxConnections only)
   */
  maxUnauthenticatedPerPeer: number;
  /** TCP connections that have not yet made a request with a valid key */
  maxUnauthenticated: number;
  /** WebSocket and event streams open at once per key */
  maxStreamsPerKey: number;
  headersTimeoutMs: number;
  /** the whole request, body included (a large upload on a slow link needs it raised) */
  requestTimeoutMs: number;
  keepAliveTimeoutMs: number;
  /** descriptors kept for the daemon's own work; default a quarter of the limit, at least 64 */
  fdReserve?: number;
}

export const LIMIT_DEFAULTS: ConnectionLimits = {
  maxConnections: 4096,
  maxUnauthenticatedPerPeer: 128,
  maxUnauthenticated: 512,
  maxStreamsPerKey: 64,
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 600_000,
  keepAliveTimeoutMs: 5_000,
};

/** A fresh connection has this long to make its request before a newcomer may displace it. */
const EVICT_AGE_MS = 1000;

export interface ResolvedLimits extends Required<ConnectionLimits> {
  fdLimit: number;
}

/** The limits in force: defaults, then `given`; the TCP cap kept below the fd limit less the reserve. */
export function resolveLimits(given: Partial<ConnectionLimits> = {}): ResolvedLimits {
  const set = Object.fromEntries(Object.entries(given).filter(([, v]) => v !== undefined));
  const l = { ...LIMIT_DEFAULTS, ...set } as ConnectionLimits;
  for (const [k, v] of Object.entries(l))
    if (!Number.isSafeInteger(v) || v < 0)
      throw new SnaplabError('BAD_INPUT', `limit ${k} must be a whole number ≥ 0, not ${v}`, 'see docs/api.md, Limits');
  const { soft } = fdLimit();
  const { fdReserve, room } = tcpRoom(soft, l.maxConnections, l.fdReserve);
  if (soft - fdReserve < 16)
    throw new SnaplabError(
      'BAD_INPUT',
      `the open-file limit (${soft}) leaves no room for TCP connections beside ${fdReserve} held in reserve`,
      'raise the limit (ulimit -n, LimitNOFILE=) or lower the reserve',
    );
  return { ...l, fdReserve, fdLimit: soft, maxConnections: room };
}

/** Fastify's options for a listener under these limits (Node checks its timeouts every second). */
export function serverOptions(l: ConnectionLimits): {
  keepAliveTimeout: number;
  requestTimeout: number;
  http: { headersTimeout: number; connectionsCheckingInterval: number };
} {
  return {
    keepAliveTimeout: l.keepAliveTimeoutMs,
    requestTimeout: l.requestTimeoutMs,
    // Node requires headersTimeout ≤ requestTimeout (0: no request timeout)
    http: {
      headersTimeout: l.requestTimeoutMs ? Math.min(l.headersTimeoutMs, l.requestTimeoutMs) : l.headersTimeoutMs,
      connectionsCheckingInterval: 1000,
    },
  };
}

interface Conn {
  socket: Socket;
  peer: string;
  since: number;
  authenticated: boolean;
}

export interface GuardStats {
  open: number;
  unauthenticated: number;
  refused: number;
  evicted: number;
}

/** The TCP connection caps, on a listener's `connection` event (before any byte is parsed). */
export class ConnectionGuard {
  private readonly conns = new Map<Socket, Conn>();
  /** each peer's unauthenticated connections, oldest first */
  private readonly peers = new Map<string, Map<Socket, Conn>>();
  private unauthenticated = 0;
  private refused = 0;
  private evicted = 0;
  private lastLog = 0;

  constructor(
    readonly limits: ResolvedLimits,
    private readonly log: (line: Record<string, unknown>) => void = () => {},
  ) {}

  attach(server: Server): void {
    server.on('connection', (s: Socket) => this.admit(s));
  }

  stats(): GuardStats {
    return {
      open: this.conns.size,
      unauthenticated: this.unauthenticated,
      refused: this.refused,
      evicted: this.evicted,
    };
  }

  /** A request on `socket` carried a valid key: the connection is no longer displaced for newcomers. */
  authenticated(socket: Socket): void {
    const c = this.conns.get(socket);
    if (!c || c.authenticated) return;
    this.unlist(c);
    c.authenticated = true;
  }

  private admit(socket: Socket): void {
    const peer = socket.remoteAddress ?? '?';
    const mine = this.peers.get(peer);
    const l = this.limits;
    if (
      (mine !== undefined && mine.size >= l.maxUnauthenticatedPerPeer && !this.evictFrom(mine, EVICT_AGE_MS)) ||
      (this.conns.size >= l.maxConnections && !this.evictHeaviest()) ||
      (this.unauthenticated >= l.maxUnauthenticated && !this.evictHeaviest())
    ) {
      this.refused++;
      this.note(peer);
      socket.destroy();
      return;
    }
    const c: Conn = { socket, peer, since: Date.now(), authenticated: false };
    this.conns.set(socket, c);
    let set = this.peers.get(peer);
    if (!set) this.peers.set(peer, (set = new Map()));
    set.set(socket, c);
    this.unauthenticated++;
    socket.once('close', () => this.forget(c));
  }

  /**
   * At a cap for all peers: the room is taken from the peer that holds the most unauthenticated
   * connections (its oldest, whatever its age), so that a flood from a few addresses, however
   * fast, never keeps out a client from another.
   */
  private evictHeaviest(): boolean {
    let heaviest: Map<Socket, Conn> | undefined;
    for (const set of this.peers.values()) if (!heaviest || set.size > heaviest.size) heaviest = set;
    return heaviest !== undefined && this.evictFrom(heaviest, 0);
  }

  /** Drop the oldest of a peer's unauthenticated connections if it is at least `minAgeMs` old. */
  private evictFrom(from: Map<Socket, Conn>, minAgeMs: number): boolean {
    const oldest = from.values().next().value;
    if (!oldest || oldest.since > Date.now() - minAgeMs) return false;
    this.forget(oldest);
    oldest.socket.destroy();
    this.evicted++;
    return true;
  }

  private forget(c: Conn): void {
    if (!this.conns.delete(c.socket)) return;
    if (!c.authenticated) this.unlist(c);
  }

  /** No longer among its peer's unauthenticated connections. */
  private unlist(c: Conn): void {
    this.unauthenticated--;
    const set = this.peers.get(c.peer);
    set?.delete(c.socket);
    if (set && !set.size) this.peers.delete(c.peer);
  }

  /** At most one line per 10 s while connections are refused: a flood must not flood the log too. */
  private note(peer: string): void {
    const now = Date.now();
    if (now - this.lastLog < 10_000) return;
    this.lastLog = now;
    this.log({ msg: 'refusing TCP connections at a limit', peer, ...this.stats(), limits: this.limits });
  }
}

/** WebSocket and event streams per key: one more than `maxStreamsPerKey` is a 429. */
export class StreamLimiter {
  private readonly open = new Map<string, number>();

  constructor(private readonly max: number) {}

  /**
   * Count a stream of `key` until it closes (its socket; a command an in-process front started,
   * keyed-lab.ts), or refuse it.
   */
  admit(key: string, socket: { once(event: 'close', fn: () => void): unknown }): void {
    const n = this.open.get(key) ?? 0;
    if (n >= this.max)
      throw new QuotaError(
        'maxStreams',
        `key ${key} has ${n} streams open (WebSockets, event streams, commands through the E2B front or MCP), its limit`,
      );
    this.open.set(key, n + 1);
    socket.once('close', () => {
      const left = (this.open.get(key) ?? 1) - 1;
      if (left > 0) this.open.set(key, left);
      else this.open.delete(key);
    });
  }
}
