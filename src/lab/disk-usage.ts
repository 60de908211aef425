/**
 * `snaplab df`: disk use per sandbox, snapshot and image, as each storage backend measures it
 * (docs/storage.md): bytes of its own, bytes shared, and what a capped sandbox wrote.
 */
import type { StorageKind, Volume } from '../storage/backend.js';
import type { LabContext } from './context.js';

export interface DiskUsage {
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

export async function diskUsage(ctx: LabContext): Promise<DiskUsage[]> {
  const items: { kind: DiskUsage['kind']; name: string; storage: StorageKind; volume: Volume | null; cap?: number }[] =
    [
      ...ctx.store
        .listImageVolumes()
        .map((v) => ({ kind: 'image' as const, name: v.image, storage: v.storage, volume: v.volume })),
      ...ctx.store
        .listSnapshots()
        .map((s) => ({ kind: 'snapshot' as const, name: s.name, storage: s.storage, volume: s.volume })),
      ...ctx.store.listSandboxes().map((s) => ({
        kind: 'sandbox' as const,
        name: s.name,
        storage: s.storage,
        volume: s.volume,
        cap: s.limits.diskBytes,
      })),
    ];
  const rows: DiskUsage[] = [];
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
  return rows;
}
