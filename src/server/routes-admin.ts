/**
 * Everything beside a sandbox: the event stream, metrics, long operations, pools, images and
 * scenarios; and (routes-shared.ts, served by a cluster gateway too) traces, snapshots and keys.
 */
import type { FastifyInstance } from 'fastify';
import { Type } from 'typebox';
import { DEFAULT_IMAGE } from '../defaults.js';
import { SnaplabError } from '../errors.js';
import type { DebianSpec } from '../image/debian.js';
import type { PoolSpec } from '../lab/pools/admin.js';
import type { EventRecord } from './served-lab.js';
import type { Daemon } from './daemon.js';
import { sharedRoutes } from './routes-shared.js';
import { execView } from './routes-sandboxes.js';
import { BuildBody, ImportBody, PoolBody, RunBody, ScenarioBody, errors } from './schemas.js';

const any = Type.Object({}, { additionalProperties: true });
const NameParams = Type.Object({ name: Type.String() });

export async function adminRoutes(app: FastifyInstance, d: Daemon): Promise<void> {
  eventRoutes(app, d);
  // traces, snapshots and keys: the routes a cluster gateway serves too (routes-shared.ts)
  await sharedRoutes(app, d);
  metricsRoutes(app, d);
  operationRoutes(app, d);
  poolRoutes(app, d);
  poolRunRoute(app, d);
  imageRoutes(app, d);
  scenarioRoutes(app, d);
  scenarioControlRoutes(app, d);
}

function eventRoutes(app: FastifyInstance, d: Daemon): void {
  // events: server-sent, with ids; Last-Event-ID (or ?after=) resumes after that id
  app.get(
    '/events',
    {
      config: { scope: 'read' },
      schema: {
        tags: ['events'],
        summary:
          'Server-sent events: created, ready, paused, resumed, exited, destroyed, failed, timeout, process.exited; each with a reason',
        querystring: Type.Object({
          after: Type.Optional(Type.Integer({ minimum: 0 })),
          sandbox: Type.Optional(Type.String()),
          token: Type.Optional(Type.String()),
        }),
      },
    },
    (req, reply) => {
      const q = req.query as { after?: number; sandbox?: string };
      const last = Number(req.headers['last-event-id']);
      let after = Number.isSafeInteger(last) && last >= 0 ? last : (q.after ?? d.lab.journal.lastId());
      reply.hijack();
      const res = reply.raw;
      res.writeHead(200, {
        'content-type': 'text/event-stream',
        'cache-control': 'no-cache',
        connection: 'keep-alive',
        'x-accel-buffering': 'no',
      });
      const all = req.caller.scopes.has('admin');
      const write = (e: EventRecord): void => {
        if (e.id <= after) return;
        after = e.id;
        if (q.sandbox && e.sandbox !== q.sandbox && e.name !== q.sandbox) return;
        // a key without admin is told of its own sandboxes only
        if (!all && (!e.sandbox || e.data?.owner !== req.caller.key)) return;
        // a reader that does not keep up is let go: it reconnects with Last-Event-ID and misses nothing
        if (res.writableLength > 1 << 20) return void res.destroy();
        res.write(
          `id: ${e.id}\nevent: ${e.type}\ndata: ${JSON.stringify({ ...e, at: new Date(e.at).toISOString() })}\n\n`,
        );
      };
      // listen first, then replay: nothing falls between the two
      const queued: EventRecord[] = [];
      let live = false;
      const onEvent = (e: EventRecord): void => (live ? write(e) : void queued.push(e));
      d.events.on('event', onEvent);
      for (let batch = d.events.after(after); batch.length; batch = d.events.after(after)) batch.forEach(write);
      live = true;
      queued.forEach(write);
      res.write(': connected\n\n');
      const keepalive = setInterval(() => res.write(': keepalive\n\n'), 15_000);
      const untrack = d.track(req.caller, { close: () => res.destroy() });
      res.on('close', () => {
        clearInterval(keepalive);
        d.events.off('event', onEvent);
        untrack();
      });
    },
  );
}

/** Metrics and traces. */
function metricsRoutes(app: FastifyInstance, d: Daemon): void {
  app.get(
    '/metrics',
    { config: { scope: 'read' }, schema: { tags: ['metrics'], summary: 'Prometheus text format' } },
    async (_req, reply) => {
      const sandboxes: Record<string, number> = { creating: 0, running: 0, paused: 0, dead: 0, removing: 0 };
      for (const s of await d.lab.list({ check: false })) sandboxes[s.state] = (sandboxes[s.state] ?? 0) + 1;
      const pools = await d.lab.pools();
      const text = await d.metrics.render({
        sandboxes,
        pools,
        processes: d.processes.running(),
        execs: d.execsRunning(),
        home: d.lab.home,
      });
      return reply.header('content-type', 'text/plain; version=0.0.4').send(text);
    },
  );
}

