/**
 * What the E2B front's routes share: each key's Lab API, the sessions (a sandbox's access token
 * and the key that drives it for envd calls) and the commands envd started.
 */
import { PeerBudgets, peerOf } from './budgets.js';
import { randomBytes } from 'node:crypto';
import type { Socket } from 'node:net';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { KeyedLabApi, SandboxApi } from '../sdk/api.js';
import { SnaplabError, isSnaplabError } from '../errors.js';
import { statusOf, toSnaplab } from '../server/http-errors.js';
import { Processes } from './processes.js';
import { MetricsFront } from './metrics.js';
import { Watchers } from './watchers.js';
import { Interpreters } from '../interpreter/server.js';
import { EnvdUsers, type EnvdUser } from './users.js';
import { DiskSizes, asksAutoResume } from './listing.js';
import { noted } from '../cleanup.js';
import {
  memorySessions,
  sameSecret,
  trafficTokenOf,
  signatureOf,
  type Operation,
  type Session,
  type SessionStore,
} from './sessions.js';

/**
 * The least a sandbox woken by its traffic (autoResume) is given to run, in seconds: E2B gives it
 * the longer of this and its own timeout, counted from the resume (docs/e2b.md, Lifecycle), so a
 * sandbox with a short timeout is not paused again while the calls that woke it go on.
 */
export const AUTO_RESUME_MIN_TIMEOUT_S = 300;

/** How many ended sandboxes the front remembers as ended, and for how long (E2bState.endedElsewhere). */
const ENDED_KEPT = 10_000;
const ENDED_KEPT_MS = 10 * 60_000;

/** the options of an envd call the front answers from its own memory (its process table, a watcher's queue): the sandbox's state is asked first */
export const FROM_MEMORY = { fresh: true } as const;

/** signed URLs without the sandbox's id that may match no session, per peer: at once, and a second after */
const SEARCH_BURST = 30;
const SEARCH_PER_S = 5;

/** The state the routes share. */
export class E2bState {
  readonly processes = new Processes();
  readonly metrics = new MetricsFront();
  readonly watchers = new Watchers();
  readonly interpreters = new Interpreters();
  readonly users = new EnvdUsers();
  readonly pools = new KnownPools();
  readonly disks = new DiskSizes();
  private readonly sessions: Map<string, Session>;
  private readonly labs = new Map<string, Promise<KeyedLabApi>>();
  /**
   * The sandboxes envd calls act on, each a handle got once (from its create or connect, else
   * one `get`): a call is not preceded by a look at its state (the keyed lab still finds the
   * sandbox as the key's own, in-process, as every route does); its own answer says whether the
   * sandbox is gone or paused (`unavailable`). Only `/health` asks for its state.
   */
  private readonly handles = new Map<string, Handle>();
  /** each peer's budget of signed URLs that matched no session (fileSandbox) */
  private readonly searches = new PeerBudgets(SEARCH_BURST, SEARCH_PER_S);
  /** the key each request acted as (its X-API-Key, or its session's): the front's log line names it */
  private readonly actors = new WeakMap<FastifyRequest, string>();
  /** the resume in flight of each sandbox: every caller that finds it paused meanwhile waits for that one */
  private readonly resuming = new Map<string, Promise<void>>();
  /**
   * Sandboxes told ended lately (id → when): a create or connect that found one before its end
   * and answers after it must not make it a session again (`session`), which nothing would remove
   * until a call came for it. Ids are never reused, so a stale entry refuses nothing real.
   */
  private readonly ended = new Map<string, number>();

  constructor(
    private readonly labFor: (apiKey: string) => Promise<KeyedLabApi>,
    /** a request on this connection proved who it is (the connection caps spare it) */
    private readonly proved: (socket: Socket) => void = () => {},
    /** where sessions outlive this front (the daemon's store), loaded now */
    private readonly kept: SessionStore = memorySessions,
  ) {
    this.sessions = kept.load();
  }

