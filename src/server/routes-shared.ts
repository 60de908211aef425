/**
 * The routes a single daemon and a cluster gateway serve with the same handlers, schemas and
 * OpenAPI entries, over a RouteHost (served-lab.ts): who the caller is, metrics, a sandbox's
 * create, get, list and destroy, a check pass, the event stream, usage, traces, long operations,
 * snapshots, pools and their runs, images, scenarios (routes-scenarios.ts) and API keys. A daemon
 * answers from its embedded Lab and keeps each key to its own; a gateway from a GatewayLab bound
 * to the caller, whose nodes do the same.
 */
import { LIST_STATES, MAX_PAGE, nextCursor } from '../sdk/paging.js';
import type { CountOptions, ListOptions, ListState } from '../sdk/api.js';
import type { FastifyInstance } from 'fastify';
import { Type } from 'typebox';
import { SnaplabError } from '../errors.js';
import { statusOf, toSnaplab } from './http-errors.js';
import type { Ceilings } from '../store/records.js';
import { parseScopes, type Caller } from './keys.js';
import type { PoolRunBody, RouteHost } from './served-lab.js';
import { countFor, listFor } from './owned-list.js';
import { scenarioRoutesOf } from './routes-scenarios.js';
import { asGone, snapshotFor } from './snapshot-access.js';
import {
  BuildBody,
  CreateBody,
  IdParams,
  ImportBody,
  KeyBody,
  PoolBody,
  RunBody,
  SandboxView,
  errors,
} from './schemas.js';
import { keyValues } from '../lab/io/exec.js';
import type { PoolSpec } from '../lab/pools/admin.js';
import type { DebianSpec } from '../image/debian.js';

const any = Type.Object({}, { additionalProperties: true });
const NameParams = Type.Object({ name: Type.String() });

export async function sharedRoutes(app: FastifyInstance, h: RouteHost): Promise<void> {
  lifecycleRoutes(app, h);
  eventRoutes(app, h);
  whoRoutes(app, h);
  listRoutes(app, h);
  traceRoutes(app, h);
  operationRoutes(app, h);
  snapshotRoutes(app, h);
  poolReadRoutes(app, h);
  poolChangeRoutes(app, h);
  poolRunRoute(app, h);
  imageRoutes(app, h);
  scenarioRoutesOf(app, h);
  keyRoutes(app, h);
}

/** Who the caller is, and the server's metrics. */
function whoRoutes(app: FastifyInstance, h: RouteHost): void {
  app.get(
    '/whoami',
    {
      schema: {
        tags: ['keys'],
        summary: 'The caller: its key (local on the Unix socket), scopes and quotas',
        response: { 200: any, ...errors },
      },
    },
    async (req) => h.whoami(req.caller),
  );
  app.get(
    '/metrics',
    {
      schema: {
        tags: ['metrics'],
        summary: "Prometheus text format (a cluster gateway's own: nodes, sandboxes by state, placement time)",
        querystring: Type.Object({
          recent: Type.Optional(
            Type.Integer({ minimum: 0, description: "a gateway's: the placement quantiles of its last N only" }),
          ),
        }),
      },
    },
    async (req, reply) =>
      reply
        .header('content-type', 'text/plain; version=0.0.4')
        .send(await h.metricsText(req.caller, (req.query as { recent?: number }).recent)),
  );
}

/** the most machines one usage call names: a dashboard's largest page */
const USAGE_IDS_MAX = 1000;

/** `?id=a&id=b` or `?id=a,b`: the ids, at most USAGE_IDS_MAX; none: every visible machine */
function usageIds(q: string | string[] | undefined): string[] | undefined {
  if (q === undefined) return undefined;
  const ids = [q]
    .flat()
    .flatMap((v) => v.split(','))
    .filter(Boolean);
  if (ids.length > USAGE_IDS_MAX)
    throw new SnaplabError(
      'BAD_INPUT',
      `${ids.length} ids in one usage call`,
      `at most ${USAGE_IDS_MAX}: ask in pages`,
    );
  return ids;
}

