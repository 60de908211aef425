/**
 * E2B's control API (spec/openapi.yml of e2b-dev/E2B), each call one or two Lab API calls of the
 * caller's key: create, get, list with a metadata filter and X-Next-Token paging, kill, timeout,
 * connect. A template is a pool (a create takes one of its standbys), an image, or one of the
 * key's snapshots (a restore: snapshots.ts); `base`, E2B's default, is snaplab's default image.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { KeyedLabApi, LabCreateOptions, LabRestoreOptions, OnTimeout, SandboxApi } from '../sdk/api.js';
import { snapshotNameOf } from './snapshot-names.js';
import { trafficTokenOf } from './sessions.js';
import { SnaplabError, isSnaplabError } from '../errors.js';
import type { E2bState } from './state.js';
import { ENVD_VERSION, fromMetadata, listSandboxes, RESERVED } from './listing.js';
import { e2bNetwork, egressFor } from './network.js';

/**
 * E2B's default template: a pool or an image of that name, else snaplab's built-in template `base`
 * (a Debian shaped as E2B's, built on first use: src/image/templates.ts).
 */
export const BASE_TEMPLATE = 'base';

interface NewSandbox {
  templateID?: unknown;
  timeout?: unknown;
  metadata?: unknown;
  envVars?: unknown;
  autoPause?: unknown;
  autoPauseMemory?: unknown;
  autoResume?: unknown;
  allow_internet_access?: unknown;
  network?: unknown;
}

export function jsonBody(req: FastifyRequest): Record<string, unknown> {
  const raw = req.body;
  if (raw === undefined || raw === null) return {};
  try {
    const v: unknown = Buffer.isBuffer(raw) ? JSON.parse(raw.toString('utf8') || '{}') : raw;
    if (typeof v === 'object' && v !== null && !Array.isArray(v)) return v as Record<string, unknown>;
  } catch {
    // said below
  }
  throw new SnaplabError('BAD_INPUT', 'the body is not a JSON object', 'send a JSON object (see docs/e2b.md)');
}

function strings(v: unknown, what: string): Record<string, string> {
  if (v === undefined || v === null) return {};
  if (typeof v !== 'object' || Array.isArray(v) || Object.values(v).some((x) => typeof x !== 'string'))
    throw new SnaplabError('BAD_INPUT', `${what} must be an object of strings`, 'e.g. {"team": "infra"}');
  return v as Record<string, string>;
}

function seconds(v: unknown): number | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0)
    throw new SnaplabError('BAD_INPUT', 'timeout must be a whole number of seconds ≥ 0', 'e.g. {"timeout": 300}');
  return v;
}

/** A create's timeout: E2B's API refuses 0 (the Lab API would take it as none) */
function createTimeout(v: unknown): number | undefined {
  const t = seconds(v);
  if (t === 0)
    throw new SnaplabError(
      'BAD_INPUT',
      'timeout must be greater than 0',
      'give seconds, e.g. {"timeout": 300}, or leave it out',
    );
  return t;
}

/**
 * What the end of its timeout does, as E2B's create asks (the SDK's `lifecycle.onTimeout`):
 * `autoPause` pauses it with its memory, or, with `autoPauseMemory: false` (`keepMemory: false`),
 * keeps its files only, which is the Lab API's stop (a connect boots it afresh); else it is killed.
 */
function onTimeoutOf(body: NewSandbox): OnTimeout {
  if (body.autoPause !== true) return 'kill';
  return body.autoPauseMemory === false ? 'stop' : 'pause';
}

/**
 * E2B's `autoResume: {enabled}`: an envd call for it while it is paused resumes it (state.ts).
 * Only a pause with its memory can be: a sandbox kept as its files alone boots afresh, which a
 * connect asks for (E2B's SDK refuses the pair before it is sent; its API does too).
 */
function autoResumeOf(body: NewSandbox, onTimeout: OnTimeout): boolean {
  const asked = body.autoResume;
  if (asked === undefined || asked === null) return false;
  const enabled = typeof asked === 'object' ? (asked as { enabled?: unknown }).enabled : undefined;
  if (typeof enabled !== 'boolean')
    throw new SnaplabError(
      'BAD_INPUT',
      'autoResume must be {"enabled": true} or {"enabled": false}',
      'e.g. {"autoPause": true, "autoResume": {"enabled": true}}',
    );
  if (enabled && onTimeout !== 'pause')
    throw new SnaplabError(
      'BAD_INPUT',
      onTimeout === 'stop'
        ? 'autoResume needs a pause that keeps the memory: one kept as its files alone is resumed by connect only'
        : 'autoResume needs autoPause: true (lifecycle.onTimeout "pause")',
      'create with lifecycle {onTimeout: "pause", autoResume: true}, or leave autoResume out and connect to resume',
    );
  return enabled;
}

