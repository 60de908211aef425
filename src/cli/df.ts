import type { Command } from 'commander';
import { formatBytes } from '../lab/sizes.js';
import type { DiskUsage } from '../lab/disk-usage.js';
import { withLab, type CommonOptions } from './common.js';
import { printJson, printTable } from './output.js';

export function registerDf(program: Command): void {
  program
    .command('df')
    .description(
      'disk use per sandbox, snapshot and image: bytes of its own (exclusive), bytes shared with others, and what a capped sandbox wrote against its --disk cap',
    )
    .option('--json', 'print JSON')
    .action((o: CommonOptions) =>
      withLab(o, async (lab) => {
        const rows = await lab.diskUsage();
        const total = rows.reduce((a, r) => a + (r.exclusiveBytes ?? 0), 0);
        if (o.json) return printJson({ items: rows, totalExclusiveBytes: total });
        const fmt = (n: number | null): string => (n === null ? '?' : formatBytes(n));
        const cap = (r: DiskUsage): string =>
          r.writtenBytes === undefined
            ? '-'
            : `${formatBytes(r.writtenBytes)} of ${r.diskBytes ? formatBytes(r.diskBytes) : 'no cap'}`;
        printTable(
          ['KIND', 'NAME', 'STORAGE', 'EXCLUSIVE', 'SHARED', 'WRITTEN/CAP'],
          rows.map((r) => [r.kind, r.name, r.storage, fmt(r.exclusiveBytes), fmt(r.sharedBytes), cap(r)]),
        );
        process.stdout.write(`\ntotal exclusive: ${formatBytes(total)} (how each backend measures: docs/storage.md)\n`);
      }),
    );
}