function operationRoutes(app: FastifyInstance, d: Daemon): void {
  // the daemon's tick runs this every few seconds; a client (a gateway, a test) may ask for one now
  app.post(
    '/check',
    {
      config: { scope: 'admin' },
      schema: {
        tags: ['sandboxes'],
        summary:
          "A check pass now: every sandbox's record against the host, and what an interrupted create left removed (each told of as failed)",
        response: { 200: any, ...errors },
      },
    },
    async () => ({ removed: await d.check() }),
  );
}

function poolRoutes(app: FastifyInstance, d: Daemon): void {
  // pools: the daemon holds each one, so it is refilled for as long as the daemon runs (their
  // reads are routes-shared.ts's)
  app.post(
    '/pools',
    {
      config: { scope: 'admin' },
      schema: {
        tags: ['pools'],
        summary: 'Define a pool; returns an operation that ends when its standbys are ready',
        body: PoolBody,
        response: { 202: any, ...errors },
      },
    },
    async (req, reply) => {
      const spec = req.body as PoolSpec;
      const op = d.operations.start('pool create', spec.name, async (progress) => {
        const pool = await d.lab.createPool(
          { ...spec, image: spec.image ?? DEFAULT_IMAGE, limits: spec.limits ?? {} },
          (ready, target) => progress(`${ready}/${target} ready`),
        );
        pool.start();
        return pool.stats();
      });
      return reply.status(202).send(op);
    },
  );
  app.patch(
    '/pools/:name',
    {
      config: { scope: 'admin' },
      schema: {
        tags: ['pools'],
        summary: 'Resize (returns an operation)',
        params: NameParams,
        body: Type.Object({ size: Type.Integer({ minimum: 0 }) }),
        response: { 202: any, ...errors },
      },
    },
    async (req, reply) => {
      const pool = d.lab.pool((req.params as { name: string }).name);
      const op = d.operations.start('pool resize', pool.name, async (progress) => {
        await pool.resize((req.body as { size: number }).size, (ready, target) => progress(`${ready}/${target} ready`));
        pool.start();
        return pool.stats();
      });
      return reply.status(202).send(op);
    },
  );
  app.delete(
    '/pools/:name',
    {
      config: { scope: 'admin' },
      schema: {
        tags: ['pools'],
        params: NameParams,
        response: { 200: Type.Object({ removed: Type.Integer() }), ...errors },
      },
    },
    async (req) => ({ removed: await d.lab.pool((req.params as { name: string }).name).remove() }),
  );
}

function poolRunRoute(app: FastifyInstance, d: Daemon): void {
  app.post(
    '/pools/:name/run',
    {
      config: { scope: 'exec' },
      schema: {
        tags: ['pools'],
        summary: 'Run a command in a fresh sandbox of the pool and return its result',
        params: NameParams,
        body: RunBody,
        response: { 200: any, ...errors },
      },
    },
    async (req) => {
      const b = req.body as {
        argv: string[];
        env?: Record<string, string>;
        cwd?: string;
        user?: string;
        timeoutMs?: number;
        stdin?: string;
        encoding?: 'utf8' | 'base64';
      };
      const name = (req.params as { name: string }).name;
      // the run's sandbox is a standby like a take's: held to the key's ceilings while it runs
      const ceiling = await d.ceilings.claim(req.caller, { pool: name });
      let release = (): void => ceiling.release();
      try {
        const exec = d.claimExec(req.caller);
        release = () => {
          exec();
          ceiling.release();
        };
        const r = await d.lab.pool(name).run(b.argv, {
          env: b.env,
          cwd: b.cwd,
          user: b.user,
          timeoutMs: d.deadline(b.timeoutMs),
          encoding: 'buffer',
          ...(b.stdin !== undefined ? { stdin: Buffer.from(b.stdin, b.encoding ?? 'utf8') } : {}),
        });
        req.opId = r.trace?.id ?? null;
        if (r.trace) d.metrics.observeTrace(r.trace);
        return {
          ...execView(r, b.encoding),
          sandbox: r.sandbox,
          hit: r.hit,
          recycled: r.recycled,
          operationId: r.trace?.id ?? null,
        };
      } finally {
        release();
      }
    },
  );
}

function imageRoutes(app: FastifyInstance, d: Daemon): void {
  app.get(
    '/images',
    { config: { scope: 'read' }, schema: { tags: ['images'], response: { 200: Type.Array(any), ...errors } } },
    async () => d.lab.images(),
  );
  app.post(
    '/images/import',
    {
      config: { scope: 'admin' },
      schema: {
        tags: ['images'],
        summary: "Import a rootfs/docker/OCI archive on the daemon's host (returns an operation)",
        body: ImportBody,
        response: { 202: any, ...errors },
      },
    },
    async (req, reply) => {
      const b = req.body as { source: string; name: string };
      return reply
        .status(202)
        .send(d.operations.start('image import', b.name, () => d.lab.importImage(b.source, b.name)));
    },
  );
  app.post(
    '/images/build',
    {
      config: { scope: 'admin' },
      schema: {
        tags: ['images'],
        summary: 'Build a Debian image (returns an operation)',
        body: BuildBody,
        response: { 202: any, ...errors },
      },
    },
    async (req, reply) => {
      const b = req.body as { spec: DebianSpec; name?: string };
      return reply
        .status(202)
        .send(
          d.operations.start('image build', b.name ?? null, (progress) =>
            d.lab.buildImage(b.spec, { name: b.name, onProgress: progress }),
          ),
        );
    },
  );
  app.delete(
    '/images/:name',
    {
      config: { scope: 'admin' },
      schema: {
        tags: ['images'],
        params: NameParams,
        querystring: Type.Object({ force: Type.Optional(Type.Boolean()) }),
        response: { 200: any, ...errors },
      },
    },
    async (req) =>
      d.lab.removeImage((req.params as { name: string }).name, { force: (req.query as { force?: boolean }).force }),
  );
}

