/**
 * A daemon's /mcp: the MCP server over the streamable HTTP transport, stateless (each POST a
 * server and a transport of its own), with a key like the other routes. Each request acts through
 * the caller's key's lab (`labFor`: the daemon's keyed lab in its own process, as the E2B front's),
 * so what a key may do over MCP is what the daemon lets it; the daemon keeps each sandbox's TTL.
 */
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { bestEffort } from '../cleanup.js';
import type { KeyedLabApi } from '../sdk/api.js';
import { mcpServer } from './server.js';

export function mcpRoutes(
  app: FastifyInstance,
  labFor: (req: FastifyRequest) => Promise<KeyedLabApi>,
  ttlS = 600,
): void {
  app.post('/mcp', { schema: { hide: true } }, async (req, reply) => {
    const lab = await labFor(req);
    const server = mcpServer(lab, { defaultTtlS: ttlS, keepsTime: true });
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
    reply.raw.on('close', () => {
      void bestEffort('close an MCP request', async () => {
        await transport.close();
        await server.close();
        lab.close();
      });
    });
    await server.connect(transport);
    reply.hijack();
    await transport.handleRequest(req.raw, reply.raw, req.body);
  });
  // stateless: no session to stream to or end
  for (const method of ['GET', 'DELETE'] as const)
    app.route({
      method,
      url: '/mcp',
      schema: { hide: true },
      handler: async (_req, reply) =>
        reply
          .status(405)
          .header('allow', 'POST')
          .send({
            jsonrpc: '2.0',
            error: { code: -32000, message: 'method not allowed: this MCP endpoint is stateless (POST only)' },
            id: null,
          }),
    });
}
