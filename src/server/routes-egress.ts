/** A sandbox's egress (docs/egress.md): its lists and counters, and new lists. */
import type { FastifyInstance } from 'fastify';
import { Type } from 'typebox';
import type { Daemon } from './daemon.js';
import { EgressBody, EgressUsageView, IdParams, errors } from './schemas.js';

const tags = ['sandboxes'];

export async function egressRoutes(app: FastifyInstance, d: Daemon): Promise<void> {
  app.get(
    '/sandboxes/:id/egress',
    {
      config: { scope: 'read' },
      schema: {
        tags,
        summary: 'Its outbound network: address, lists, bytes out, connections let through and refused',
        params: IdParams,
        response: { 200: EgressUsageView, ...errors },
      },
    },
    async (req) => (await d.sandbox((req.params as { id: string }).id, req.caller)).egressUsage(),
  );

  app.put(
    '/sandboxes/:id/egress',
    {
      config: { scope: 'exec' },
      schema: {
        tags,
        summary: 'Replace its allow and deny lists (new connections meet them at once)',
        params: IdParams,
        body: EgressBody,
        response: { 200: Type.Object({}, { additionalProperties: true }), ...errors },
      },
    },
    async (req) => {
      const box = await d.sandbox((req.params as { id: string }).id, req.caller);
      await box.setEgress(req.body as { allow?: string[]; deny?: string[] });
      return d.view(box);
    },
  );
}
