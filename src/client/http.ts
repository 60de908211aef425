/**
 * The remote library's transport: HTTP/1.1 with keep-alive to the daemon's TCP address
 * (`http://127.0.0.1:7070`, with a bearer key) or its Unix socket (`unix:/var/lib/snaplab/daemon.sock`),
 * and WebSockets for streams. An error response becomes the same SnaplabError the embedded
 * library throws (code, message, hint, operationId).
 */
import { Agent, request, type ClientRequest, type IncomingMessage } from 'node:http';
import type { Readable } from 'node:stream';
import WebSocket from 'ws';
import { SnaplabError, type ErrorCode } from '../errors.js';

export interface ConnectOptions {
  /** http://HOST:PORT, or unix:/path/to/daemon.sock; default $SNAPLAB_HOST */
  url?: string;
  /** the API key (TCP); default $SNAPLAB_TOKEN */
  token?: string;
  /** headers sent with every request and socket (a cluster gateway names the caller it acts for here) */
  headers?: Record<string, string>;
  /**
   * give up on a connection not made within this (ms): DAEMON_UNREACHABLE, its cause ETIMEDOUT.
   * Default: none (the system's own, minutes); a gateway gives its nodes 10 s (a partition)
   */
  connectTimeoutMs?: number;
  /**
   * give up on a JSON call (one without a signal of its own) whose whole answer has not come in
   * this (ms): DAEMON_UNREACHABLE. For a client that makes short calls only (a gateway's fan-out
   * reads): a create, an upload or a long-polled operation would be cut short. Default: none
   */
  answerTimeoutMs?: number;
}

export class Http {
  private readonly socketPath: string | undefined;
  private readonly host: string;
  private readonly port: number | undefined;
  private readonly agent = new Agent({ keepAlive: true, maxSockets: 256 });

  private readonly token: string | undefined;

  readonly url: string;

  private readonly extra: Record<string, string>;
  private readonly connectTimeoutMs: number | undefined;
  private readonly answerTimeoutMs: number | undefined;

  constructor(
    url: string,
    token: string | undefined,
    opts: Pick<ConnectOptions, 'headers' | 'connectTimeoutMs' | 'answerTimeoutMs'> = {},
  ) {
    this.extra = opts.headers ?? {};
    this.connectTimeoutMs = opts.connectTimeoutMs;
    this.answerTimeoutMs = opts.answerTimeoutMs;
    this.url = url;
    this.token = token;
    if (url.startsWith('unix:')) {
      this.socketPath = url.slice('unix:'.length);
      this.host = 'localhost';
    } else {
      let u: URL;
      try {
        u = new URL(url);
      } catch (e) {
        throw new SnaplabError(
          'BAD_INPUT',
          `invalid daemon URL ${JSON.stringify(url)}`,
          'give http://HOST:PORT or unix:/path/to/daemon.sock',
          { cause: e },
        );
      }
      if (u.protocol !== 'http:')
        throw new SnaplabError(
          'BAD_INPUT',
          `unsupported daemon URL ${JSON.stringify(url)}`,
          'give http://HOST:PORT or unix:/path/to/daemon.sock',
        );
      this.host = u.hostname.replace(/^\[|\]$/g, '');
      this.port = Number(u.port || 80);
      // http://KEY@HOST:PORT: the key in the URL (a bench comparing two daemons needs one each)
      if (u.username) this.token = decodeURIComponent(u.username);
      this.url = `http://${u.host}`;
    }
  }

  private headers(extra: Record<string, string> = {}): Record<string, string> {
    return { ...this.extra, ...(this.token ? { authorization: `Bearer ${this.token}` } : {}), ...extra };
  }

