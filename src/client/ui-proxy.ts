/**
 * `snaplab ui`: the dashboard of a daemon that listens on its Unix socket only, in a browser.
 * A port on 127.0.0.1 forwards to the socket, and since the socket trusts whoever reaches it, the
 * forward asks for a token of its own, made now and printed once in the URL's fragment (as Jupyter
 * prints its token; a fragment is never sent): the page keeps it as its key and sends it like one (`Authorization: Bearer`, or `?token=` on
 * WebSockets and the event stream). A page of another site cannot learn it, and a Host that is
 * not this address (DNS rebinding) or a WebSocket from another Origin is refused before the
 * token is even looked at. Bodies are piped both ways as they come (streams, uploads and
 * WebSockets flow with Node's back-pressure); of the request only Host is set, the token taken
 * out, and Authorization and Cookie dropped.
 */
import { randomBytes, timingSafeEqual } from 'node:crypto';
import { createServer, request, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { connect, type Socket } from 'node:net';
import { SnaplabError } from '../errors.js';

export interface UiProxy {
  url: string;
  port: number;
  token: string;
  close(): Promise<void>;
}

/** what the page needs before it has its key: the page itself and its assets (public on TCP too) */
const PUBLIC = /^\/(?:|index\.html|assets\/[A-Za-z0-9._-]+|favicon\.ico|healthz)$/;

type Checked = { path: string } | { status: number; message: string };

/**
 * The gate: the path to forward (its token removed), or the status to refuse with. `port` is read
 * per request (it is known once the server listens).
 */
function gate(want: Buffer, port: () => number): (req: IncomingMessage, ws: boolean) => Checked {
  const hosts = (): Set<string> => new Set([`127.0.0.1:${port()}`, `localhost:${port()}`]);
  const origins = (): Set<string> => new Set([...hosts()].map((h) => `http://${h}`));
  return (req, ws) => {
    if (!hosts().has(req.headers.host ?? ''))
      return { status: 403, message: 'this forward answers to 127.0.0.1 and localhost only' };
    if (ws && req.headers.origin !== undefined && !origins().has(req.headers.origin))
      return { status: 403, message: 'a WebSocket from another origin' };
    let u: URL;
    try {
      u = new URL(req.url ?? '/', 'http://x');
    } catch {
      return { status: 400, message: 'a request target that is not a path' };
    }
    const given = /^Bearer (.+)$/i.exec(req.headers.authorization ?? '')?.[1] ?? u.searchParams.get('token') ?? '';
    u.searchParams.delete('token');
    const path = u.pathname + (u.searchParams.size ? `?${u.searchParams}` : '');
    if (!ws && req.method === 'GET' && PUBLIC.test(u.pathname)) return { path };
    const g = Buffer.from(given);
    if (g.length !== want.length || !timingSafeEqual(g, want))
      return { status: 401, message: 'open the URL `snaplab ui` printed (its token is the key)' };
    return { path };
  };
}

function headersFor(req: IncomingMessage): Record<string, string | string[]> {
  const h: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(req.headers))
    if (v !== undefined && k !== 'authorization' && k !== 'cookie' && k !== 'host') h[k] = v;
  h.host = 'localhost';
  return h;
}

/** A request that passed the gate, to the daemon's socket and its answer back. */
function forwardRequest(socketPath: string, path: string, req: IncomingMessage, res: ServerResponse): void {
  const up = request({ socketPath, method: req.method, path, headers: headersFor(req) }, (r) => {
    res.writeHead(r.statusCode ?? 502, r.headers);
    r.pipe(res);
    // the daemon ended its side before the end (it lets a slow event reader go, it stopped):
    // end the browser's too, so an EventSource reconnects and a download fails, not hangs
    r.on('close', () => {
      if (!r.complete) res.destroy();
    });
  });
  up.on('error', (e) => {
    if (!res.headersSent)
      res.writeHead(502, { 'content-type': 'application/json' }).end(
        JSON.stringify({
          code: 'DAEMON_UNREACHABLE',
          message: `the daemon at ${socketPath}: ${e.message}`,
          hint: 'is `snaplab serve` still running?',
        }),
      );
    else res.destroy();
  });
  // a browser that goes away ends the daemon's side too (a download, an event stream)
  res.on('close', () => {
    if (!res.writableFinished) up.destroy();
  });
  req.pipe(up);
}

/** A WebSocket upgrade that passed the gate: its request line and headers, then bytes both ways. */
function forwardUpgrade(socketPath: string, path: string, req: IncomingMessage, client: Socket, head: Buffer): void {
  const up = connect(socketPath);
  const lines = [`${req.method} ${path} HTTP/1.1`];
  for (const [k, v] of Object.entries(headersFor(req))) for (const one of [v].flat()) lines.push(`${k}: ${one}`);
  up.on('connect', () => {
    up.write(`${lines.join('\r\n')}\r\n\r\n`);
    if (head.length) up.write(head);
    up.pipe(client);
    client.pipe(up);
  });
  const end = (): void => {
    up.destroy();
    client.destroy();
  };
  up.on('error', end);
  client.on('error', end);
  up.on('close', end);
  client.on('close', end);
}

export async function startUiProxy(socketPath: string, opts: { port?: number } = {}): Promise<UiProxy> {
  const token = randomBytes(24).toString('base64url');
  const want = Buffer.from(token);
  let port = 0;
  const check = gate(want, () => port);

  const CODES: Record<number, string> = { 400: 'BAD_INPUT', 401: 'UNAUTHORIZED', 403: 'FORBIDDEN' };
  const onRequest = (req: IncomingMessage, res: ServerResponse): void => {
    const c = check(req, false);
    if ('status' in c) {
      res.writeHead(c.status, { 'content-type': 'application/json' }).end(
        JSON.stringify({
          code: CODES[c.status],
          message: c.message,
          hint: 'run `snaplab ui` and open the URL it prints',
        }),
      );
      return;
    }
    forwardRequest(socketPath, c.path, req, res);
  };

  const onUpgrade = (req: IncomingMessage, client: Socket, head: Buffer): void => {
    const c = check(req, true);
    if ('status' in c) {
      client.end(
        `HTTP/1.1 ${c.status} ${{ 400: 'Bad Request', 401: 'Unauthorized', 403: 'Forbidden' }[c.status]}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n`,
      );
      return;
    }
    upgraded.add(client);
    client.once('close', () => upgraded.delete(client));
    forwardUpgrade(socketPath, c.path, req, client, head);
  };

  const upgraded = new Set<Socket>();
  // no request deadline: an upload or a download may take longer than Node's default 300 s
  const server: Server = createServer({ requestTimeout: 0 }, onRequest);
  server.on('upgrade', onUpgrade);
  await new Promise<void>((resolve, reject) => {
    server.once('error', (e: NodeJS.ErrnoException) =>
      reject(
        e.code === 'EADDRINUSE'
          ? new SnaplabError(
              'PORT_IN_USE',
              `127.0.0.1:${opts.port} is in use`,
              'give another --port, or 0 for any free one',
              { cause: e },
            )
          : e,
      ),
    );
    server.listen({ host: '127.0.0.1', port: opts.port ?? 0 }, resolve);
  });
  port = (server.address() as { port: number }).port;
  return {
    // the token after #: a browser never sends a fragment, so it is in no request line or log
    url: `http://127.0.0.1:${port}/#key=${token}`,
    port,
    token,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        for (const s of upgraded) s.destroy();
        server.close(() => resolve());
      }),
  };
}