/** The event stream and the machines' usage. */
function eventRoutes(app: FastifyInstance, h: RouteHost): void {
  // events: server-sent, with ids; Last-Event-ID (or ?after=) resumes after that id
  app.get(
    '/events',
    {
      schema: {
        tags: ['events'],
        summary:
          'Server-sent events: created, ready, paused, resumed, stopped, started, exited, destroyed, failed, timeout, process.exited; each with a reason',
        querystring: Type.Object({
          after: Type.Optional(Type.Integer({ minimum: 0 })),
          sandbox: Type.Optional(Type.String()),
          token: Type.Optional(Type.String()),
        }),
      },
    },
    async (req, reply) => {
      const q = req.query as { after?: number; sandbox?: string };
      const last = Number(req.headers['last-event-id']);
      const after = Number.isSafeInteger(last) && last >= 0 ? last : q.after;
      reply.hijack();
      try {
        await h.streamEvents(req.caller, req.raw, reply.raw, { after, sandbox: q.sandbox });
      } catch (e) {
        // refused before a byte of the stream (a sandbox not there): the error, as any route's
        const err = toSnaplab(e);
        if (reply.raw.headersSent) reply.raw.destroy(err);
        else
          reply.raw
            .writeHead(statusOf(err.code), { 'content-type': 'application/json' })
            .end(JSON.stringify(err.toJSON()));
      }
    },
  );
  // one call for a list: the dashboard polls it for its page and draws CPU from the difference
  app.get(
    '/usage',
    {
      schema: {
        tags: ['sandboxes'],
        summary:
          "Every visible machine's memory, pids and CPU time now (from its cgroup); with `id` (repeatable, or comma-separated), those machines' only",
        querystring: Type.Object({
          id: Type.Optional(Type.Union([Type.String(), Type.Array(Type.String())])),
        }),
        response: { 200: Type.Array(any), ...errors },
      },
    },
    async (req) => h.usage(req.caller, usageIds((req.query as { id?: string | string[] }).id)),
  );
}

/** Create, get, destroy (a cluster's: placed and claimed, then on the node that holds it). */
function lifecycleRoutes(app: FastifyInstance, h: RouteHost): void {
  app.post(
    '/sandboxes',
    {
      schema: {
        tags: ['sandboxes'],
        summary: 'Create a sandbox from an image, a snapshot or a pool; returns once it is usable',
        body: CreateBody,
        response: { 201: SandboxView, ...errors },
      },
    },
    async (req, reply) => {
      const made = await h.createSandbox(req.caller, req.body as CreateBody);
      req.opId = made.opId;
      return reply.status(201).send(made.view);
    },
  );
  app.get(
    '/sandboxes/:id',
    {
      schema: {
        tags: ['sandboxes'],
        summary: 'A sandbox, reconciled with the host',
        params: IdParams,
        response: { 200: SandboxView, ...errors },
      },
    },
    async (req) => h.sandboxView(req.caller, (req.params as { id: string }).id),
  );
  app.delete(
    '/sandboxes/:id',
    {
      schema: {
        tags: ['sandboxes'],
        summary: 'Destroy a sandbox: its processes killed, its filesystem removed',
        params: IdParams,
        response: { 204: Type.Null(), ...errors },
      },
    },
    async (req, reply) => {
      await h.destroySandbox(req.caller, (req.params as { id: string }).id);
      return reply.status(204).send();
    },
  );
}

/** A list's filters in its query (GET /sandboxes, GET /counts/sandboxes): as RemoteLab sends them. */
const FILTERS = {
  label: Type.Optional(Type.Union([Type.String(), Type.Array(Type.String())])),
  owner: Type.Optional(Type.String()),
  metadata: Type.Optional(
    Type.String({
      description:
        'JSON: {"k": "v", "k2": ["a", "b", null]}: every key has this value, or one of these (null: or has no such key)',
    }),
  ),
  state: Type.Optional(
    Type.String({
      description: `comma-separated, any of ${LIST_STATES.join(', ')} (stopped: dead by stop; dead: any other dead one); empty: none`,
    }),
  ),
  createdSince: Type.Optional(Type.Integer({ description: 'made at or after this time, ms since the epoch' })),
};

