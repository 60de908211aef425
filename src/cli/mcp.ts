import { InvalidArgumentError, type Command } from 'commander';
import { withApi } from './common.js';

/** `snaplab mcp`: the Model Context Protocol on stdio (docs/mcp.md). */
export function registerMcp(program: Command): void {
  program
    .command('mcp')
    .description(
      "serve the Model Context Protocol on stdin/stdout (tools: create, run, files, snapshot, destroy); with SNAPLAB_HOST through that daemon, which keeps each sandbox's TTL, else the embedded lab, whose sandboxes made here are destroyed when the session ends",
    )
    .option('--ttl <seconds>', 'the TTL of a sandbox made without one (default 600)', (v: string) => {
      const n = Number(v);
      if (!Number.isInteger(n) || n <= 0) throw new InvalidArgumentError(`--ttl takes a positive integer, not ${v}`);
      return n;
    })
    .action(async (o: { ttl?: number }) => {
      await withApi({}, async (lab) => {
        const { serveStdio } = await import('../mcp/stdio.js');
        await serveStdio(lab, !!process.env.SNAPLAB_HOST, o.ttl ?? 600);
      });
    });
}
