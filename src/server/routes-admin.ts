/**
 * Everything beside a sandbox: the daemon's metrics; and (routes-shared.ts, served by a cluster
 * gateway too) the event stream, usage, traces, operations, snapshots, pools and their runs,
 * images, scenarios and keys.
 */
import type { FastifyInstance } from 'fastify';
import type { Daemon } from './daemon.js';
import { sharedRoutes } from './routes-shared.js';

export async function adminRoutes(app: FastifyInstance, d: Daemon): Promise<void> {
  // the routes a cluster gateway serves too (routes-shared.ts)
  await sharedRoutes(app, d);
  metricsRoutes(app, d);
}

/** Metrics. */
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