interface FilterQuery {
  label?: string | string[];
  owner?: string;
  metadata?: string;
  state?: string;
  createdSince?: number;
}

/** The filters a list's query asks for (the empty owner: those made without a key). */
function filtersOf(q: FilterQuery): CountOptions {
  return {
    labels: keyValues([q.label ?? []].flat(), 'label filter', { unique: true }),
    ...(q.owner !== undefined ? { owner: q.owner || null } : {}),
    ...(q.metadata !== undefined ? { metadata: metadataFilter(q.metadata) } : {}),
    ...(q.state !== undefined ? { state: q.state.split(',').filter(Boolean) as ListState[] } : {}),
    ...(q.createdSince !== undefined ? { createdSince: q.createdSince } : {}),
  };
}

/** A list's `metadata` query (JSON, as RemoteLab sends it): its shape is checked by the lab's list (checkList). */
function metadataFilter(text: string): NonNullable<ListOptions['metadata']> {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (e) {
    throw new SnaplabError('BAD_INPUT', 'the metadata filter is not JSON', 'send metadata={"key":"value"}', {
      cause: e,
    });
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v))
    throw new SnaplabError('BAD_INPUT', 'the metadata filter is not a JSON object', 'send metadata={"key":"value"}');
  return v as NonNullable<ListOptions['metadata']>;
}

/** The sandboxes a caller may see (a cluster's: asked of every node and merged), and a check pass. */
function listRoutes(app: FastifyInstance, h: RouteHost): void {
  app.get(
    '/sandboxes',
    {
      schema: {
        tags: ['sandboxes'],
        summary:
          'List sandboxes, oldest first (`order=desc`: newest first); `label=k=v` (repeatable) keeps those with every label, `owner=KEY` those made by a key (empty: by none), `metadata` (JSON) those with every metadata key=value, `state=a,b` those in one of these states, `createdSince=MS` those made since; `check=false` reads the records without checking the host; `limit` and `after` page it (X-Next-Cursor names the next page)',
        querystring: Type.Object({
          ...FILTERS,
          order: Type.Optional(Type.Union([Type.Literal('asc'), Type.Literal('desc')])),
          check: Type.Optional(Type.Boolean()),
          limit: Type.Optional(
            Type.Integer({ minimum: 1, maximum: MAX_PAGE, description: 'a page of at most this many, oldest first' }),
          ),
          after: Type.Optional(
            Type.String({ description: 'the page after this cursor: the X-Next-Cursor of the page before' }),
          ),
        }),
        response: { 200: Type.Array(SandboxView), ...errors },
      },
    },
    async (req, reply) => {
      const q = req.query as FilterQuery & {
        order?: 'asc' | 'desc';
        check?: boolean;
        limit?: number;
        after?: string;
      };
      const boxes = await listFor(h, req.caller, {
        ...filtersOf(q),
        ...(q.order !== undefined ? { order: q.order } : {}),
        check: q.check,
        limit: q.limit,
        after: q.after,
      });
      // a full page may have a next one: its cursor (none after a shorter page)
      const next = nextCursor(boxes, q.limit);
      if (next !== undefined) reply.header('x-next-cursor', next);
      return boxes.map((b) => b.toJSON());
    },
  );
  // the summary form of the list: its filters, no row read (a lab with a store counts there)
  app.get(
    '/counts/sandboxes',
    {
      schema: {
        tags: ['sandboxes'],
        summary:
          "How many sandboxes GET /sandboxes would list with these filters, in all and by state (stopped apart from dead), without listing them; a key's own only, as its list. `check=false`: the records as they stand (else a machine whose process is gone is found dead first)",
        querystring: Type.Object({ ...FILTERS, check: Type.Optional(Type.Boolean()) }),
        response: {
          200: Type.Object({ total: Type.Integer(), byState: Type.Record(Type.String(), Type.Integer()) }),
          ...errors,
        },
      },
    },
    async (req) => {
      const q = req.query as FilterQuery & { check?: boolean };
      return countFor(h, req.caller, { ...filtersOf(q), ...(q.check !== undefined ? { check: q.check } : {}) });
    },
  );
  // a daemon's tick runs this every few seconds; a client (a gateway, a test) may ask for one now
  app.post(
    '/check',
    {
      schema: {
        tags: ['sandboxes'],
        summary:
          "A check pass now: every sandbox's record against the host, and what an interrupted create left removed (each told of as failed)",
        response: { 200: any, ...errors },
      },
    },
    async (req) => ({ removed: await h.check(req.caller) }),
  );
}

