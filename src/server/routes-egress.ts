/**
 * A sandbox's egress (docs/egress.md): its lists and counters, and new lists (not for a key made
 * with --no-egress). A gateway passes these to the sandbox's node (sandbox-calls.ts).
 */
import type { FastifyInstance } from 'fastify';
import { Type } from 'typebox';
import { requireEgress } from './ceilings.js';
import { servedBy, type SandboxCalls } from './sandbox-calls.js';
import { EgressBody, EgressUsageView, IdParams, errors } from './schemas.js';

const tags = ['sandboxes'];

export async function egressRoutes(app: FastifyInstance, s: SandboxCalls): Promise<void> {
  app.get(
    '/sandboxes/:id/egress',
    {
      schema: {
        tags,
        summary: 'Its outbound network: address, lists, bytes out, connections let through and refused',
        params: IdParams,
        response: { 200: EgressUsageView, ...errors },
      },
    },
    servedBy(s, (d) => async (req) => (await d.sandbox((req.params as { id: string }).id, req.caller)).egressUsage()),
  );

  app.put(
    '/sandboxes/:id/egress',
    {
      schema: {
        tags,
        summary: 'Replace its allow and deny lists (new connections meet them at once)',
        params: IdParams,
        body: EgressBody,
        response: { 200: Type.Object({}, { additionalProperties: true }), ...errors },
      },
    },
    servedBy(s, (d) => async (req) => {
      // refused before the sandbox is looked at: the key may change no machine's lists
      requireEgress(req.caller, 'new egress lists');
      const box = await d.sandbox((req.params as { id: string }).id, req.caller);
      await box.setEgress(req.body as { allow?: string[]; deny?: string[] });
      return d.view(box);
    }),
  );
}
