/**
 * API keys, kept in the home's store: `snaplab key create NAME` prints a key once; only its
 * sha256 is kept. A key has scopes (read: GET; exec: sandboxes, their commands and files; admin:
 * images, pools, scenarios, keys) and optional quotas. The daemon checks requests against them
 * (src/server/keys.ts); the embedded Lab gives them as `lab.keys`.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { SnaplabError } from '../errors.js';
import { checkName } from './names.js';
import { checkCeilings } from './ceilings.js';
import type { Store } from '../store/store.js';
import type { ApiKeyRecord, Ceilings, Scope } from '../store/records.js';

/** What a key is made with: scopes, quotas of things at once, and ceilings (lab/ceilings.ts). */
export interface KeyOptions {
  scopes?: Scope[];
  maxSandboxes?: number;
  maxExecs?: number;
  ceilings?: Partial<Ceilings>;
  /**
   * shaped as E2B's keys (`e2b_` and 40 hex digits), for the E2B-compatible front (docs/e2b.md):
   * some versions of E2B's SDK refuse a key of another shape. Still a key like any other
   */
  e2b?: boolean;
}

export const SCOPES: readonly Scope[] = ['read', 'exec', 'admin'];
const PREFIX = 'snaplab_';

export const hashKey = (token: string): string => createHash('sha256').update(token).digest('hex');

export function parseScopes(text: string): Scope[] {
  const scopes = text
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  for (const s of scopes) {
    if (!SCOPES.includes(s as Scope))
      throw new SnaplabError(
        'BAD_INPUT',
        `unknown scope ${JSON.stringify(s)}`,
        `scopes are ${SCOPES.join(', ')} (comma-separated)`,
      );
  }
  if (!scopes.length) throw new SnaplabError('BAD_INPUT', 'no scope given', `give one or more of ${SCOPES.join(', ')}`);
  return [...new Set(scopes)] as Scope[];
}

/** A new API key: shown once, only its hash kept. */
export const newToken = (e2b = false): string =>
  e2b ? `e2b_${randomBytes(20).toString('hex')}` : PREFIX + randomBytes(32).toString('base64url');

export class KeyRing {
  /** @internal */
  constructor(private readonly store: Store) {}

  /** A new key: its token (shown once) and its record. */
  create(name: string, opts: KeyOptions = {}): { token: string; key: ApiKeyRecord } {
    return createKey(this.store, name, opts);
  }

  /** Every key, without its hash. */
  list(): Omit<ApiKeyRecord, 'hash'>[] {
    return this.store.listKeys().map(({ hash: _h, ...k }) => k);
  }

  remove(name: string): void {
    if (!this.store.deleteKey(name))
      throw new SnaplabError('KEY_NOT_FOUND', `no key named ${name}`, 'see `snaplab key ls`');
  }

  /** The key a token is, or undefined (compared by hash, again in constant time). */
  find(token: string): ApiKeyRecord | undefined {
    const hash = hashKey(token);
    const k = this.store.getKeyByHash(hash);
    return k && timingSafeEqual(Buffer.from(k.hash, 'hex'), Buffer.from(hash, 'hex')) ? k : undefined;
  }

  /** Is the key of this hash still there (a long-lived connection's key may have been removed)? */
  has(hash: string): boolean {
    return this.store.getKeyByHash(hash) !== undefined;
  }
}

function createKey(store: Store, name: string, opts: KeyOptions = {}): { token: string; key: ApiKeyRecord } {
  checkName('key', name);
  // the Unix socket's callers own their sandboxes as "local"
  if (name === 'local')
    throw new SnaplabError('BAD_NAME', 'the key name "local" is the Unix socket\'s', 'pick another name');
  if (store.listKeys().some((k) => k.name === name))
    throw new SnaplabError(
      'KEY_EXISTS',
      `a key named ${name} exists`,
      `remove it first with \`snaplab key rm ${name}\`, or pick another name`,
    );
  const token = newToken(opts.e2b);
  const key: ApiKeyRecord = {
    name,
    hash: hashKey(token),
    scopes: opts.scopes ?? ['read', 'exec'],
    maxSandboxes: opts.maxSandboxes ?? null,
    maxExecs: opts.maxExecs ?? null,
    ceilings: checkCeilings(opts.ceilings ?? {}),
    createdAt: Date.now(),
  };
  store.insertKey(key);
  return { token, key };
}
