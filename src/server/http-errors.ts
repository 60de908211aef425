/**
 * How a SnaplabError travels over HTTP: its code picks the status, the body is the error's JSON
 * (code, message, hint) with the operation id when a traced operation failed. The remote client
 * turns the body back into the same SnaplabError, so callers handle one error type either way.
 */
import type { FastifyError, FastifyReply } from 'fastify';
import { LimitError, SnaplabError, isSnaplabError, type ErrorCode } from '../errors.js';

const STATUS: Partial<Record<ErrorCode, number>> = {
  BAD_INPUT: 400,
  BAD_SIZE: 400,
  BAD_NAME: 400,
  USER_NOT_FOUND: 400,
  SCENARIO_INVALID: 400,
  BAD_IMAGE: 400,
  IMAGE_UNSAFE: 400,
  IMAGE_TOO_LARGE: 413,
  UNAUTHORIZED: 401,
  FORBIDDEN: 403,
  ABOVE_CEILING: 403,
  SANDBOX_NOT_FOUND: 404,
  SNAPSHOT_NOT_FOUND: 404,
  IMAGE_NOT_FOUND: 404,
  POOL_NOT_FOUND: 404,
  SCENARIO_NOT_FOUND: 404,
  OPERATION_NOT_FOUND: 404,
  KEY_NOT_FOUND: 404,
  PROCESS_NOT_FOUND: 404,
  FILE_NOT_FOUND: 404,
  RESULTS_NOT_FOUND: 404,
  UI_NOT_BUILT: 404,
  BAD_RESULTS: 422,
  SANDBOX_EXISTS: 409,
  EGRESS_OFF: 409,
  SNAPSHOT_EXISTS: 409,
  IMAGE_EXISTS: 409,
  IMAGE_IN_USE: 409,
  POOL_EXISTS: 409,
  SCENARIO_EXISTS: 409,
  KEY_EXISTS: 409,
  PROCESS_BUSY: 409,
  SANDBOX_PAUSED: 409,
  SANDBOX_RUNNING: 409,
  SANDBOX_STOPPED: 409,
  SANDBOX_BUSY: 409,
  SANDBOX_DEAD: 409,
  PORT_IN_USE: 409,
  FILE_ERROR: 409,
  DISK_FULL: 507,
  QUOTA_EXCEEDED: 429,
  NO_USERNS_SLOT: 503,
  HOST_SHORT_OF_MEMORY: 503,
  STORAGE_UNAVAILABLE: 503,
  DRIVER_UNAVAILABLE: 503,
  MISSING_TOOL: 503,
  CLUSTER_UNAVAILABLE: 503,
  NODE_UNAVAILABLE: 503,
  HOST_UNREADABLE: 503,
  NODE_EXISTS: 409,
  SANDBOX_LOST: 410,
  TIMEOUT: 504,
  ABORTED: 499,
  PAYLOAD_TOO_LARGE: 413,
  UNSUPPORTED_MEDIA: 415,
};

export function statusOf(code: ErrorCode): number {
  return STATUS[code] ?? 500;
}

const QUOTA_FLAG = {
  maxSandboxes: "the key's --max-sandboxes",
  maxExecs: "the key's --max-execs",
  maxStreams: "the daemon's --max-streams-per-key",
};

/** A quota of concurrent things refused: 429 with Retry-After and which limit it was. */
export class QuotaError extends LimitError {
  constructor(limit: 'maxSandboxes' | 'maxExecs' | 'maxStreams', message: string, retryAfterS = 1) {
    super(
      'QUOTA_EXCEEDED',
      limit,
      message,
      `wait for one to end (Retry-After), or raise ${QUOTA_FLAG[limit]}`,
      retryAfterS,
    );
  }
}

export function sendError(reply: FastifyReply, e: unknown): FastifyReply {
  const err = toSnaplab(e);
  const body: Record<string, unknown> = err.toJSON();
  const op = (err as SnaplabError & { operationId?: string }).operationId;
  if (op) body.operationId = op;
  // a LimitError's, or one a node gave a cluster gateway (cluster/proxy.ts keeps them on the error)
  const limit = err as SnaplabError & Partial<Pick<LimitError, 'limit' | 'retryAfterS'>>;
  if (limit.limit !== undefined) body.limit = limit.limit;
  if (limit.retryAfterS !== undefined) void reply.header('retry-after', String(limit.retryAfterS));
  return reply.status(statusOf(err.code)).send(body);
}

const clip = (s: string): string => (s.length > 120 ? `${s.slice(0, 117)}...` : s);

/**
 * A path Fastify's router refused (its frameworkErrors: a part longer than `maxParamLength`, bad
 * percent-encoding) as a BAD_INPUT that echoes only the path's start.
 */
export function routingError(e: FastifyError, maxParamLength: number): SnaplabError {
  if (e.code === 'FST_ERR_MAX_PARAM_LENGTH')
    return new SnaplabError(
      'BAD_INPUT',
      `a part of the path is longer than any id or name: ${clip(e.message)}`,
      `a part of the path is at most ${maxParamLength} characters here (ids and names at most 100)`,
      { cause: e },
    );
  if (e.code === 'FST_ERR_BAD_URL')
    return new SnaplabError('BAD_INPUT', clip(e.message), 'percent-encode the path as URLs are', { cause: e });
  return toSnaplab(e);
}

/** Fastify's own errors (schema validation, a body too large, bad JSON, a path it cannot route) as SnaplabErrors. */
export function toSnaplab(e: unknown): SnaplabError {
  if (isSnaplabError(e)) return e;
  const fe = e as FastifyError;
  if (fe?.validation)
    return new SnaplabError(
      'BAD_INPUT',
      `invalid request: ${fe.message}`,
      'see /openapi.json for what the endpoint takes',
      { cause: e },
    );
  if (fe?.statusCode === 413)
    return new SnaplabError(
      'PAYLOAD_TOO_LARGE',
      fe.message,
      'JSON bodies are limited to 8 MiB: send files as streams (PUT /sandboxes/{id}/files)',
      { cause: e },
    );
  if (fe?.statusCode === 415)
    return new SnaplabError(
      'UNSUPPORTED_MEDIA',
      fe.message,
      'JSON bodies are application/json; files application/octet-stream; trees application/x-tar',
      { cause: e },
    );
  if (fe?.statusCode && fe.statusCode >= 400 && fe.statusCode < 500)
    return new SnaplabError('BAD_INPUT', fe.message, 'see /openapi.json', { cause: e });
  return new SnaplabError(
    'INTERNAL',
    (e as Error)?.message ?? String(e),
    'this is a bug in snaplab; the daemon log has the details',
    { cause: e },
  );
}
