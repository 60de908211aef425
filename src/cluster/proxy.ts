/**
 * A gateway's requests to nodes: the client's request passed on as it comes (bodies and answers
 * streamed, never gathered), with the cluster token and the caller instead of the client's key.
 * WebSocket upgrades are joined byte for byte once the node has switched protocols, so an exec
 * stream or a terminal has the node's flow control end to end and nothing is buffered here.
 */
import {
  request,
  type ClientRequest,
  type IncomingHttpHeaders,
  type IncomingMessage,
  type ServerResponse,
} from 'node:http';
import type { Duplex } from 'node:stream';
import { SnaplabError } from '../errors.js';
import { CALLER_HEADER, type Caller } from '../server/keys.js';
import { statusOf } from '../server/http-errors.js';
import { unavailable } from './store.js';

/** hop-by-hop headers of a node's answer (RFC 9110 §7.6.1): the gateway's own connection has its own */
const HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'te', 'trailer', 'transfer-encoding', 'upgrade']);

/** hop-by-hop headers (RFC 9110 §7.6.1) and those the gateway sets itself */
const DROP = new Set([
  'authorization',
  'host',
  'connection',
  'keep-alive',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  CALLER_HEADER,
]);

export function callerHeader(c: Caller): string {
  return Buffer.from(
    JSON.stringify({ key: c.key, scopes: [...c.scopes], maxExecs: c.maxExecs, ceilings: c.ceilings }),
  ).toString('base64url');
}

export function upstreamHeaders(
  h: IncomingHttpHeaders,
  token: string,
  caller: Caller,
  upgrade = false,
): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(h))
    if (v !== undefined && !DROP.has(k) && !(upgrade ? false : k.startsWith('sec-websocket'))) out[k] = v;
  out.authorization = `Bearer ${token}`;
  out[CALLER_HEADER] = callerHeader(caller);
  if (upgrade) {
    out.connection = 'Upgrade';
    out.upgrade = 'websocket';
  }
  return out;
}

/** The path and query without `token=` (the key a browser put there is not the node's). */
export function upstreamPath(url: string): string {
  const [path, query] = url.split('?', 2);
  if (!query) return url;
  const q = new URLSearchParams(query);
  for (const k of [...q.keys()]) if (k.toLowerCase() === 'token') q.delete(k);
  const s = q.toString();
  return s ? `${path}?${s}` : path!;
}

export function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
): void {
  if (res.headersSent) return void res.destroy();
  const text = JSON.stringify(body);
  res
    .writeHead(status, {
      'content-type': 'application/json; charset=utf-8',
      'content-length': Buffer.byteLength(text),
      ...headers,
    })
    .end(text);
}

/** etcd's client errors (GRPC…, Etcd…): the store did not answer */
const fromEtcd = (e: unknown): boolean => e instanceof Error && /^(GRPC|Etcd)/.test(e.constructor.name);

/** Any error as the SnaplabError a client is given. */
export function asSnaplab(e: unknown): SnaplabError {
  if (e instanceof SnaplabError) return e;
  if (fromEtcd(e)) return unavailable(e, 'a gateway request');
  return new SnaplabError(
    'INTERNAL',
    (e as Error)?.message ?? String(e),
    'this is a bug in snaplab; the gateway log has the details',
    { cause: e },
  );
}

/** What a node's error carried besides code, message and hint (quota, Retry-After, its trace). */
type Extra = { retryAfterS?: number; limit?: string; operationId?: string };

export function errorBody(err: SnaplabError): Record<string, unknown> {
  const x = err as SnaplabError & Extra;
  return {
    ...err.toJSON(),
    ...(x.limit ? { limit: x.limit } : {}),
    ...(x.operationId ? { operationId: x.operationId } : {}),
  };
}

export function sendError(res: ServerResponse, e: unknown): void {
  const err = asSnaplab(e);
  const x = err as SnaplabError & Extra;
  sendJson(res, statusOf(err.code), errorBody(err), x.retryAfterS ? { 'retry-after': String(x.retryAfterS) } : {});
}

export function nodeUnavailable(node: string, e: Error, during = 'the request'): SnaplabError {
  return new SnaplabError(
    'NODE_UNAVAILABLE',
    `node ${node} did not answer ${during}: ${e.message}`,
    'it may be restarting or gone; `snaplab cluster nodes` shows the nodes that are up',
    { cause: e },
  );
}