/** What a create asks of the Lab API. */
export function createOptions(body: NewSandbox): LabCreateOptions {
  const template = body.templateID ?? BASE_TEMPLATE;
  if (typeof template !== 'string' || !template)
    throw new SnaplabError('BAD_INPUT', 'templateID must be a string', `give a template, e.g. "${BASE_TEMPLATE}"`);
  const metadata = strings(body.metadata, 'metadata');
  const envs = strings(body.envVars, 'envVars');
  for (const k of Object.keys(metadata))
    if (k.startsWith(RESERVED))
      throw new SnaplabError('BAD_INPUT', `metadata keys starting with ${RESERVED} are the front's`, 'rename it');
  const kept: Record<string, string> = { ...metadata, [`${RESERVED}template`]: template };
  if (Object.keys(envs).length) kept[`${RESERVED}envs`] = JSON.stringify(envs);
  const onTimeout = onTimeoutOf(body);
  if (autoResumeOf(body, onTimeout)) kept[`${RESERVED}autoResume`] = 'true';
  const network = e2bNetwork(body);
  kept[`${RESERVED}network`] = JSON.stringify(network);
  const egress = egressFor(network);
  return {
    image: template,
    ...(egress ? { egress } : {}),
    metadata: kept,
    timeoutS: createTimeout(body.timeout),
    onTimeout,
  };
}

/**
 * Its egress is E2B's default alone: internet access not named, or named true (SDKs before 2.15
 * send `allow_internet_access: true` on every create), and no `allowOut` (a `denyOut` only
 * narrows the default). A key made without egress (`key create --no-egress`) has its own
 * default, none, so such a create is made without egress, not refused; getInfo says so.
 */
const defaultEgress = (body: NewSandbox): boolean =>
  (body.allow_internet_access === undefined || body.allow_internet_access === true) &&
  !(body.network as { allowOut?: unknown[] } | null)?.allowOut?.length;

/**
 * May this key's sandboxes have egress (its `egress` ceiling)? Read once per key: the front holds
 * one KeyedLabApi per key (a key removed and made again is another KeyedLabApi), so the answer is kept with
 * it, and a create is one create, not a refused one and another (a key's ceilings are those it was
 * made with). A read that failed is asked again next time.
 */
const egressOf = new WeakMap<KeyedLabApi, Promise<boolean>>();
function keyMayEgress(lab: KeyedLabApi): Promise<boolean> {
  let p = egressOf.get(lab);
  if (!p) {
    p = lab.whoami().then((me) => me.ceilings.egress !== false); // not named: the default, egress
    egressOf.set(lab, p);
    p.catch(() => egressOf.delete(lab));
  }
  return p;
}

/** The same create without egress, its network as getInfo will say it: no internet access. */
function withoutEgress<T extends LabCreateOptions | LabRestoreOptions>(opts: T): T {
  const metadata = { ...opts.metadata };
  const network = JSON.parse(metadata[`${RESERVED}network`] ?? '{}') as Record<string, unknown>;
  metadata[`${RESERVED}network`] = JSON.stringify({ ...network, internet: false });
  return { ...opts, egress: undefined, metadata };
}

/** The `Sandbox` answer of a create or a connect. */
function created(state: E2bState, box: SandboxApi, apiKey: string): Record<string, unknown> {
  const token = state.session(box.id, apiKey);
  return {
    sandboxID: box.id,
    templateID: fromMetadata(box).templateID,
    alias: fromMetadata(box).templateID,
    clientID: 'snaplab',
    envdVersion: ENVD_VERSION,
    envdAccessToken: token,
    trafficAccessToken: trafficTokenOf(token),
    domain: null,
  };
}

const idOf = (req: FastifyRequest): string => (req.params as { id: string }).id;
const keyOf = (req: FastifyRequest): string => String(req.headers['x-api-key']);

/**
 * What a create asks of the Lab API: a template that names a pool is a take of one of its ready
 * standbys (the fast path). `pool`: the template is known to be a pool (it was one last time),
 * so the daemon is not asked for the pools first.
 */