  /** Send a request; the response as a stream (status checked: an error status throws its SnaplabError). */
  async stream(
    method: string,
    path: string,
    opts: { json?: unknown; body?: Readable | Buffer; contentType?: string; signal?: AbortSignal } = {},
  ): Promise<IncomingMessage> {
    const body = opts.json !== undefined ? Buffer.from(JSON.stringify(opts.json)) : opts.body;
    const headers = this.headers(
      opts.json !== undefined
        ? { 'content-type': 'application/json' }
        : body
          ? { 'content-type': opts.contentType ?? 'application/octet-stream' }
          : {},
    );
    if (Buffer.isBuffer(body)) headers['content-length'] = String(body.length);
    // a kept connection the daemon closed as idle just as this was sent: the request never reached
    // it (no answer began), so it is sent once more on a new connection (Node's `reusedSocket`);
    // a streamed body cannot be sent twice
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.send(method, path, headers, body, opts.signal);
      } catch (e) {
        const again = (e as { again?: boolean }).again === true && attempt === 0 && !(body && !Buffer.isBuffer(body));
        if (!again) throw e;
      }
    }
  }

  private async send(
    method: string,
    path: string,
    headers: Record<string, string>,
    body: Readable | Buffer | undefined,
    signal: AbortSignal | undefined,
  ): Promise<IncomingMessage> {
    const res = await new Promise<IncomingMessage>((resolve, reject) => {
      const req = request(
        {
          method,
          path,
          headers,
          agent: this.agent,
          host: this.host,
          port: this.port,
          socketPath: this.socketPath,
          signal,
        },
        resolve,
      );
      this.connectDeadline(req);
      req.on('error', (e: NodeJS.ErrnoException) =>
        reject(
          e.name === 'AbortError'
            ? new SnaplabError('ABORTED', `${method} ${path}: aborted`, undefined, { cause: e })
            : Object.assign(unreachable(this.url, e), { again: req.reusedSocket && e.code === 'ECONNRESET' }),
        ),
      );
      if (Buffer.isBuffer(body)) req.end(body);
      else if (body) {
        body.on('error', (e) => req.destroy(e));
        body.pipe(req);
      } else req.end();
    });
    if (res.statusCode! >= 400) throw await errorOf(res);
    return res;
  }

  async json<T>(
    method: string,
    path: string,
    opts: { json?: unknown; body?: Readable | Buffer; contentType?: string; signal?: AbortSignal } = {},
  ): Promise<T> {
    const ms = opts.signal ? undefined : this.answerTimeoutMs;
    const deadline = ms ? AbortSignal.timeout(ms) : undefined;
    let text: string;
    try {
      const res = await this.stream(method, path, deadline ? { ...opts, signal: deadline } : opts);
      text = (await collect(res)).toString();
    } catch (e) {
      if (!deadline?.aborted) throw e;
      throw new SnaplabError(
        'DAEMON_UNREACHABLE',
        `${method} ${path}: no answer from ${this.url} within ${ms! / 1000} s`,
        'it may be overloaded, or partitioned away',
        { cause: e },
      );
    }
    return (text ? JSON.parse(text) : undefined) as T;
  }

  /** A request whose connection is not made in connectTimeoutMs fails as the system's would, ETIMEDOUT. */
  private connectDeadline(req: ClientRequest): void {
    const ms = this.connectTimeoutMs;
    if (!ms) return;
    req.once('socket', (s) => {
      if (!s.connecting) return;
      const t = setTimeout(
        () => req.destroy(Object.assign(new Error(`no connection within ${ms / 1000} s`), { code: 'ETIMEDOUT' })),
        ms,
      );
      s.once('connect', () => clearTimeout(t));
      s.once('close', () => clearTimeout(t));
    });
  }

  /**
   * A WebSocket to `path`, open. `listen` is given it at once, before it opens: a server that
   * speaks first (an attach's `attached`) may have its first message handled before this
   * promise's continuation runs, so a caller that must not miss it listens there.
   */
  socket(path: string, listen?: (ws: WebSocket) => void): Promise<WebSocket> {
    const url = this.socketPath
      ? `ws+unix:${this.socketPath}:${path}`
      : `ws://${this.host.includes(':') ? `[${this.host}]` : this.host}:${this.port}${path}`;
    const ws = new WebSocket(url, {
      headers: this.headers(),
      maxPayload: 64 << 20,
      ...(this.connectTimeoutMs ? { handshakeTimeout: this.connectTimeoutMs } : {}),
    });
    listen?.(ws);
    return new Promise((resolve, reject) => {
      ws.once('open', () => resolve(ws));
      ws.once('unexpected-response', (_req, res) => void errorOf(res).then(reject));
      ws.once('error', (e: NodeJS.ErrnoException) => reject(unreachable(this.url, e)));
    });
  }

  close(): void {
    this.agent.destroy();
  }
}

export function collect(s: Readable): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    s.on('data', (b: Buffer) => parts.push(b));
    s.once('end', () => resolve(parts.length === 1 ? parts[0]! : Buffer.concat(parts)));
    s.once('error', reject);
  });
}

function unreachable(url: string, e: NodeJS.ErrnoException): SnaplabError {
  return new SnaplabError(
    'DAEMON_UNREACHABLE',
    `cannot reach the daemon at ${url}: ${e.message}`,
    'is `snaplab serve` running there? (SNAPLAB_HOST says where)',
    { cause: e },
  );
}

async function errorOf(res: IncomingMessage): Promise<SnaplabError> {
  const text = (await collect(res)).toString();
  try {
    const b = JSON.parse(text) as {
      code: ErrorCode;
      message: string;
      hint?: string;
      operationId?: string;
      limit?: string;
    };
    // not one of snaplab's errors (fastify's own, before a route: 431, a proxy's page): said as it came
    if (typeof b?.code !== 'string' || typeof b.message !== 'string') throw new Error('not a snaplab error');
    const e = new SnaplabError(b.code, b.message, b.hint);
    if (b.operationId) (e as SnaplabError & { operationId?: string }).operationId = b.operationId;
    // which limit refused it (a quota, a ceiling, egress), as the rpc socket's errors keep it
    if (typeof b.limit === 'string') (e as SnaplabError & { limit?: string }).limit = b.limit;
    if (res.headers['retry-after'])
      (e as SnaplabError & { retryAfterS?: number }).retryAfterS = Number(res.headers['retry-after']);
    return e;
  } catch (e) {
    return new SnaplabError(
      'DAEMON_ERROR',
      `the daemon answered ${res.statusCode}: ${text.slice(0, 200)}`,
      'see the daemon log',
      { cause: e },
    );
  }
}
