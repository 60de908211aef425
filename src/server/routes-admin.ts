/**
 * Everything beside a sandbox: the event stream, metrics and pool runs; and
 * (routes-shared.ts, served by a cluster gateway too) traces, operations, snapshots, pools,
 * images, scenarios and keys.
 */
import type { FastifyInstance } from 'fastify';
import { Type } from 'typebox';
import type { EventRecord } from './served-lab.js';
import type { Daemon } from './daemon.js';
import { sharedRoutes } from './routes-shared.js';
import { execView } from './routes-sandboxes.js';
import { RunBody, errors } from './schemas.js';

const any = Type.Object({}, { additionalProperties: true });
const NameParams = Type.Object({ name: Type.String() });

export async function adminRoutes(app: FastifyInstance, d: Daemon): Promise<void> {
  eventRoutes(app, d);
  // traces, snapshots and keys: the routes a cluster gateway serves too (routes-shared.ts)
  await sharedRoutes(app, d);
  metricsRoutes(app, d);
  poolRunRoute(app, d);
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