async function optionsFor(lab: KeyedLabApi, body: NewSandbox, pool: boolean): Promise<LabCreateOptions> {
  const opts = createOptions(body);
  if (!opts.image || !(pool || (await lab.pools()).some((p) => p.name === opts.image))) return opts;
  // its standbys come with the pool's network (`pool create --egress …`): rules asked for here
  // are refused, not ignored (allow_internet_access: true is what older SDKs send every time,
  // and is taken as their default)
  if (body.network !== undefined && body.network !== null)
    throw new SnaplabError(
      'BAD_INPUT',
      `template ${opts.image} is a pool: its standbys come with the pool's network`,
      'leave out network, use an image template, or make a pool with the rules (`snaplab pool create --allow-out …`)',
    );
  return { ...opts, pool: opts.image, image: undefined, egress: undefined };
}

/**
 * Make it: a take from the template's pool (`taken`), a create from its image, or a restore of the
 * key's snapshot of that name (`alias:tag`, or an alias no image has: snapshot-names.ts).
 */
async function make(lab: KeyedLabApi, body: NewSandbox, pool: boolean): Promise<{ box: SandboxApi; taken: boolean }> {
  const template = typeof body.templateID === 'string' ? body.templateID : BASE_TEMPLATE;
  const snapshot = snapshotNameOf(template);
  if (snapshot) return { box: await restored(lab, body, snapshot), taken: false };
  const opts = await optionsFor(lab, body, pool);
  const box = await lab.create(await egressed(lab, body, opts)).catch((e: unknown) => {
    // no image of that name: one of the key's snapshots, if it has one (else the image's error)
    if (opts.pool !== undefined || !isSnaplabError(e, 'IMAGE_NOT_FOUND')) throw e;
    return restored(lab, body, template).catch((again: unknown) => {
      throw isSnaplabError(again, 'SNAPSHOT_NOT_FOUND') ? e : again;
    });
  });
  return { box, taken: opts.pool !== undefined };
}

/** A key without egress: E2B's default is its none (egress asked for is refused by the daemon, 403). */
async function egressed<T extends LabCreateOptions | LabRestoreOptions>(
  lab: KeyedLabApi,
  body: NewSandbox,
  opts: T,
): Promise<T> {
  return opts.egress && defaultEgress(body) && !(await keyMayEgress(lab)) ? withoutEgress(opts) : opts;
}

/**
 * A create from a snapshot: its files (a VM's memory too), with the create's metadata, envs,
 * network and timeout. A VM's memory snapshot continues with the network it had (the daemon
 * refuses another, BAD_INPUT): where the create asked only E2B's default, internet access, and the
 * VM had none, it is restored without, as E2B's snapshot keeps its sandbox's network.
 */
async function restored(lab: KeyedLabApi, body: NewSandbox, snapshot: string): Promise<SandboxApi> {
  const { metadata, timeoutS, onTimeout, egress } = createOptions(body);
  const opts = await egressed(lab, body, { metadata, timeoutS, onTimeout, ...(egress ? { egress } : {}) });
  return lab.restore(snapshot, opts).catch((e: unknown) => {
    if (!isSnaplabError(e, 'BAD_INPUT') || !opts.egress || !defaultEgress(body)) throw e;
    return lab.restore(snapshot, withoutEgress(opts)).catch(() => {
      throw e; // not that: the first refusal says what was wrong
    });
  });
}

async function create(state: E2bState, req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
  const lab = await state.lab(req);
  const key = keyOf(req);
  const body = jsonBody(req) as NewSandbox;
  const template = typeof body.templateID === 'string' ? body.templateID : BASE_TEMPLATE;
  const known = state.pools.has(key, template);
  const { box, taken } = await make(lab, body, known).catch((e: unknown) => {
    // the pool it was is gone: the template is looked up again (an image of that name, or no such template)
    if (!known || !isSnaplabError(e, 'POOL_NOT_FOUND')) throw e;
    state.pools.drop(key, template);
    return make(lab, body, false);
  });
  if (taken) state.pools.add(key, template);
  // its session first: a sandbox that ended meanwhile is not found, and nothing is kept of it
  const answer = created(state, box, key);
  state.users.fresh(box, key);
  state.known(box);
  return reply.code(201).send(answer);
}

/**
 * Connect: a paused sandbox is resumed (201; the one resume of any envd calls that woke it at
 * the same time, state.ts), one paused without its memory (stopped) started again, a fresh boot
 * on its files (201); a running one answered (200). Its end time only grows.
 */
