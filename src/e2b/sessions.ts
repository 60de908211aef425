/**
 * The E2B front's sessions: a sandbox's envd access token and the API key that drives it (the
 * key that made it or last connected to it). Kept in the daemon's store (e2b_sessions, which the
 * API never shows), so that a daemon restart leaves a client's sandbox, its token and its signed
 * URLs working. Each row is sealed (AES-256-GCM) with a secret of the home's
 * (`e2b-sessions.key`, mode 0600), so that a copy of state.db alone holds neither keys nor tokens:
 * the key table keeps only hashes, and this one must not undo that.
 *
 * And the signatures of `downloadUrl`/`uploadUrl`, as envd checks them: `v1_` and the base64 (no
 * padding) of sha256(`path:operation:username:token[:expiration]`).
 */
import { createCipheriv, createDecipheriv, createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { linkSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import type { SessionRows } from '../store/records.js';
import { SnaplabError } from '../errors.js';

export interface Session {
  apiKey: string;
  accessToken: string;
}

/** Where sessions outlive the front: loaded when it starts, saved as they change. */
export interface SessionStore {
  load(): Map<string, Session>;
  save(id: string, s: Session): void;
  drop(id: string): void;
}

/** The home's sealing secret: made (32 random bytes, 0600) the first time, then read. */
function secretOf(file: string): Buffer {
  const hint = 'check the home’s permissions; removing the file loses the E2B sessions (connect again)';
  // whole or not at all: written aside, then linked in (a crash between leaves no empty secret;
  // a daemon that linked first wins, and both read its)
  const aside = `${file}.tmp-${process.pid}`;
  try {
    writeFileSync(aside, randomBytes(32), { mode: 0o600 });
    linkSync(aside, file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EEXIST')
      throw new SnaplabError('DAEMON_ERROR', `cannot write ${file}`, hint, { cause: e });
  } finally {
    rmSync(aside, { force: true });
  }
  let b: Buffer;
  try {
    b = readFileSync(file);
  } catch (e) {
    throw new SnaplabError('DAEMON_ERROR', `cannot read ${file}`, hint, { cause: e });
  }
  if (b.length !== 32) throw new SnaplabError('DAEMON_ERROR', `${file} is not a 32-byte secret`, hint);
  return b;
}

function seal(secret: Buffer, id: string, s: Session): string {
  const iv = randomBytes(12);
  const c = createCipheriv('aes-256-gcm', secret, iv);
  c.setAAD(Buffer.from(id));
  const body = Buffer.concat([c.update(JSON.stringify(s)), c.final()]);
  return Buffer.concat([iv, c.getAuthTag(), body]).toString('base64');
}

/** A row's session, or undefined when it does not open (another secret, a row moved to another id). */
function unseal(secret: Buffer, id: string, sealed: string): Session | undefined {
  const b = Buffer.from(sealed, 'base64');
  if (b.length < 29) return undefined;
  try {
    const d = createDecipheriv('aes-256-gcm', secret, b.subarray(0, 12));
    d.setAAD(Buffer.from(id));
    d.setAuthTag(b.subarray(12, 28));
    const s = JSON.parse(Buffer.concat([d.update(b.subarray(28)), d.final()]).toString('utf8')) as Session;
    return typeof s.apiKey === 'string' && typeof s.accessToken === 'string' ? s : undefined;
  } catch {
    // a row that does not open is no session: it is dropped where it is loaded
    return undefined;
  }
}

/** Sessions kept in `rows`, sealed with the secret in `secretFile`. */
export function sealedSessions(rows: SessionRows, secretFile: string): SessionStore {
  const secret = secretOf(secretFile);
  return {
    load() {
      const out = new Map<string, Session>();
      for (const r of rows.list()) {
        const s = unseal(secret, r.id, r.sealed);
        if (s) out.set(r.id, s);
        else rows.delete(r.id);
      }
      return out;
    },
    save: (id, s) => rows.put(id, seal(secret, id, s)),
    drop: (id) => rows.delete(id),
  };
}

/** Sessions in memory only (a front without a store: they end with it). */
export const memorySessions: SessionStore = { load: () => new Map(), save: () => {}, drop: () => {} };

export type Operation = 'read' | 'write';

/** The signature envd expects of a signed URL (E2B's SDK `getSignature`). */
export function signatureOf(path: string, op: Operation, user: string, token: string, expiration?: string): string {
  const raw = [path, op, user, token, ...(expiration === undefined ? [] : [expiration])].join(':');
  return `v1_${createHash('sha256').update(raw).digest('base64').replace(/=+$/, '')}`;
}

/**
 * A sandbox's traffic access token (`trafficAccessToken` in create and connect answers), which
 * E2B's code-interpreter SDK (≥ 2.3.1) sends as `E2B-Traffic-Access-Token` on its context calls,
 * where it sends no `X-Access-Token`. Derived from the access token, so it is as secret, the same
 * across connects and restarts, and no more is kept.
 */
export function trafficTokenOf(accessToken: string): string {
  return createHash('sha256').update(`snaplab-e2b-traffic:${accessToken}`).digest('hex').slice(0, 48);
}

/** Two strings compared in constant time (for their length's sake, through their hashes). */
export function sameSecret(a: string, b: string): boolean {
  const ha = createHash('sha256').update(a).digest();
  const hb = createHash('sha256').update(b).digest();
  return timingSafeEqual(ha, hb) && a.length === b.length;
}