  /** How many sandboxes the front keeps a session of. */
  get sessionCount(): number {
    return this.sessions.size;
  }

  /** The caller's Lab API, from its X-API-Key. */
  async lab(req: FastifyRequest): Promise<KeyedLabApi> {
    const key = req.headers['x-api-key'];
    if (typeof key !== 'string' || !key)
      throw new SnaplabError('UNAUTHORIZED', 'no API key given', 'send X-API-Key (E2B_API_KEY; docs/e2b.md)');
    const lab = await this.labOf(key);
    this.proved(req.raw.socket);
    this.actors.set(req, key);
    return lab;
  }

  /** The API key a request acted as, once it was proved (its X-API-Key, or its sandbox session's). */
  actor(req: FastifyRequest): string | undefined {
    return this.actors.get(req);
  }

  private labOf(key: string): Promise<KeyedLabApi> {
    let lab = this.labs.get(key);
    if (!lab) {
      lab = this.labFor(key);
      this.labs.set(key, lab);
      // a key that failed (unknown, removed) is asked again next time
      lab.catch(() => this.labs.delete(key));
    }
    return lab;
  }

  /**
   * A sandbox ended outside the front (its timeout, `snaplab rm`, another client, found dead): its
   * session and all the front holds of it are let go, and it is remembered a while as ended.
   */
  endedElsewhere(id: string): void {
    const now = Date.now();
    this.ended.delete(id); // (told twice: it goes last, as the newest)
    this.ended.set(id, now);
    for (const [old, at] of this.ended) {
      if (this.ended.size <= ENDED_KEPT && now - at < ENDED_KEPT_MS) break;
      this.ended.delete(old);
    }
    if (this.sessions.has(id)) this.forget(id);
  }

  /** The access token of a sandbox this key made or connected to (the same one each time). */
  session(id: string, apiKey: string): string {
    if (this.ended.has(id))
      throw new SnaplabError(
        'SANDBOX_NOT_FOUND',
        `sandbox ${id} has ended`,
        'it was removed while this call ran (its timeout, a kill, snaplab rm): create another',
      );
    const s = this.sessions.get(id);
    if (s && s.apiKey === apiKey) return s.accessToken;
    const next = { apiKey, accessToken: s?.accessToken ?? randomBytes(24).toString('hex') };
    // driven by another key now: its handle is that key's to get
    this.handles.delete(id);
    this.kept.save(id, next);
    this.sessions.set(id, next);
    return next.accessToken;
  }

  /** A sandbox this front made or connected to, as the key that drives it got it: its envd calls use it. */
  known(box: SandboxApi): void {
    if (this.sessions.has(box.id)) this.handles.set(box.id, handle(box));
  }

  forget(id: string): void {
    this.handles.delete(id);
    this.sessions.delete(id);
    this.kept.drop(id);
    this.processes.forget(id);
    this.metrics.forget(id);
    this.watchers.forget(id);
    this.interpreters.forget(id);
    this.users.forget(id);
  }

  /**
   * Resume a paused sandbox, once for all who ask at once (the calls of a burst that woke it, a
   * connect): they wait for the one resume, so the daemon resumes it and tells of it once. One
   * resumed meanwhile (by the resume before) is not resumed again. Each caller's own object (its
   * own key's handle, never another's) is then brought up to date.
   */
  async resume(box: SandboxApi): Promise<SandboxApi> {
    let p = this.resuming.get(box.id);
    const mine = !p;
    if (!p) {
      p = (async () => {
        await box.refresh();
        if (box.state === 'paused') await box.resume();
      })().finally(() => this.resuming.delete(box.id));
      this.resuming.set(box.id, p);
    }
    await p;
    if (!mine) await box.refresh();
    return box;
  }

  /** Who an envd call acts as in `box`: the user it asks for, else the sandbox's default (users.ts). */
  actAs(box: SandboxApi, req: FastifyRequest): Promise<EnvdUser> {
    return this.users.of(box, askedUser(req));
  }

