/**
 * What the E2B front's routes share: each key's Lab API, the sessions (a sandbox's access token
 * and the key that drives it for envd calls) and the commands envd started.
 */
import { randomBytes, timingSafeEqual } from 'node:crypto';
import type { Socket } from 'node:net';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { LabApi, SandboxApi } from '../sdk/api.js';
import { SnaplabError, isSnaplabError } from '../errors.js';
import { statusOf } from '../server/http-errors.js';
import { Processes } from './processes.js';
import { MetricsFront } from './metrics.js';
import { Watchers } from './watchers.js';
import { Interpreters } from '../interpreter/server.js';
import { EnvdUsers, type EnvdUser } from './users.js';

/** The envd version advertised: the features of envd this front implements (docs/e2b.md). */
export const ENVD_VERSION = '0.5.7';

/** What envd calls need of a sandbox: the key that made it (or connected to it) and its access token. */
interface Session {
  apiKey: string;
  accessToken: string;
}

/** The state the routes share. */
export class E2bState {
  readonly processes = new Processes();
  readonly metrics = new MetricsFront();
  readonly watchers = new Watchers();
  readonly interpreters = new Interpreters();
  readonly users = new EnvdUsers();
  private readonly sessions = new Map<string, Session>();
  private readonly labs = new Map<string, Promise<LabApi>>();

  constructor(
    private readonly labFor: (apiKey: string) => Promise<LabApi>,
    /** a request on this connection proved who it is (the connection caps spare it) */
    private readonly proved: (socket: Socket) => void = () => {},
  ) {}

  /** The caller's Lab API, from its X-API-Key. */
  async lab(req: FastifyRequest): Promise<LabApi> {
    const key = req.headers['x-api-key'];
    if (typeof key !== 'string' || !key)
      throw new SnaplabError('UNAUTHORIZED', 'no API key given', 'send X-API-Key (E2B_API_KEY; docs/e2b.md)');
    const lab = await this.labOf(key);
    this.proved(req.raw.socket);
    return lab;
  }

  private labOf(key: string): Promise<LabApi> {
    let lab = this.labs.get(key);
    if (!lab) {
      lab = this.labFor(key);
      this.labs.set(key, lab);
      // a key that failed (unknown, removed) is asked again next time
      lab.catch(() => this.labs.delete(key));
    }
    return lab;
  }

  /** The access token of a sandbox this key made or connected to (the same one each time). */
  session(id: string, apiKey: string): string {
    const s = this.sessions.get(id);
    if (s) {
      s.apiKey = apiKey;
      return s.accessToken;
    }
    const accessToken = randomBytes(24).toString('hex');
    this.sessions.set(id, { apiKey, accessToken });
    return accessToken;
  }

  forget(id: string): void {
    this.sessions.delete(id);
    this.processes.forget(id);
    this.metrics.forget(id);
    this.watchers.forget(id);
    this.interpreters.forget(id);
    this.users.forget(id);
  }

  /** Who an envd call acts as in `box`: the user it asks for, else the sandbox's default (users.ts). */
  actAs(box: SandboxApi, req: FastifyRequest): Promise<EnvdUser> {
    return this.users.of(box, askedUser(req));
  }

  /**
   * The sandbox an envd call is for (header `E2b-Sandbox-Id`), checked against its access token.
   * Unknown here, gone or not running: UNAVAILABLE (502), which E2B's SDK reads as "not running".
   * `tokenOptional`: a request without the header is let through (one with a wrong token is not).
   */
  async envdSandbox(req: FastifyRequest, opts: { tokenOptional?: boolean } = {}): Promise<SandboxApi> {
    const id = String(req.headers['e2b-sandbox-id'] ?? '');
    const s = this.sessions.get(id);
    if (!s) throw new EnvdUnavailable(id);
    const token = req.headers['x-access-token'];
    const given = Buffer.from(String(token ?? ''));
    const want = Buffer.from(s.accessToken);
    // the code-interpreter SDK sends no token on its context calls (docs/e2b.md): those may omit it
    const spared = opts.tokenOptional === true && token === undefined;
    if (!spared && (given.length !== want.length || !timingSafeEqual(given, want)))
      throw new SnaplabError('UNAUTHORIZED', 'the access token is not this sandbox’s', 'send X-Access-Token');
    this.proved(req.raw.socket);
    const lab = await this.labOf(s.apiKey);
    const box = await lab.get(id).catch((e: unknown) => {
      if (!isSnaplabError(e, 'SANDBOX_NOT_FOUND')) throw e;
      this.forget(id);
      throw new EnvdUnavailable(id);
    });
    if (box.state !== 'running') throw new EnvdUnavailable(id);
    return box;
  }
}

/** A sandbox envd cannot be reached in (gone, paused, unknown): 502, as E2B's proxy answers. */
export class EnvdUnavailable extends SnaplabError {
  constructor(id: string) {
    super('SANDBOX_NOT_FOUND', `sandbox ${JSON.stringify(id)} is not running`, 'create one, or connect to it again');
  }
}

/** An error in E2B's control API shape: `{code, message}` with the HTTP status as code. */
export function sendError(reply: FastifyReply, e: unknown): FastifyReply {
  const status = e instanceof EnvdUnavailable ? 502 : isSnaplabError(e) ? statusOf(e.code) : 500;
  const message = e instanceof Error ? e.message : String(e);
  return reply.code(status).type('application/json').send({ code: status, message });
}

/** The user an envd call asks for: `?username=`, else `Authorization: Basic base64(user:)`, else none. */
export function askedUser(req: FastifyRequest): string | undefined {
  const q = (req.query as { username?: unknown }).username;
  if (typeof q === 'string' && q) return q;
  const m = /^Basic\s+(\S+)$/i.exec(String(req.headers.authorization ?? ''));
  if (!m) return undefined;
  const user = Buffer.from(m[1]!, 'base64').toString('utf8').split(':')[0];
  return user || undefined;
}