function traceRoutes(app: FastifyInstance, h: RouteHost): void {
  // a key without admin sees the traces of its own machines only, as with events: by id, or by
  // name when they ended after the machine was made (a name is reused: an earlier machine's of that
  // name, another key's perhaps, is not its); never a pool's (a run or a take names the pool)
  const ownTargets = async (caller: Caller): Promise<Map<string, number> | undefined> => {
    const owner = h.ownedBy(caller);
    if (owner === undefined) return undefined;
    const since = new Map<string, number>();
    for (const b of await h.labFor(caller).list({ owner, check: false })) {
      since.set(b.id, 0);
      since.set(b.name, Math.min(since.get(b.name) ?? b.createdAt, b.createdAt));
    }
    return since;
  };
  const POOL_KINDS = new Set(['run', 'take', 'pool rm', 'pool refill']);
  const visible = (
    own: Map<string, number> | undefined,
    t: { kind: string; target: string | null; startedAt: number; totalMs: number },
  ) =>
    own === undefined ||
    (!POOL_KINDS.has(t.kind) &&
      t.target !== null &&
      own.has(t.target) &&
      // ended once the machine was there (its own create ends after it is recorded; an earlier one's rm before)
      t.startedAt + t.totalMs >= own.get(t.target)!);
  app.get(
    '/traces',
    {
      schema: {
        tags: ['traces'],
        summary: 'Stored traces, newest first; `target=` (repeatable) those of these machines, scenarios or pools',
        querystring: Type.Object({
          limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000 })),
          target: Type.Optional(Type.Union([Type.String(), Type.Array(Type.String())])),
        }),
        response: { 200: Type.Array(any), ...errors },
      },
    },
    async (req) => {
      const q = req.query as { limit?: number; target?: string | string[] };
      const own = await ownTargets(req.caller);
      const asked = q.target === undefined ? undefined : [q.target].flat();
      const mine = own && [...own.keys()];
      const targets = asked === undefined ? mine : mine ? asked.filter((t) => mine.includes(t)) : asked;
      const limit = q.limit ?? 20;
      if (!own) return h.labFor(req.caller).traces({ limit, targets });
      // what the filter drops (a pool's runs under a name, an earlier machine's) must not take the
      // page's room: the newest 1 000 of those names are read, and the page taken of what is visible
      return (await h.labFor(req.caller).traces({ limit: 1000, targets }))
        .filter((t) => visible(own, t))
        .slice(0, limit);
    },
  );
  app.get(
    '/traces/:id',
    {
      schema: { tags: ['traces'], params: Type.Object({ id: Type.String() }), response: { 200: any, ...errors } },
    },
    async (req) => {
      const id = (req.params as { id: string }).id;
      const t = await h.labFor(req.caller).trace(id);
      const own = await ownTargets(req.caller);
      if (!t || !visible(own, t))
        throw new SnaplabError('OPERATION_NOT_FOUND', `no trace ${id}`, 'list them with GET /traces');
      return t;
    },
  );
}

function operationRoutes(app: FastifyInstance, h: RouteHost): void {
  app.get(
    '/operations',
    { schema: { tags: ['operations'], response: { 200: Type.Array(any), ...errors } } },
    async (req) => h.operationsFor(req.caller).list(),
  );
  app.get(
    '/operations/:id',
    {
      schema: {
        tags: ['operations'],
        summary: 'A long operation; `wait=S` waits up to S seconds for its end',
        params: Type.Object({ id: Type.String() }),
        querystring: Type.Object({ wait: Type.Optional(Type.Number({ minimum: 0, maximum: 600 })) }),
        response: { 200: any, ...errors },
      },
    },
    async (req) =>
      h.operationsFor(req.caller).get((req.params as { id: string }).id, (req.query as { wait?: number }).wait ?? 0),
  );
}

