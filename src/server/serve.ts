/**
 * `snaplab serve`: the daemon in the foreground, on a Unix socket (mode 0600, no key needed) and,
 * when asked, on a TCP address (bearer keys). Stopping it (SIGTERM, SIGINT) stops the listeners
 * and the pool refills; sandboxes are nobody's child and keep running for the next daemon.
 */
import { chmod, lstat, mkdir, unlink } from 'node:fs/promises';
import { connect } from 'node:net';
import { dirname, join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { SnaplabError, isSnaplabError } from '../errors.js';
import { END_EVENTS, type EventRecord } from '../store/records.js';
import { withLock } from '../host/lock.js';
import { DEFAULT_HOME } from '../lab/home.js';
import { buildApp } from './app.js';
import {
  ConnectionGuard,
  StreamLimiter,
  resolveLimits,
  serverOptions,
  type ConnectionLimits,
  type ResolvedLimits,
} from './limits.js';
import { Daemon, type DaemonOptions } from './daemon.js';
import type { ClusterNode, NodeOptions } from '../cluster/node.js';
import type { ClusterStore } from '../cluster/store.js';
import { noted, orElse } from '../cleanup.js';

export interface ServeOptions extends DaemonOptions {
  /** join a cluster as a node (needs `listen`: gateways reach it there) */
  node?: Omit<NodeOptions, 'url'> & { advertise?: string };
  /** Unix socket path (default $SNAPLAB_HOME/daemon.sock) */
  socket?: string;
  /** host:port to listen on with keys; 127.0.0.1 unless another address is given on purpose */
  listen?: string;
  jsonLogs?: boolean;
  /** caps on TCP connections and streams, and timeouts (limits.ts; docs/api.md, Limits) */
  limits?: Partial<ConnectionLimits>;
  /**
   * host:port of the E2B-compatible front (docs/e2b.md), on the daemon's keyed lab in this process:
   * each caller's key is held to what the daemon's routes hold it to (keyed-lab.ts)
   */
  e2bListen?: string;
}

export interface Server {
  daemon: Daemon;
  socket: string;
  /** the TCP URL, when listening on TCP */
  url: string | null;
  /** the E2B front's URL, when it runs */
  e2bUrl: string | null;
  close(): Promise<void>;
}

export const defaultSocket = (home: string): string => join(home, 'daemon.sock');

/** A socket file that nobody answers on is left from a daemon that died: remove it (a socket only). */
async function claimSocket(path: string): Promise<void> {
  const st = await lstat(path).catch(orElse(undefined, `lstat ${path}`, 'ENOENT'));
  if (st && !st.isSocket())
    throw new SnaplabError('BAD_INPUT', `${path} exists and is not a socket`, 'give another --socket, or remove it');
  const answered = await new Promise<boolean>((resolve) => {
    const c = connect(path);
    c.once('connect', () => {
      c.destroy();
      resolve(true);
    });
    c.once('error', () => resolve(false));
  });
  if (answered)
    throw new SnaplabError(
      'DAEMON_ERROR',
      `a daemon already listens on ${path}`,
      'stop it first, or give another --socket',
    );
  await unlink(path).catch(noted(`remove stale socket ${path}`, 'ENOENT'));
}

export function parseListen(text: string): { host: string; port: number } {
  const m = /^(?:\[([0-9a-f:]+)\]|([^:]+)):(\d{1,5})$/i.exec(text);
  const port = Number(m?.[3]);
  if (!m || port > 65535)
    throw new SnaplabError(
      'BAD_INPUT',
      `invalid --listen ${JSON.stringify(text)}`,
      'give HOST:PORT, e.g. 127.0.0.1:7070 (port 0: any free port)',
    );
  return { host: m[1] ?? m[2]!, port };
}

/** A request's phases on its text log line: ` phases=sandbox:0.4,user:0.5,pid:3.1` (ms from its start). */
function phasesOf(p: unknown): string {
  if (typeof p !== 'object' || p === null || !Object.keys(p).length) return '';
  return ` phases=${Object.entries(p)
    .map(([k, v]) => `${k}:${v}`)
    .join(',')}`;
}

/**
 * One line per request and per event of note, on stderr. Lines are gathered and written every
 * 50 ms (or at 64 KiB): at thousands of requests a second, a write per line was a tenth of the
 * daemon's CPU. Messages that are not request lines go out at once.
 */

export function logger(json: boolean): { log: (line: Record<string, unknown>) => void; flush: () => void } {
  let pending: string[] = [];
  let size = 0;
  let timer: NodeJS.Timeout | undefined;
  const flush = (): void => {
    if (timer) clearTimeout(timer);
    timer = undefined;
    if (pending.length) process.stderr.write(pending.join(''));
    pending = [];
    size = 0;
  };
  const log = (line: Record<string, unknown>): void => {
    const at = new Date().toISOString();
    const request = 'method' in line;
    let text: string;
    if (json) text = `${JSON.stringify({ time: at, ...line })}\n`;
    else if (request)
      text = `${at} ${line.method} ${line.url} ${line.status} ${line.ms}ms key=${line.key ?? '-'}${line.op ? ` op=${line.op}` : ''}${phasesOf(line.phases)}${line.front ? ` front=${line.front}` : ''}\n`;
    else {
      const { msg, ...rest } = line;
      text = `${at} ${msg}${Object.keys(rest).length ? ` ${JSON.stringify(rest)}` : ''}\n`;
    }
    pending.push(text);
    size += text.length;
    if (!request || size > 65536) {
      flush();
      return;
    }
    timer ??= setTimeout(flush, 50);
  };
  return { log, flush };
}

/**
 * The trusted app on the Unix socket, which only the daemon's user may open. `apps` has it before
 * it listens, so a failed listen still closes it.
 */
async function listenLocal(daemon: Daemon, socket: string, apps: FastifyInstance[]): Promise<void> {
  await mkdir(dirname(socket), { recursive: true });
  await claimSocket(socket);
  const local = await buildApp(daemon, { trusted: true });
  apps.push(local);
  // made with the umask narrowed (nothing else of this process makes files yet), then 0600
  const mask = process.umask(0o177);
  try {
    await local.listen({ path: socket });
  } finally {
    process.umask(mask);
  }
  await chmod(socket, 0o600);
}

/** The keyed app on TCP (in `apps` before it listens, as above); its URL. */
async function listenTcp(
  daemon: Daemon,
  listen: string,
  token: string | undefined,
  apps: FastifyInstance[],
  resolved: ResolvedLimits,
  streams: StreamLimiter,
): Promise<string | null> {
  const { host, port } = parseListen(listen);
  const limits = { resolved, guard: new ConnectionGuard(resolved, daemon.log), streams };
  const tcp = await buildApp(daemon, { trusted: false, clusterToken: token, limits });
  apps.push(tcp);
  await mcpOn(daemon, tcp, streams);
  // a long accept queue: under a flood a new client's SYN is queued, not dropped (a 1 s retransmit)
  await tcp.listen({ host, port, backlog: 4096 });
  const addr = tcp.server.address();
  return typeof addr === 'object' && addr
    ? `http://${addr.family === 'IPv6' ? `[${addr.address}]` : addr.address}:${addr.port}`
    : null;
}

/**
 * /mcp on the keyed app (src/mcp/http.ts): each request acts through its caller's key's lab in
 * this process (keyed-lab.ts), as the E2B front does, so a key may do over MCP what it may do here;
 * a request its client leaves has its commands killed (the lab's close).
 */
async function mcpOn(daemon: Daemon, tcp: FastifyInstance, streams: StreamLimiter): Promise<void> {
  const { mcpRoutes } = await import('../mcp/http.js');
  mcpRoutes(tcp, async (req) => {
    const auth = req.headers.authorization ?? '';
    const key = auth.startsWith('Bearer ') ? auth.slice('Bearer '.length).trim() : '';
    if (!key || !daemon.lab.keys.find(key))
      throw new SnaplabError('UNAUTHORIZED', 'MCP needs an API key of this daemon', 'send Authorization: Bearer KEY');
    // the key's lab in this process (keyed-lab.ts), as the E2B front's: no loopback hop per tool call
    return daemon.keyed(key, streams);
  });
}

/**
 * The name a key's request lines show, remembered: a key's name does not change, and each line
 * was a hash of the key and a read of its row (on every call of the E2B front). A key removed
 * since still names its lines (it authorises nothing: each call's own check reads the row).
 */
function keyNames(daemon: Daemon): (key: string) => string | undefined {
  const known = new Map<string, string>();
  return (key) => {
    const hit = known.get(key);
    if (hit !== undefined) return hit;
    const name = daemon.lab.keys.find(key)?.name;
    if (name === undefined) return undefined;
    if (known.size >= 1024) known.clear(); // a few keys drive a front; a bound all the same
    known.set(key, name);
    return name;
  };
}

/**
 * The E2B front (src/e2b/), on the daemon's keyed lab in this process (keyed-lab.ts): each
 * caller's key is held to what the daemon's routes hold it to, by the same functions, without a
 * loopback hop per call. In `apps` before it listens, as above; its URL.
 */
async function listenE2b(
  daemon: Daemon,
  listen: string,
  log: (line: Record<string, unknown>) => void,
  apps: FastifyInstance[],
  resolved: ResolvedLimits,
  streams: StreamLimiter,
): Promise<string> {
  const { host, port } = parseListen(listen);
  const { buildE2bApp, urlOf } = await import('../e2b/front.js');
  const { sealedSessions } = await import('../e2b/sessions.js');
  const rows = daemon.lab.e2bSessions;
  const app = buildE2bApp({
    log,
    // kept in the home's store, so that a restart leaves clients' sandboxes and tokens working
    sessions: rows ? sealedSessions(rows, join(daemon.lab.home, 'e2b-sessions.key')) : undefined,
    // the same caps and timeouts as the daemon's TCP listener (limits.ts), counted on their own
    server: serverOptions(resolved),
    guard: new ConnectionGuard(resolved, log),
    keyName: keyNames(daemon),
    ended: (forget) => {
      // told inside the log's record: a failure here must not fail the removal that is told of
      const on = (e: EventRecord): void => {
        if (!e.sandbox || !(END_EVENTS as readonly string[]).includes(e.type)) return;
        try {
          forget(e.sandbox);
        } catch (err) {
          noted(`forget ${e.sandbox} in the E2B front`)(err);
        }
      };
      daemon.events.on('event', on);
      return () => daemon.events.off('event', on);
    },
    labFor: async (key) => {
      // an unknown key opens nothing (the front keeps one lab per key: made-up keys must not grow it)
      if (!daemon.lab.keys.find(key))
        throw new SnaplabError(
          'UNAUTHORIZED',
          'the API key is not known',
          'make one with `snaplab key create NAME --e2b`',
        );
      return daemon.keyed(key, streams);
    },
  });
  apps.push(app);
  daemon.gauges.e2bSessions = () => app.e2bSessions();
  await app.listen({ host, port });
  const url = urlOf(app);
  log({ msg: 'E2B front listening', url });
  return url;
}

export async function serve(opts: ServeOptions = {}): Promise<Server> {
  const lines = logger(opts.jsonLogs ?? false);
  const log = opts.log ?? lines.log;
  if (opts.node && !opts.listen)
    throw new SnaplabError(
      'BAD_INPUT',
      'a node needs --listen: gateways reach it there',
      'add --listen HOST:PORT (an address the gateways can reach)',
    );
  // read and checked before anything is opened: a bad limit stops here
  const limits = opts.listen || opts.e2bListen ? resolveLimits(opts.limits) : undefined;
  const daemon = await Daemon.open({ ...opts, log });
  const apps: FastifyInstance[] = [];
  let cluster: ClusterStore | undefined;
  let token: string | undefined;
  let node: ClusterNode | undefined;
  // one daemon per home, held for its life: a second stops here (a lock of a dead one is taken over)
  let unlock!: () => void;
  let held: Promise<unknown> = Promise.resolve();
  try {
    await new Promise<void>((locked, failed) => {
      held = withLock(
        join(daemon.lab.home, 'daemon.lock'),
        () => {
          locked();
          return new Promise<void>((r) => (unlock = r));
        },
        300,
      ).catch((e: unknown) =>
        failed(
          isSnaplabError(e, 'TIMEOUT')
            ? new SnaplabError(
                'DAEMON_ERROR',
                `a daemon already runs on ${daemon.lab.home} (${(e as Error).message})`,
                'stop it first, or give it another SNAPLAB_HOME',
                { cause: e },
              )
            : e,
        ),
      );
    });
  } catch (e) {
    daemon.close();
    throw e;
  }
  try {
    // the socket first: a second daemon on the same home stops here, before it adopts anything
    const socket = opts.socket ?? defaultSocket(daemon.lab.home ?? DEFAULT_HOME);
    await listenLocal(daemon, socket, apps);
    await daemon.start();
    let url: string | null = null;
    if (opts.node) {
      const { ClusterStore } = await import('../cluster/store.js');
      cluster = await ClusterStore.open(opts.node.cluster);
      token = await cluster.token();
    }
    // a key's long streams are counted once, whichever listener carries them: its WebSockets and
    // event streams on the TCP API, its commands through the E2B front
    const streams = limits ? new StreamLimiter(limits.maxStreamsPerKey) : undefined;
    if (opts.listen) url = await listenTcp(daemon, opts.listen, token, apps, limits!, streams!);
    const e2bUrl = opts.e2bListen ? await listenE2b(daemon, opts.e2bListen, log, apps, limits!, streams!) : null;
    if (cluster && opts.node) {
      const { ClusterNode } = await import('../cluster/node.js');
      node = await ClusterNode.join(daemon, cluster, token!, { ...opts.node, url: opts.node.advertise ?? url! });
    }
    log({ msg: 'listening', socket, url, pid: process.pid, home: daemon.lab.home, node: node?.name ?? null, limits });
    return {
      daemon,
      socket,
      url,
      e2bUrl,
      async close() {
        // withdrawn first: gateways stop sending work before the listeners close
        await node?.leave();
        cluster?.close();
        await Promise.all(apps.map((a) => a.close()));
        await unlink(socket).catch(noted(`remove socket ${socket}`, 'ENOENT'));
        daemon.close();
        unlock();
        await held;
        lines.flush();
      },
    };
  } catch (e) {
    await node?.leave().catch(noted('leave the cluster'));
    cluster?.close();
    await Promise.all(apps.map((a) => a.close().catch(noted('close a listener'))));
    daemon.close();
    unlock();
    await held;
    throw e;
  }
}