  /**
   * The sandbox an envd call is for (header `E2b-Sandbox-Id`), checked against its access token.
   * Unknown here, gone or not running: UNAVAILABLE (502), which E2B's SDK reads as "not running";
   * paused, of a create that asked for autoResume: resumed first (`running`).
   * `traffic`: the sandbox's traffic token (`E2B-Traffic-Access-Token`) serves as well as its
   * access token: the code interpreter's context calls carry only that one.
   * The sandbox is the handle kept of it (no call to the daemon), unless `fresh` (its state asked
   * for now: `/health`) or it asked for autoResume. A call that then finds it gone or paused is
   * answered 502 (`unavailable`).
   */
  async envdSandbox(req: FastifyRequest, opts: { traffic?: boolean; fresh?: boolean } = {}): Promise<SandboxApi> {
    const id = String(req.headers['e2b-sandbox-id'] ?? '');
    const s = this.envdToken(req, opts);
    this.proved(req.raw.socket);
    this.actors.set(req, s.apiKey);
    const kept = opts.fresh ? undefined : this.handles.get(id);
    // one that wakes on traffic is asked for its state each time: a call that finds it paused must
    // resume it (`running`), not be answered 502 by the call's own error
    if (kept && !kept.wakes) return kept.box;
    return this.running(id, s);
  }

  /**
   * The session of an envd call's sandbox (`E2b-Sandbox-Id`) once its token is proved (unknown
   * here: UNAVAILABLE, 502; a wrong token: UNAUTHORIZED): checked before anything else of the
   * call is read, its body included (front.ts).
   */
  envdToken(req: FastifyRequest, opts: { traffic?: boolean } = {}): Session {
    const id = String(req.headers['e2b-sandbox-id'] ?? '');
    const s = this.sessions.get(id);
    if (!s) throw new EnvdUnavailable(id);
    const token = req.headers['x-access-token'];
    const traffic = req.headers['e2b-traffic-access-token'];
    const proved =
      token !== undefined
        ? sameSecret(String(token), s.accessToken)
        : opts.traffic === true && sameSecret(String(traffic ?? ''), trafficTokenOf(s.accessToken));
    if (!proved)
      throw new SnaplabError(
        'UNAUTHORIZED',
        // E2B's answer carries the message alone: what to do goes in it
        opts.traffic && token === undefined && traffic === undefined
          ? 'no token: send X-Access-Token or E2B-Traffic-Access-Token (@e2b/code-interpreter sends the latter from 2.3.1: upgrade an older one)'
          : 'the access token is not this sandbox’s',
        opts.traffic ? 'send X-Access-Token, or E2B-Traffic-Access-Token' : 'send X-Access-Token',
      );
    return s;
  }

  /**
   * An envd call's failure as the SDK must see it: the sandbox gone, paused, stopped or dead (the call's
   * own answer, its state not asked first) is UNAVAILABLE (502), and its handle is let go (gone:
   * its session too); a user the machine no longer has (removed after this front read its users,
   * which it would trust until told) is refused as envd refuses one (UNAUTHORIZED, "invalid
   * username", not the library's 400) and the users are read again next time; any other error as it is.
   */
  unavailable(req: FastifyRequest, e: unknown, id = String(req.headers['e2b-sandbox-id'] ?? '')): unknown {
    if (isSnaplabError(e, 'USER_NOT_FOUND')) {
      this.users.forget(id);
      return new SnaplabError('UNAUTHORIZED', `invalid username: ${e.message}`, e.hint, { cause: e });
    }
    if (
      !isSnaplabError(e) ||
      !['SANDBOX_NOT_FOUND', 'SANDBOX_PAUSED', 'SANDBOX_STOPPED', 'SANDBOX_DEAD'].includes(e.code)
    )
      return e;
    if (e instanceof EnvdUnavailable) return e;
    if (e.code === 'SANDBOX_NOT_FOUND' && this.sessions.has(id)) this.forget(id);
    else this.handles.delete(id);
    return new EnvdUnavailable(id, e);
  }

