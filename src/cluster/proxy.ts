/**
 * A gateway's requests to nodes: the client's request passed on as it comes (bodies and answers
 * streamed, never gathered), with the cluster token and the caller instead of the client's key.
 * WebSocket upgrades are joined byte for byte once the node has switched protocols, so an exec
 * stream or a terminal has the node's flow control end to end and nothing is buffered here.
 */
import { request, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { SnaplabError } from '../errors.js';
import { CALLER_HEADER, type Caller } from '../server/keys.js';
import { statusOf } from '../server/http-errors.js';
import { unavailable } from './store.js';

/** hop-by-hop headers (RFC 9110 §7.6.1) and those the gateway sets itself */
const DROP = new Set(['authorization', 'host', 'connection', 'keep-alive', 'proxy-connection', 'te', 'trailer', 'transfer-encoding', 'upgrade', CALLER_HEADER]);

export function callerHeader(c: Caller): string {
  return Buffer.from(JSON.stringify({ key: c.key, scopes: [...c.scopes], maxExecs: c.maxExecs })).toString('base64url');
}

export function upstreamHeaders(h: IncomingHttpHeaders, token: string, caller: Caller, upgrade = false): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(h)) if (v !== undefined && !DROP.has(k) && !(upgrade ? false : k.startsWith('sec-websocket'))) out[k] = v;
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

export function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  if (res.headersSent) return void res.destroy();
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(text), ...headers }).end(text);
}

/** etcd's client errors (GRPC…, Etcd…): the store did not answer */
const fromEtcd = (e: unknown): boolean => e instanceof Error && /^(GRPC|Etcd)/.test(e.constructor.name);

export function sendError(res: ServerResponse, e: unknown): void {
  const err = e instanceof SnaplabError ? e
    : fromEtcd(e) ? unavailable(e, 'a gateway request')
    : new SnaplabError('INTERNAL', (e as Error)?.message ?? String(e), 'this is a bug in snaplab; the gateway log has the details');
  const extra = (err as SnaplabError & { retryAfterS?: number; limit?: string });
  sendJson(res, statusOf(err.code), { ...err.toJSON(), ...(extra.limit ? { limit: extra.limit } : {}) }, extra.retryAfterS ? { 'retry-after': String(extra.retryAfterS) } : {});
}

export function nodeUnavailable(node: string, e: Error, during = 'the request'): SnaplabError {
  return new SnaplabError('NODE_UNAVAILABLE', `node ${node} did not answer ${during}: ${e.message}`, 'it may be restarting or gone; `snaplab cluster nodes` shows the nodes that are up', { cause: e });
}

/** A connection that never reached the node: nothing was started there. */
export const neverConnected = (e: unknown): boolean => ['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'ECONNRESET_BEFORE'].includes((e as NodeJS.ErrnoException)?.code ?? '');

/** Pass a request on to `base` (the node's URL) and its answer back, both streamed. */
export function forward(req: IncomingMessage, res: ServerResponse, base: string, node: string, token: string, caller: Caller, body?: Buffer): void {
  const up = request(new URL(upstreamPath(req.url!), base), { method: req.method, headers: upstreamHeaders(req.headers, token, caller) }, (r) => {
    res.writeHead(r.statusCode ?? 502, r.headers);
    r.pipe(res);
    r.once('error', () => res.destroy());
  });
  up.once('error', (e) => (res.headersSent ? res.destroy() : sendError(res, nodeUnavailable(node, e))));
  // a client that goes away takes the request with it (the node kills a one-shot exec then)
  res.once('close', () => { if (!res.writableFinished) up.destroy(); });
  if (body) up.end(body);
  else req.pipe(up);
}

/** Ask a node for JSON (fan-outs, creates); a SnaplabError with its code when it answers one. */
export async function ask<T>(base: string, node: string, token: string, caller: Caller, method: string, path: string, body?: unknown): Promise<{ status: number; value: T; headers: IncomingHttpHeaders }> {
  return new Promise((resolve, reject) => {
    const text = body === undefined ? undefined : JSON.stringify(body);
    const headers: Record<string, string> = { authorization: `Bearer ${token}`, [CALLER_HEADER]: callerHeader(caller), ...(text ? { 'content-type': 'application/json' } : {}) };
    const up = request(new URL(path, base), { method, headers }, (r) => {
      const parts: Buffer[] = [];
      r.on('data', (b: Buffer) => parts.push(b));
      r.once('error', (e) => reject(nodeUnavailable(node, e)));
      r.once('end', () => {
        const raw = Buffer.concat(parts).toString();
        let value: unknown = null;
        try {
          value = raw ? JSON.parse(raw) : null;
        } catch {
          return reject(new SnaplabError('NODE_UNAVAILABLE', `node ${node} answered ${r.statusCode} with no JSON`, 'see its log'));
        }
        if ((r.statusCode ?? 500) >= 400) {
          const v = value as { code?: SnaplabError['code']; message?: string; hint?: string };
          return reject(Object.assign(new SnaplabError(v?.code ?? 'INTERNAL', v?.message ?? `node ${node} answered ${r.statusCode}`, v?.hint), { status: r.statusCode }));
        }
        resolve({ status: r.statusCode ?? 200, value: value as T, headers: r.headers });
      });
    });
    up.once('error', (e) => reject(Object.assign(nodeUnavailable(node, e), { connect: neverConnected(e) })));
    up.end(text);
  });
}

/** Join a client's WebSocket upgrade to the node's, byte for byte. */
export function forwardUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer, base: string, node: string, token: string, caller: Caller): void {
  const up = request(new URL(upstreamPath(req.url!), base), { method: 'GET', headers: upstreamHeaders(req.headers, token, caller, true) });
  const fail = (status: number, body: string): void => {
    if (!socket.writable) return void socket.destroy();
    socket.end(`HTTP/1.1 ${status} ${status === 503 ? 'Service Unavailable' : 'Error'}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
  };
  up.once('upgrade', (r, upSocket, upHead) => {
    const lines = [`HTTP/1.1 101 Switching Protocols`];
    for (let i = 0; i < r.rawHeaders.length; i += 2) lines.push(`${r.rawHeaders[i]}: ${r.rawHeaders[i + 1]}`);
    socket.write(`${lines.join('\r\n')}\r\n\r\n`);
    if (upHead.length) socket.write(upHead);
    if (head.length) upSocket.write(head);
    upSocket.pipe(socket).pipe(upSocket);
    // either side gone: the other is closed at once (a client sees its stream end, the node its reader go)
    const end = (): void => { socket.destroy(); upSocket.destroy(); };
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
  socket.once('error', () => up.destroy());
  up.end();
}
