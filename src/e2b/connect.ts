/**
 * The Connect protocol as E2B's SDK speaks it to envd (connectrpc.com/docs/protocol), JSON codec
 * over HTTP/1.1: a unary call is a POST of `application/json` answered with JSON (an error: an
 * HTTP status and `{code, message}`); a server-streaming call is a POST of
 * `application/connect+json` whose body is one envelope (a flags byte, a 4-byte big-endian
 * length, the JSON message), answered 200 with envelopes, the last flagged end-of-stream (0x02)
 * and carrying `{}` or `{error: {code, message}}`.
 */
import type { FastifyReply } from 'fastify';
import type { Readable } from 'node:stream';
import { SnaplabError, isSnaplabError, type ErrorCode } from '../errors.js';

/** Connect's error codes and the HTTP status each has on a unary answer. */
export const CONNECT_STATUS = {
  invalid_argument: 400,
  unauthenticated: 401,
  permission_denied: 403,
  not_found: 404,
  already_exists: 409,
  failed_precondition: 412,
  resource_exhausted: 429,
  internal: 500,
  unknown: 500,
  unimplemented: 501,
  unavailable: 503,
  deadline_exceeded: 504,
} as const;

export type ConnectCode = keyof typeof CONNECT_STATUS;

/** An error an envd call answers with, in Connect's terms. */
export class ConnectError extends Error {
  constructor(
    readonly code: ConnectCode,
    message: string,
  ) {
    super(message);
  }
}

const BY_SNAPLAB: Partial<Record<ErrorCode, ConnectCode>> = {
  BAD_INPUT: 'invalid_argument',
  UNAUTHORIZED: 'unauthenticated',
  // a user removed from the machine since the front read its users: envd's "invalid username"
  USER_NOT_FOUND: 'unauthenticated',
  FORBIDDEN: 'permission_denied',
  ABOVE_CEILING: 'permission_denied',
  SANDBOX_NOT_FOUND: 'not_found',
  FILE_NOT_FOUND: 'not_found',
  PROCESS_NOT_FOUND: 'not_found',
  PROCESS_BUSY: 'failed_precondition',
  SANDBOX_BUSY: 'failed_precondition',
  FILE_ERROR: 'failed_precondition',
  DISK_FULL: 'failed_precondition',
  QUOTA_EXCEEDED: 'resource_exhausted',
  SANDBOX_PAUSED: 'unavailable',
  SANDBOX_STOPPED: 'unavailable',
  SANDBOX_DEAD: 'unavailable',
  TIMEOUT: 'deadline_exceeded',
};

/**
 * A file call on the wrong kind of path (a directory read or written as a file, a file watched or
 * listed as a directory): envd's invalid_argument (its HTTP 400) for those calls; elsewhere (Stat,
 * Remove, MakeDir, Move) envd's words differ, and the error is mapped as any other.
 */
export function wrongKind(e: unknown): boolean {
  return isSnaplabError(e, 'FILE_ERROR') && /\((EISDIR|ENOTDIR)\)$/.test(e.message);
}

/** An error of a call where envd checks the kind of path (a read, a write, a listing, a watch): invalid_argument then. */
export function kindChecked(e: unknown): unknown {
  return wrongKind(e) ? new ConnectError('invalid_argument', (e as Error).message) : e;
}

/** Any error as Connect's (a SnaplabError by its code; anything else is internal). */
export function toConnectError(e: unknown): ConnectError {
  if (e instanceof ConnectError) return e;
  if (isSnaplabError(e)) return new ConnectError(BY_SNAPLAB[e.code] ?? 'internal', e.message);
  return new ConnectError('internal', e instanceof Error ? e.message : String(e));
}

/** Read a whole request body (a raw stream), at most `max` bytes. */
export async function readBody(body: unknown, max = 16 << 20): Promise<Buffer> {
  if (Buffer.isBuffer(body)) return body;
  if (!body || typeof (body as Readable).on !== 'function') return Buffer.alloc(0);
  const parts: Buffer[] = [];
  let size = 0;
  for await (const chunk of body as Readable) {
    size += (chunk as Buffer).length;
    if (size > max)
      throw new SnaplabError('PAYLOAD_TOO_LARGE', `a request body over ${max} bytes`, 'send less at once');
    parts.push(chunk as Buffer);
  }
  return Buffer.concat(parts);
}