/** how long a connection to a node may take to open before the node counts as not answering */
export const CONNECT_TIMEOUT_MS = 10_000;

/** A request that gives up on a node that does not accept the connection in time (a partition). */
function connectDeadline(up: ClientRequest): void {
  up.once('socket', (s) => {
    if (!s.connecting) return;
    const t = setTimeout(
      () =>
        up.destroy(
          Object.assign(new Error(`no connection within ${CONNECT_TIMEOUT_MS / 1000} s`), { code: 'ETIMEDOUT' }),
        ),
      CONNECT_TIMEOUT_MS,
    );
    s.once('connect', () => clearTimeout(t));
    s.once('close', () => clearTimeout(t));
  });
}

/** how long the gateway waits for a node's JSON answer (a create has its own, longer bound) */
export const ASK_TIMEOUT_MS = 15_000;

/** A connection that never reached the node: nothing was started there. */
export const neverConnected = (e: unknown): boolean =>
  ['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'ETIMEDOUT'].includes((e as NodeJS.ErrnoException)?.code ?? '');

/**
 * Pass a request on to `base` (the node's URL) and its answer back, both streamed; `body`: the
 * body to send instead of the request's own (one the gateway's route has read and checked).
 */
export function forward(
  req: IncomingMessage,
  res: ServerResponse,
  base: string,
  node: string,
  token: string,
  caller: Caller,
  body?: Buffer,
): void {
  // gone while its node was looked up: nothing is started for it (the connection, not the
  // request: one whose body the route has read is destroyed once read)
  if (req.socket.destroyed || res.destroyed) return;
  const up = request(
    new URL(upstreamPath(req.url!), base),
    {
      method: req.method,
      headers: {
        ...upstreamHeaders(req.headers, token, caller),
        ...(body ? { 'content-length': String(body.length) } : {}),
      },
    },
    (r) => {
      const headers: Record<string, string | string[]> = {};
      for (const [k, v] of Object.entries(r.headers)) if (v !== undefined && !HOP.has(k)) headers[k] = v;
      res.writeHead(r.statusCode ?? 502, headers);
      r.pipe(res);
      r.once('error', () => res.destroy());
    },
  );
  connectDeadline(up);
  up.once('error', (e) => (res.headersSent ? res.destroy() : sendError(res, nodeUnavailable(node, e))));
  // a client that goes away takes the request with it (the node kills a one-shot exec then)
  res.once('close', () => {
    if (!res.writableFinished) up.destroy();
  });
  if (body) up.end(body);
  else req.pipe(up);
}

/** Ask a node for JSON (fan-outs, creates); a SnaplabError with its code when it answers one. */
export async function ask<T>(
  base: string,
  node: string,
  token: string,
  caller: Caller,
  method: string,
  path: string,
  body?: unknown,
  timeoutMs = ASK_TIMEOUT_MS,
  /** the caller went: the request to the node is ended, so that the node ends its work too */
  signal?: AbortSignal,
): Promise<{ status: number; value: T; headers: IncomingHttpHeaders }> {
  return new Promise((resolve, reject) => {
    const text = body === undefined ? undefined : JSON.stringify(body);
    const headers: Record<string, string> = {
      authorization: `Bearer ${token}`,
      [CALLER_HEADER]: callerHeader(caller),
      ...(text ? { 'content-type': 'application/json' } : {}),
    };
    // a node partitioned away must not hold a request (or a whole fan-out) for TCP's minutes
    const signals = [...(timeoutMs > 0 ? [AbortSignal.timeout(timeoutMs)] : []), ...(signal ? [signal] : [])];
    const up = request(
      new URL(path, base),
      { method, headers, ...(signals.length ? { signal: AbortSignal.any(signals) } : {}) },
      (r) => {
        const parts: Buffer[] = [];
        r.on('data', (b: Buffer) => parts.push(b));
        r.once('error', (e) => reject(nodeUnavailable(node, e)));
        r.once('end', () => {
          const raw = Buffer.concat(parts).toString();
          let value: unknown = null;
          try {
            value = raw ? JSON.parse(raw) : null;
          } catch (e) {
            return reject(
              new SnaplabError(
                'NODE_UNAVAILABLE',
                `node ${node} answered ${r.statusCode} with no JSON`,
                'see its log',
                { cause: e },
              ),
            );
          }
          if ((r.statusCode ?? 500) >= 400) {
            const v = value as {
              code?: SnaplabError['code'];
              message?: string;
              hint?: string;
              limit?: string;
              operationId?: string;
            };
            const retry = Number(r.headers['retry-after']);
            return reject(
              Object.assign(
                new SnaplabError(v?.code ?? 'INTERNAL', v?.message ?? `node ${node} answered ${r.statusCode}`, v?.hint),
                {
                  status: r.statusCode,
                  ...(v?.limit ? { limit: v.limit } : {}),
                  ...(v?.operationId ? { operationId: v.operationId } : {}),
                  ...(retry > 0 ? { retryAfterS: retry } : {}),
                },
              ),
            );
          }
          resolve({ status: r.statusCode ?? 200, value: value as T, headers: r.headers });
        });
      },
    );
    connectDeadline(up);
    up.once('error', (e) => reject(Object.assign(nodeUnavailable(node, e), { connect: neverConnected(e) })));
    up.end(text);
  });
}

/** Join a client's WebSocket upgrade to the node's, byte for byte. */
export function forwardUpgrade(
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer,
  base: string,
  node: string,
  token: string,
  caller: Caller,
): void {
  if (socket.destroyed) return;
  const up = request(new URL(upstreamPath(req.url!), base), {
    method: 'GET',
    headers: upstreamHeaders(req.headers, token, caller, true),
  });
  const fail = (status: number, body: string): void => {
    if (!socket.writable) return void socket.destroy();
    socket.end(
      `HTTP/1.1 ${status} ${status === 503 ? 'Service Unavailable' : 'Error'}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
    );
  };
  connectDeadline(up);
  // the client gone before the node switched: the node's side goes too
  socket.once('close', () => up.destroy());
  up.once('upgrade', (r, upSocket, upHead) => {
    if (socket.destroyed) return void upSocket.destroy();
    const lines = [`HTTP/1.1 101 Switching Protocols`];
    for (let i = 0; i < r.rawHeaders.length; i += 2) lines.push(`${r.rawHeaders[i]}: ${r.rawHeaders[i + 1]}`);
    socket.write(`${lines.join('\r\n')}\r\n\r\n`);
    if (upHead.length) socket.write(upHead);
    if (head.length) upSocket.write(head);
    upSocket.pipe(socket).pipe(upSocket);
    // either side gone: the other is closed at once (a client sees its stream end, the node its reader go)
    const end = (): void => {
      socket.destroy();
      upSocket.destroy();
    };
    upSocket.once('close', end);
    socket.once('close', end);
    upSocket.once('error', end);
    socket.once('error', end);
  });
  // refused before the switch (404, 401, 409…): the node's answer as it gave it
  up.once('response', (r) => {
    const parts: Buffer[] = [];
    r.on('data', (b: Buffer) => parts.push(b));
    r.once('end', () => fail(r.statusCode ?? 502, Buffer.concat(parts).toString()));
  });
  up.once('error', (e) => {
    const err = nodeUnavailable(node, e);
    fail(503, JSON.stringify(err.toJSON()));
  });
  up.end();
}

const MAX_JSON = 8 << 20;

/** A request's JSON object body (at most 8 MiB; none is `{}`). */
export async function readJson(req: IncomingMessage): Promise<Record<string, unknown>> {
  const parts: Buffer[] = [];
  let size = 0;
  for await (const b of req) {
    size += (b as Buffer).length;
    if (size > MAX_JSON) throw new SnaplabError('PAYLOAD_TOO_LARGE', 'a JSON body over 8 MiB', 'send files as streams');
    parts.push(b as Buffer);
  }
  if (!size) return {};
  try {
    const v = JSON.parse(Buffer.concat(parts).toString()) as unknown;
    if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new SyntaxError('not an object');
    return v as Record<string, unknown>;
  } catch (e) {
    throw new SnaplabError(
      'BAD_INPUT',
      `invalid JSON body: ${(e as Error).message}`,
      'send a JSON object (content-type: application/json)',
      { cause: e },
    );
  }
}
