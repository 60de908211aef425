import type { Command } from 'commander';
import { SnaplabError } from '../errors.js';
import { renderWaterfall } from '../timing/waterfall.js';
import { withLab, type CommonOptions } from './common.js';
import { ms, printJson, printTable } from './output.js';

export function registerTrace(program: Command): void {
  program
    .command('trace [operation]')
    .description('show a stored operation as a waterfall of its phases (without an id: the latest operations)')
    .option('--json', 'print JSON')
    .option('-n, --limit <n>', 'how many recent operations to list', '20')
    .action((id: string | undefined, o: CommonOptions & { limit: string }) =>
      withLab(o, async (lab) => {
        if (!id) {
          const ops = await lab.traces(Number(o.limit) || 20);
          if (o.json) return printJson(ops);
          printTable(
            ['OPERATION', 'KIND', 'TARGET', 'TOTAL', 'STATUS', 'WHEN'],
            ops.map((t) => [t.id, t.kind, t.target, ms(t.totalMs), t.status, new Date(t.startedAt).toISOString()]),
          );
          return;
        }
        const t = await lab.trace(id);
        if (!t)
          throw new SnaplabError(
            'OPERATION_NOT_FOUND',
            `no operation ${JSON.stringify(id)}`,
            'list recent ones with `snaplab trace`',
          );
        if (o.json) return printJson(t);
        process.stdout.write(`${renderWaterfall(t)}\n`);
        const removed = (t.details as { removed?: string[] } | null)?.removed;
        if (removed)
          process.stdout.write(removed.length ? `removed:\n  ${removed.join('\n  ')}\n` : 'removed nothing\n');
      }),
    );
}