function snapshotRoutes(app: FastifyInstance, h: RouteHost): void {
  // snapshots (made at POST /sandboxes/{id}/snapshots; restored by POST /sandboxes {snapshot})
  app.get(
    '/snapshots',
    { schema: { tags: ['snapshots'], response: { 200: Type.Array(any), ...errors } } },
    async (req) =>
      (await h.labFor(req.caller).snapshots()).filter((s) => h.snapshotVisible(req.caller, s)).map((s) => s.toJSON()),
  );
  app.get(
    '/snapshots/:name',
    {
      schema: { tags: ['snapshots'], params: NameParams, response: { 200: any, ...errors } },
    },
    async (req) => (await snapshotFor(h, (req.params as { name: string }).name, req.caller)).toJSON(),
  );
  app.delete(
    '/snapshots/:name',
    {
      schema: { tags: ['snapshots'], params: NameParams, response: { 204: Type.Null(), ...errors } },
    },
    async (req, reply) => {
      const name = (req.params as { name: string }).name;
      await snapshotFor(h, name, req.caller, true);
      await h.labFor(req.caller).removeSnapshot(name).catch(asGone(name));
      return reply.status(204).send();
    },
  );
}

/** A pool's counts (a cluster's: summed over the nodes that hold it), and the takes of its standbys. */
function poolReadRoutes(app: FastifyInstance, h: RouteHost): void {
  app.get('/pools', { schema: { tags: ['pools'], response: { 200: Type.Array(any), ...errors } } }, async (req) =>
    h.labFor(req.caller).pools(),
  );
  app.get(
    '/pools/:name',
    { schema: { tags: ['pools'], params: NameParams, response: { 200: any, ...errors } } },
    async (req) =>
      h
        .labFor(req.caller)
        .pool((req.params as { name: string }).name)
        .stats(),
  );
  // every take of a pool's standbys (a pool run's take phase, or a take for the caller's own use),
  // from the stored traces: takes by the CLI and the library count as well as the daemon's own.
  // `after` is the cursor of the last answer (traces in the order they were stored; a cluster's:
  // a time); `now` is the server's clock, which the times are on
  app.get(
    '/pools/:name/takes',
    {
      schema: {
        tags: ['pools'],
        summary: 'The takes of a pool: those stored after a cursor, or that started in the last `since` ms',
        params: NameParams,
        querystring: Type.Object({
          after: Type.Optional(Type.Integer({ minimum: 0 })),
          since: Type.Optional(Type.Integer({ minimum: 0, maximum: 86_400_000 })),
        }),
        response: { 200: any, ...errors },
      },
    },
    async (req) => {
      const pool = h.labFor(req.caller).pool((req.params as { name: string }).name);
      await pool.stats(); // POOL_NOT_FOUND for a pool that is not there
      return pool.takes(req.query as { after?: number; since?: number });
    },
  );
}

/** Define, resize and remove a pool (a cluster's: on each node it is, or is to be, on). */
function poolChangeRoutes(app: FastifyInstance, h: RouteHost): void {
  app.post(
    '/pools',
    {
      schema: {
        tags: ['pools'],
        summary: 'Define a pool; returns an operation that ends when its standbys are ready',
        body: PoolBody,
        response: { 202: any, ...errors },
      },
    },
    async (req, reply) => reply.status(202).send(await h.adminFor(req.caller).createPool(req.body as PoolSpec)),
  );
  app.patch(
    '/pools/:name',
    {
      schema: {
        tags: ['pools'],
        summary: 'Resize (returns an operation)',
        params: NameParams,
        body: Type.Object({ size: Type.Integer({ minimum: 0 }) }),
        response: { 202: any, ...errors },
      },
    },
    async (req, reply) => {
      const name = (req.params as { name: string }).name;
      return reply.status(202).send(await h.adminFor(req.caller).resizePool(name, (req.body as { size: number }).size));
    },
  );
  app.delete(
    '/pools/:name',
    {
      schema: {
        tags: ['pools'],
        params: NameParams,
        response: {
          200: Type.Object({
            removed: Type.Integer(),
            nodes: Type.Optional(Type.Array(Type.String(), { description: "a cluster's: the nodes it was on" })),
          }),
          ...errors,
        },
      },
    },
    async (req) => h.adminFor(req.caller).removePool((req.params as { name: string }).name),
  );
}