async function connect(state: E2bState, req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
  const lab = await state.lab(req);
  const timeout = seconds(jsonBody(req).timeout);
  let box = await lab.get(idOf(req));
  let status = 200;
  if (box.stopped) {
    await box.start();
    status = 201;
  } else if (box.state === 'paused') {
    box = await state.resume(box);
    status = 201;
  }
  if (timeout !== undefined) {
    await box.refresh();
    const end = Date.now() + timeout * 1000;
    if (box.expiresAt !== null && box.expiresAt < end) await box.setTimeout(timeout, box.onTimeout);
  }
  const answer = created(state, box, keyOf(req));
  state.known(box);
  return reply.code(status).send(answer);
}

/**
 * Pause: its processes frozen with their memory (a connect resumes them), or, with `memory: false`
 * (the SDK's `keepMemory: false`), stopped: its files kept, and a connect boots it afresh on them.
 * Either way its access token stays, and envd calls to it answer 502 until a connect.
 */
async function pause(state: E2bState, req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
  const memory = jsonBody(req).memory;
  if (memory !== undefined && memory !== null && typeof memory !== 'boolean')
    throw new SnaplabError('BAD_INPUT', 'memory must be true or false', 'send {"memory": false} to keep files only');
  const box = await (await state.lab(req)).get(idOf(req));
  if (box.state === 'paused' || box.stopped)
    throw new SnaplabError('SANDBOX_PAUSED', 'the sandbox is paused already', 'connect to it to resume it');
  if (memory === false) {
    // its commands and watchers end with its processes
    state.processes.forget(box.id);
    state.watchers.forget(box.id);
    await box.stop();
  } else await box.pause();
  return reply.code(204).send();
}

export function registerControl(app: FastifyInstance, state: E2bState): void {
  for (const path of ['/sandboxes', '/v2/sandboxes']) app.post(path, (req, reply) => create(state, req, reply));
  for (const path of ['/sandboxes/:id/connect', '/v2/sandboxes/:id/connect'])
    app.post(path, (req, reply) => connect(state, req, reply));
  app.get('/sandboxes', async (req, reply) =>
    reply.send(await listSandboxes(await state.lab(req), state.disks, req, reply, false)),
  );
  app.get('/v2/sandboxes', async (req, reply) =>
    reply.send(await listSandboxes(await state.lab(req), state.disks, req, reply, true)),
  );
  app.get('/sandboxes/:id', async (req, reply) => {
    const box = await (await state.lab(req)).get(idOf(req));
    return reply.send(fromMetadata(box, state.disks).detail);
  });
  app.delete('/sandboxes/:id', async (req, reply) => {
    const box = await (await state.lab(req)).get(idOf(req));
    // its session goes first, so that its commands' streams are cut, not ended; one still being
    // started (a connect of a stopped one) is refused (SANDBOX_BUSY, 409) and keeps its session;
    // a stopped one has no streams to cut, and a connect may start it meanwhile
    if (box.state === 'creating' || box.stopped) await box.destroy().then(() => state.forget(box.id));
    else {
      state.forget(box.id);
      await box.destroy();
    }
    return reply.code(204).send();
  });
  app.post('/sandboxes/:id/pause', (req, reply) => pause(state, req, reply));
  // new egress rules for a running sandbox: E2B's update replaces them all (an omitted field clears it)
  app.put('/sandboxes/:id/network', async (req, reply) => {
    // (the update's body is flat: allow_internet_access, allowOut, denyOut)
    const b = jsonBody(req);
    const network = e2bNetwork({
      allow_internet_access: b.allow_internet_access,
      network: { allowOut: b.allowOut, denyOut: b.denyOut },
    });
    const box = await (await state.lab(req)).get(idOf(req));
    const egress = egressFor(network);
    if (!box.egress)
      throw new SnaplabError(
        'EGRESS_OFF',
        'this sandbox was made without internet access: its network cannot be changed',
        'create it with allowInternetAccess (the default) to change its rules later',
      );
    // no egress at all: an allow list that nothing matches (the machine keeps its link, unused)
    await box.setEgress(egress === false ? { allow: ['0.0.0.0/32'] } : egress === true ? {} : egress);
    await box.setLabels({ metadata: { ...box.metadata, [`${RESERVED}network`]: JSON.stringify(network) } });
    return reply.code(204).send();
  });
  app.post('/sandboxes/:id/timeout', async (req, reply) => {
    const timeout = seconds(jsonBody(req).timeout);
    if (timeout === undefined) throw new SnaplabError('BAD_INPUT', 'no timeout given', 'send {"timeout": SECONDS}');
    const box = await (await state.lab(req)).get(idOf(req));
    // E2B's 0 ends it now (its end time is now); the Lab API's 0 is no timeout, so a second is the least asked
    await box.setTimeout(Math.max(1, timeout), box.onTimeout);
    return reply.code(204).send();
  });
}