function scenarioRoutes(app: FastifyInstance, d: Daemon): void {
  // one scenario that cannot be read now (being torn down) is shown as such, not a failed list
  app.get(
    '/scenarios',
    { config: { scope: 'read' }, schema: { tags: ['scenarios'], response: { 200: Type.Array(any), ...errors } } },
    async () =>
      Promise.all(
        d.lab.scenarios().map((s) =>
          s.status().catch((e: Error) => ({
            name: s.name,
            state: 'error',
            reason: e.message,
            machines: [],
            networks: [],
            blocked: [],
            snapshots: [],
          })),
        ),
      ),
  );
  app.get(
    '/scenarios/:name',
    {
      config: { scope: 'read' },
      schema: { tags: ['scenarios'], params: NameParams, response: { 200: any, ...errors } },
    },
    async (req) => d.lab.scenario((req.params as { name: string }).name).status(),
  );
  app.post(
    '/scenarios',
    {
      config: { scope: 'admin' },
      schema: {
        tags: ['scenarios'],
        summary: "Raise a scenario file on the daemon's host (returns an operation)",
        body: ScenarioBody,
        response: { 202: any, ...errors },
      },
    },
    async (req, reply) => {
      const b = req.body as { file: string; name?: string; driver?: string };
      return reply
        .status(202)
        .send(
          d.operations.start('up', b.name ?? b.file, async (progress) =>
            (
              await d.lab.up(b.file, { name: b.name, driver: b.driver, onProgress: (m, s) => progress(`${m}: ${s}`) })
            ).status(),
          ),
        );
    },
  );
  app.delete(
    '/scenarios/:name',
    {
      config: { scope: 'admin' },
      schema: { tags: ['scenarios'], params: NameParams, response: { 200: any, ...errors } },
    },
    async (req) => d.lab.scenario((req.params as { name: string }).name).down(),
  );
}

/** Snapshot, reset and network faults of a running scenario. */
function scenarioControlRoutes(app: FastifyInstance, d: Daemon): void {
  app.post(
    '/scenarios/:name/snapshot',
    {
      config: { scope: 'admin' },
      schema: {
        tags: ['scenarios'],
        params: NameParams,
        body: Type.Object({ name: Type.String() }),
        response: { 200: any, ...errors },
      },
    },
    async (req) => d.lab.scenario((req.params as { name: string }).name).snapshot((req.body as { name: string }).name),
  );
  app.post(
    '/scenarios/:name/reset',
    {
      config: { scope: 'admin' },
      schema: {
        tags: ['scenarios'],
        params: NameParams,
        body: Type.Object({ to: Type.Optional(Type.String()) }),
        response: { 200: any, ...errors },
      },
    },
    async (req) =>
      d.lab.scenario((req.params as { name: string }).name).reset((req.body as { to?: string } | undefined)?.to),
  );
  app.post(
    '/scenarios/:name/net',
    {
      config: { scope: 'admin' },
      schema: {
        tags: ['scenarios'],
        summary: 'Network faults: block/unblock two machines, partition into groups, heal',
        params: NameParams,
        body: Type.Object({
          action: Type.Union([
            Type.Literal('block'),
            Type.Literal('unblock'),
            Type.Literal('partition'),
            Type.Literal('heal'),
          ]),
          machines: Type.Optional(Type.Array(Type.String())),
          groups: Type.Optional(Type.Array(Type.Array(Type.String()))),
        }),
        response: { 204: Type.Null(), ...errors },
      },
    },
    async (req, reply) => {
      const s = d.lab.scenario((req.params as { name: string }).name);
      const b = req.body as { action: string; machines?: string[]; groups?: string[][] };
      const [x, y] = b.machines ?? [];
      if ((b.action === 'block' || b.action === 'unblock') && (!x || !y))
        throw new SnaplabError('BAD_INPUT', `${b.action} needs two machines`, 'give machines: ["a", "b"]');
      if (b.action === 'block') await s.block(x!, y!);
      else if (b.action === 'unblock') await s.unblock(x!, y!);
      else if (b.action === 'partition') await s.partition(...(b.groups ?? []));
      else await s.heal();
      return reply.status(204).send();
    },
  );
}