  /**
   * The sandbox of `GET`/`POST /files`: as for any envd call when the request carries an access
   * token or no signature; else the one whose access token signed the URL (`signature`, and
   * `signature_expiration` when it has one), which needs no `E2b-Sandbox-Id`: a signed URL is
   * fetched by any HTTP client. The signature covers the path, the operation and the user, as
   * envd's does; a wrong or expired one is refused with 401, as envd refuses it. `signed`: the
   * user is then the signed one (`?username=`) only, never an `Authorization` header's.
   */
  async fileSandbox(req: FastifyRequest, op: Operation): Promise<{ box: SandboxApi; user: EnvdUser }> {
    const q = req.query as Record<string, unknown>;
    if (req.headers['x-access-token'] !== undefined || q.signature === undefined) {
      const box = await this.envdSandbox(req);
      return { box, user: await this.actAs(box, req) };
    }
    const header = req.headers['e2b-sandbox-id'];
    const only = typeof header === 'string' ? header : undefined;
    const peer = peerOf(req.raw.socket.remoteAddress);
    // a URL without the sandbox's id is checked against every session's token: a peer whose such
    // URLs match none spends a budget (SEARCH_BURST, refilled SEARCH_PER_S a second), so that
    // made-up signatures cannot keep the daemon hashing for every sandbox
    if (only === undefined && !this.searches.take(peer, 0))
      throw new SnaplabError(
        'QUOTA_EXCEEDED',
        'too many signed URLs from this address matched no sandbox',
        'wait a few seconds; check that the URL is the one downloadUrl/uploadUrl made (or send E2b-Sandbox-Id)',
      );
    const found = this.signer(q, op, only);
    const again = 'make the URL again (sandbox.downloadUrl / uploadUrl), for this path, user and operation';
    if (!found && only === undefined) this.searches.take(peer, 1);
    if (!found) throw new SnaplabError('UNAUTHORIZED', 'the signature is not valid', again);
    const exp = q.signature_expiration;
    // whole seconds, as envd compares (time.Now().Unix()): a URL holds through its last second
    if (typeof exp === 'string' && Number(exp) < Math.floor(Date.now() / 1000))
      throw new SnaplabError('UNAUTHORIZED', 'the signature has expired', again);
    this.proved(req.raw.socket);
    this.actors.set(req, found[1].apiKey);
    const box = await this.running(found[0], found[1]);
    // a signed URL acts as the user it was signed for, whatever else the request says
    return { box, user: await this.users.of(box, askedUser(req, { signed: true })) };
  }

  /** The session whose token made this signature (the header's only, when there is one). */
  private signer(q: Record<string, unknown>, op: Operation, only?: string): [string, Session] | undefined {
    const str = (v: unknown): string => (typeof v === 'string' ? v : '');
    const exp = q.signature_expiration;
    if (exp !== undefined && (typeof exp !== 'string' || !/^\d{1,15}$/.test(exp))) return undefined;
    const given = str(q.signature);
    let found: [string, Session] | undefined;
    const candidates: [string, Session | undefined][] =
      only === undefined ? [...this.sessions] : [[only, this.sessions.get(only)]];
    for (const [id, s] of candidates) {
      if (!s) continue;
      // every session is tried, found or not: the time taken does not tell which one signed
      const ok = sameSecret(given, signatureOf(str(q.path), op, str(q.username), s.accessToken, exp));
      if (ok && !found) found = [id, s];
    }
    return found;
  }