/** A run in a fresh sandbox of a pool (a cluster's: where placement finds a ready standby). */
function poolRunRoute(app: FastifyInstance, h: RouteHost): void {
  app.post(
    '/pools/:name/run',
    {
      schema: {
        tags: ['pools'],
        summary: 'Run a command in a fresh sandbox of the pool and return its result',
        params: NameParams,
        body: RunBody,
        response: { 200: any, ...errors },
      },
    },
    async (req, reply) => {
      // the client went before its answer: the command is killed (nobody could read its result)
      const gone = new AbortController();
      reply.raw.once('close', () => {
        if (!reply.raw.writableFinished) gone.abort();
      });
      const r = await h.runPool(
        req.caller,
        (req.params as { name: string }).name,
        req.body as PoolRunBody,
        gone.signal,
      );
      req.opId = typeof r.operationId === 'string' ? r.operationId : null;
      return r;
    },
  );
}

/** Images (a cluster's: each node's, by name, with the nodes that have it; made on each node). */
function imageRoutes(app: FastifyInstance, h: RouteHost): void {
  app.get('/images', { schema: { tags: ['images'], response: { 200: Type.Array(any), ...errors } } }, async (req) =>
    h.adminFor(req.caller).images(),
  );
  app.post(
    '/images/import',
    {
      schema: {
        tags: ['images'],
        summary: "Import a rootfs/docker/OCI archive on the daemon's host (returns an operation)",
        body: ImportBody,
        response: { 202: any, ...errors },
      },
    },
    async (req, reply) =>
      reply.status(202).send(await h.adminFor(req.caller).importImage(req.body as { source: string; name: string })),
  );
  app.post(
    '/images/build',
    {
      schema: {
        tags: ['images'],
        summary: 'Build a Debian image (returns an operation)',
        body: BuildBody,
        response: { 202: any, ...errors },
      },
    },
    async (req, reply) =>
      reply.status(202).send(await h.adminFor(req.caller).buildImage(req.body as { spec: DebianSpec; name?: string })),
  );
  app.delete(
    '/images/:name',
    {
      schema: {
        tags: ['images'],
        params: NameParams,
        querystring: Type.Object({ force: Type.Optional(Type.Boolean()) }),
        response: { 200: any, ...errors },
      },
    },
    async (req) =>
      h
        .adminFor(req.caller)
        .removeImage((req.params as { name: string }).name, (req.query as { force?: boolean }).force),
  );
}

function keyRoutes(app: FastifyInstance, h: RouteHost): void {
  const keys = h.keyAdmin;
  app.get('/keys', { schema: { tags: ['keys'], response: { 200: Type.Array(any), ...errors } } }, async () =>
    keys.list(),
  );
  app.post(
    '/keys',
    {
      schema: {
        tags: ['keys'],
        summary: 'Make a key; the response is the only time it is shown',
        body: KeyBody,
        response: { 201: any, ...errors },
      },
    },
    async (req, reply) => {
      const b = req.body as {
        name: string;
        scopes?: string[];
        maxSandboxes?: number;
        maxExecs?: number;
        ceilings?: Partial<Ceilings>;
      };
      const { token, key } = await keys.create(b.name, {
        scopes: b.scopes ? parseScopes(b.scopes.join(',')) : undefined,
        maxSandboxes: b.maxSandboxes,
        maxExecs: b.maxExecs,
        ceilings: b.ceilings,
      });
      const { hash: _h, ...shown } = key;
      return reply.status(201).send({ ...shown, token });
    },
  );
  app.delete(
    '/keys/:name',
    {
      schema: { tags: ['keys'], params: NameParams, response: { 204: Type.Null(), ...errors } },
    },
    async (req, reply) => {
      await keys.remove((req.params as { name: string }).name);
      return reply.status(204).send();
    },
  );
}