/** The message of a streaming request: its one envelope's JSON. */
export function unenvelope(raw: Buffer): unknown {
  if (raw.length < 5) throw new ConnectError('invalid_argument', 'a streaming request without its envelope');
  const len = raw.readUInt32BE(1);
  if (raw[0]! & 0x01) throw new ConnectError('unimplemented', 'compressed messages are not supported');
  return parseJson(raw.subarray(5, 5 + len));
}

export function parseJson(b: Buffer): unknown {
  try {
    return b.length ? JSON.parse(b.toString('utf8')) : {};
  } catch {
    throw new ConnectError('invalid_argument', 'the message is not JSON');
  }
}

export function envelope(message: unknown, end = false): Buffer {
  const json = Buffer.from(JSON.stringify(message));
  const head = Buffer.alloc(5);
  head[0] = end ? 0x02 : 0x00;
  head.writeUInt32BE(json.length, 1);
  return Buffer.concat([head, json]);
}

/** A unary call's error answer. */
export function sendUnaryError(reply: FastifyReply, e: unknown): FastifyReply {
  const err = toConnectError(e);
  return reply.code(CONNECT_STATUS[err.code]).type('application/json').send({ code: err.code, message: err.message });
}

/**
 * A server stream on a hijacked reply: `send` writes a message, `end` the end-of-stream envelope
 * (with an error, or none). `closed` tells when the client went away.
 */
export interface ServerStream {
  send(message: unknown): void;
  end(error?: unknown): void;
  /** bytes written and not yet taken by the client */
  readonly unread: number;
  /** let go of a client that does not read: the connection closed, what waits for it dropped */
  drop(): void;
  /** once what was written has all been taken by the client (at once if it has) */
  onDrain(fn: () => void): void;
  readonly closed: boolean;
  onClose(fn: () => void): void;
}

export function openStream(reply: FastifyReply): ServerStream {
  reply.hijack();
  const res = reply.raw;
  res.writeHead(200, { 'content-type': 'application/connect+json', 'cache-control': 'no-store' });
  // a client gone before the stream opened: nothing is sent, `closed` says so, and what waits for
  // the close runs at once (its 'close' came before anyone listened)
  let gone = res.destroyed || res.socket?.destroyed === true;
  let ended = gone;
  const closers: (() => void)[] = [];
  res.on('close', () => {
    gone = ended = true;
    for (const fn of closers) fn();
  });
  return {
    send(message) {
      if (!ended) res.write(envelope(message));
    },
    end(error) {
      if (ended) return;
      ended = true;
      const err = error === undefined ? undefined : toConnectError(error);
      res.end(envelope(err ? { error: { code: err.code, message: err.message } } : {}, true));
    },
    get closed() {
      return ended;
    },
    get unread() {
      return res.writableLength;
    },
    drop() {
      ended = true;
      res.destroy();
    },
    onDrain(fn) {
      if (res.writableLength === 0 || res.destroyed) fn();
      else res.once('drain', fn);
    },
    onClose(fn) {
      if (gone) fn();
      else closers.push(fn);
    },
  };
}

/** The longest wait a Node timer keeps (a longer one fires at once): ~24.8 days. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * A deadline the client asked for (`Connect-Timeout-Ms`), or undefined: none asked, or one longer
 * than a timer holds (a wait of ~25 days is none; Node would fire it after 1 ms).
 */
export function deadlineOf(header: string | string[] | undefined): number | undefined {
  const n = Number(Array.isArray(header) ? header[0] : header);
  // whole milliseconds (a deadline is one), rounded up: never shorter than asked
  return Number.isFinite(n) && n > 0 && n <= MAX_TIMER_MS ? Math.ceil(n) : undefined;
}

/** envd's keepalive when a stream's request names none, or none it can read (a whole number of seconds) */
const DEFAULT_KEEPALIVE_S = 90;

/**
 * How often a stream sends a keepalive (`Keepalive-Ping-Interval`, whole seconds, as the SDK asks:
 * 50), in ms: as envd, 90 s when the header is absent or not a whole number; never more often than
 * once a second (envd's 0 is no interval at all), never past what a timer holds.
 */
export function keepaliveMs(header: string | string[] | undefined): number {
  const text = (Array.isArray(header) ? header[0] : header)?.trim() ?? '';
  const s = /^[+-]?\d+$/.test(text) ? Number(text) : DEFAULT_KEEPALIVE_S;
  return Math.min(MAX_TIMER_MS, Math.max(1, s) * 1000);
}
