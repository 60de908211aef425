/**
 * `snaplab mcp`: the MCP server on stdin/stdout. With SNAPLAB_HOST it acts through that daemon,
 * which keeps each sandbox's TTL; on the embedded lab (which keeps no clock) the sandboxes this
 * session made are destroyed when it ends (stdin closed, SIGTERM, SIGINT).
 */
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { bestEffort } from '../cleanup.js';
import type { LabApi, SandboxApi } from '../sdk/api.js';
import { mcpServer } from './server.js';

export async function serveStdio(lab: LabApi, keepsTime: boolean, defaultTtlS: number): Promise<void> {
  const made = new Map<string, SandboxApi>();
  const server = mcpServer(lab, {
    defaultTtlS,
    keepsTime,
    onCreated: keepsTime ? undefined : (box) => made.set(box.id, box),
  });
  const ended = new Promise<void>((resolve) => {
    process.stdin.once('end', resolve);
    process.stdin.once('close', resolve);
    process.once('SIGTERM', resolve);
    process.once('SIGINT', resolve);
  });
  await server.connect(new StdioServerTransport());
  await ended;
  for (const box of made.values())
    await bestEffort(`destroy sandbox ${box.name} at the MCP session's end`, () => box.destroy(), 'SANDBOX_NOT_FOUND');
  await bestEffort('close the MCP server', () => server.close());
}