  /**
   * A session's sandbox, through its key's Lab API: 502 when it is gone or not running. Paused
   * with its memory, of a create that asked for autoResume, it is resumed (by the key that drives
   * it), as E2B's proxy resumes one when traffic comes for it, the health probe (isRunning) too;
   * a stopped one (paused without its memory) is left to a connect, as E2B leaves it.
   */
  private async running(id: string, s: Session): Promise<SandboxApi> {
    const lab = await this.labOf(s.apiKey);
    let box = await lab.get(id).catch((e: unknown) => {
      if (!isSnaplabError(e, 'SANDBOX_NOT_FOUND')) throw e;
      this.forget(id);
      throw new EnvdUnavailable(id);
    });
    if (box.state === 'paused' && wakes(box)) {
      box = await this.resume(box);
      // each waker, also one that joined a connect's resume; a failure leaves the shorter timeout
      await longerTimeout(box).catch(noted('give a woken sandbox its five minutes'));
    }
    if (box.state !== 'running') throw new EnvdUnavailable(id);
    if (this.sessions.get(id) === s) this.handles.set(id, handle(box));
    return box;
  }
}

/** Did its create ask for autoResume (listing.ts)? Read without parsing the rest. */
const wakes = (box: SandboxApi): boolean => asksAutoResume(box.metadata);

/** A handle kept, with whether it wakes on traffic: read once (the metadata is a read of the record), not on every call. */
interface Handle {
  box: SandboxApi;
  wakes: boolean;
}
const handle = (box: SandboxApi): Handle => ({ box, wakes: wakes(box) });

/** A sandbox woken by its traffic runs at least AUTO_RESUME_MIN_TIMEOUT_S from now, as E2B's does. */
async function longerTimeout(box: SandboxApi): Promise<void> {
  if (box.timeoutS > 0 && box.timeoutS < AUTO_RESUME_MIN_TIMEOUT_S)
    await box.setTimeout(AUTO_RESUME_MIN_TIMEOUT_S, box.onTimeout);
}

/**
 * The templates each key found to be pools: its next create from one is a take at once, without
 * asking the daemon for its pools first. A take that finds the pool gone drops it (control.ts).
 * At most the daemon's pools a key, each a name the daemon answered with.
 */
export class KnownPools {
  private readonly byKey = new Map<string, Set<string>>();

  has(apiKey: string, template: string): boolean {
    return this.byKey.get(apiKey)?.has(template) === true;
  }

  add(apiKey: string, template: string): void {
    let s = this.byKey.get(apiKey);
    if (!s) this.byKey.set(apiKey, (s = new Set()));
    s.add(template);
  }

  drop(apiKey: string, template: string): void {
    this.byKey.get(apiKey)?.delete(template);
  }
}

/** A sandbox envd cannot be reached in (gone, paused, unknown): 502, as E2B's proxy answers. */
export class EnvdUnavailable extends SnaplabError {
  constructor(id: string, cause?: unknown) {
    super(
      'SANDBOX_NOT_FOUND',
      `sandbox ${JSON.stringify(id)} is not running`,
      'create one, or connect to it again',
      cause === undefined ? undefined : { cause },
    );
  }
}

/** An error in E2B's control API shape: `{code, message}` with the HTTP status as code. */
export function sendError(reply: FastifyReply, e: unknown): FastifyReply {
  // Fastify's own errors (a bad body, a path it cannot route) by their status, as the daemon's API maps them
  const status = e instanceof EnvdUnavailable ? 502 : statusOf(toSnaplab(e).code);
  // E2B's body has no hint: what would fix it goes in the message, the one thing its SDKs show
  const hint = e instanceof SnaplabError && e.hint ? ` (hint: ${e.hint})` : '';
  const message = `${e instanceof Error ? e.message : String(e)}${hint}`;
  return reply.code(status).type('application/json').send({ code: status, message });
}

/**
 * The user an envd call asks for: `?username=`, else `Authorization: Basic base64(user:)`, else
 * none. A signed URL's is its `?username=` alone (the signature covers it; the header it does not).
 */
export function askedUser(req: FastifyRequest, o: { signed?: boolean } = {}): string | undefined {
  const q = (req.query as { username?: unknown }).username;
  if (typeof q === 'string' && q) return q;
  if (o.signed) return undefined;
  const m = /^Basic\s+(\S+)$/i.exec(String(req.headers.authorization ?? ''));
  if (!m) return undefined;
  const user = Buffer.from(m[1]!, 'base64').toString('utf8').split(':')[0];
  return user || undefined;
}
