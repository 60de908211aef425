/**
 * API keys: `snaplab key create NAME` prints a key once; the store keeps its sha256 only. A key
 * has scopes (read: GET; exec: sandboxes, their commands and files; admin: images, pools,
 * scenarios, keys) and optional quotas. Requests on the Unix socket carry no key: the socket is
 * mode 0600, whoever can open it is root already.
 */
import { timingSafeEqual } from 'node:crypto';
import { SnaplabError } from '../errors.js';
import { SCOPES, type KeyRing } from '../lab/keys.js';
import type { ApiKeyRecord, Scope } from '../store/records.js';
import { NO_CEILINGS, checkCeilings, resolveCeilings, type Ceilings } from '../lab/ceilings.js';
import type { CallerInfo } from '../sdk/api.js';

export { hashKey, newToken, parseScopes, SCOPES } from '../lab/keys.js';

/** Who is calling: a key's name, scopes and quotas ('local' on the Unix socket: every scope, no quota). */
export interface Caller {
  key: string;
  /** the key's hash: a long-lived connection checks that the key still exists */
  hash?: string;
  scopes: ReadonlySet<Scope>;
  maxSandboxes: number | null;
  maxExecs: number | null;
  /**
   * what it may ask of the host, as the key was made (null: lifted; not named: the defaults of the
   * host that checks, lab/ceilings.ts); the Unix socket's caller has none
   */
  ceilings: Partial<Ceilings>;
  /** a caller a cluster gateway vouches for: the gateway checked its key (and checks it still) */
  viaGateway?: true;
}

export const LOCAL: Caller = {
  key: 'local',
  scopes: new Set(SCOPES),
  maxSandboxes: null,
  maxExecs: null,
  ceilings: NO_CEILINGS,
};

/** A caller as GET /whoami and the Lab API's `whoami()` tell it (ceilings resolved: the defaults filled in). */
export function describeCaller(caller: Caller): CallerInfo {
  return {
    key: caller.key,
    scopes: [...caller.scopes],
    maxSandboxes: caller.maxSandboxes ?? null,
    maxExecs: caller.maxExecs ?? null,
    ceilings: caller.key === LOCAL.key ? { ...NO_CEILINGS } : resolveCeilings(caller.ceilings),
  };
}

/** The caller a bearer token stands for, or an UNAUTHORIZED error. */
export function authenticate(keys: KeyRing, header: string | undefined, queryToken: unknown): Caller {
  const m = /^Bearer\s+(\S+)$/i.exec(header ?? '');
  const token = m?.[1] ?? (typeof queryToken === 'string' ? queryToken : undefined);
  if (!token)
    throw new SnaplabError(
      'UNAUTHORIZED',
      'no API key given',
      'send `Authorization: Bearer KEY` (make one with `snaplab key create NAME`)',
    );
  return callerOf(keys, token);
}

/**
 * The caller a key stands for now (UNAUTHORIZED when there is none: never made, or removed since).
 * Every request is asked this: a route's, and each call of an in-process keyed lab (keyed-lab.ts).
 */
export function callerOf(keys: KeyRing, token: string): Caller {
  const k = keys.find(token);
  if (!k) {
    throw new SnaplabError(
      'UNAUTHORIZED',
      'the API key is not known',
      'check the key, or make a new one with `snaplab key create NAME`',
    );
  }
  return keyCaller(k);
}

/** The caller a key stands for (a daemon's, or a cluster's from etcd). */
export function keyCaller(k: ApiKeyRecord): Caller {
  return {
    key: k.name,
    hash: k.hash,
    scopes: new Set(k.scopes),
    maxSandboxes: k.maxSandboxes,
    maxExecs: k.maxExecs,
    ceilings: k.ceilings ?? {}, // keys written before ceilings (etcd): the defaults
  };
}

/**
 * What a cluster key owns as, on nodes: `cluster:NAME` (a key name has no colon), so a node's own
 * key of the same name is another owner and sees none of them.
 */
export const clusterOwner = (key: string): string => `cluster:${key}`;

/** The header a gateway names its caller in, beside the cluster token (docs/cluster.md). */
export const CALLER_HEADER = 'x-snaplab-caller';

/**
 * A gateway's request: the cluster token as its bearer key, and the caller it authenticated in
 * CALLER_HEADER. Quotas of sandboxes are the gateway's to count (cluster-wide); execs count here.
 */
export function gatewayCaller(
  token: string,
  header: string | undefined,
  caller: string | string[] | undefined,
): Caller | undefined {
  const m = /^Bearer\s+(\S+)$/i.exec(header ?? '');
  const given = Buffer.from(m?.[1] ?? '');
  const want = Buffer.from(token);
  if (given.length !== want.length || !timingSafeEqual(given, want)) return undefined;
  const bad = (): never => {
    throw new SnaplabError(
      'UNAUTHORIZED',
      `a gateway request without a valid ${CALLER_HEADER}`,
      'this is a bug of the gateway',
    );
  };
  if (typeof caller !== 'string') return bad();
  let c: { key?: unknown; scopes?: unknown; maxExecs?: unknown; ceilings?: unknown };
  try {
    c = JSON.parse(Buffer.from(caller, 'base64url').toString()) as typeof c;
  } catch {
    return bad();
  }
  if (typeof c?.key !== 'string' || !Array.isArray(c.scopes)) return bad();
  const maxExecs = typeof c.maxExecs === 'number' ? c.maxExecs : null;
  return {
    key: clusterOwner(c.key),
    scopes: new Set((c.scopes as Scope[]).filter((s) => SCOPES.includes(s))),
    maxSandboxes: null,
    maxExecs,
    // as the key was made; what is not a valid set of them is the defaults
    ceilings: validCeilings(c.ceilings),
    viaGateway: true,
  };
}

export function requireScope(caller: Caller, scope: Scope): void {
  if (!caller.scopes.has(scope)) {
    throw new SnaplabError(
      'FORBIDDEN',
      `key ${caller.key} has no ${scope} scope`,
      `make a key with \`--scope ${scope}\` for this call`,
    );
  }
}

function validCeilings(c: unknown): Partial<Ceilings> {
  if (typeof c !== 'object' || c === null) return {};
  try {
    return checkCeilings(c as Partial<Ceilings>);
  } catch {
    return {};
  }
}
