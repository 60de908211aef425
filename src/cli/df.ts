import type { Command } from 'commander';
import { formatBytes } from '../lab/sizes.js';
import type { StorageKind, Volume } from '../storage/backend.js';
import { withLab, type CommonOptions } from './common.js';
import { printJson, printTable } from './output.js';

interface Row {
  kind: 'sandbox' | 'snapshot' | 'image';
  name: string;
  storage: StorageKind;
  exclusiveBytes: number | null;
  sharedBytes: number | null;
  /** a capped sandbox: what it wrote against its cap (--disk), as the storage counts it */
  writtenBytes?: number;
  diskBytes?: number | null;
  error?: string;
}

export function registerDf(program: Command): void {
  program
    .command('df')
    .description(
      'disk use per sandbox, snapshot and image: bytes of its own (exclusive), bytes shared with others, and what a capped sandbox wrote against its --disk cap',
    )
    .option('--json', 'print JSON')
    .action((o: CommonOptions) =>
      withLab(o, async (lab) => {
        const ctx = lab.context;
        const items: { kind: Row['kind']; name: string; storage: StorageKind; volume: Volume | null; cap?: number }[] =
          [
            ...ctx.store
              .listImageVolumes()
              .map((v) => ({ kind: 'image' as const, name: v.image, storage: v.storage, volume: v.volume })),
            ...ctx.store
              .listSnapshots()
              .map((s) => ({ kind: 'snapshot' as const, name: s.name, storage: s.storage, volume: s.volume })),
            ...ctx.store
              .listSandboxes()
              .map((s) => ({
                kind: 'sandbox' as const,
                name: s.name,
                storage: s.storage,
                volume: s.volume,
                cap: s.limits.diskBytes,
              })),
          ];
        const rows: Row[] = [];
        for (const it of items) {
          if (!it.volume) continue;
          try {
            const backend = await ctx.readyBackend(it.storage);
            const u = await backend.usage(it.volume);
            const q = it.cap ? await backend.diskQuota?.(it.volume) : null;
            rows.push({
              kind: it.kind,
              name: it.name,
              storage: it.storage,
              exclusiveBytes: u.exclusiveBytes,
              sharedBytes: u.sharedBytes,
              ...(q ? { writtenBytes: q.usedBytes, diskBytes: q.limitBytes } : {}),
            });
          } catch (e) {
            rows.push({
              kind: it.kind,
              name: it.name,
              storage: it.storage,
              exclusiveBytes: null,
              sharedBytes: null,
              error: (e as Error).message,
            });
          }
        }
        const total = rows.reduce((a, r) => a + (r.exclusiveBytes ?? 0), 0);
        if (o.json) return printJson({ items: rows, totalExclusiveBytes: total });
        const fmt = (n: number | null): string => (n === null ? '?' : formatBytes(n));
        const cap = (r: Row): string =>
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
