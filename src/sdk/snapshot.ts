import { DEFAULT_DRIVER } from '../defaults.js';
import type { SnapshotRecord } from '../store/records.js';
import type { TraceSummary } from '../timing/trace.js';

/**
 * A read-only point-in-time copy of a sandbox's filesystem (and, for VMs with `memory`, of the
 * whole machine); restore it with `lab.restore(name)`, remove it with `lab.removeSnapshot(name)`.
 */
export class Snapshot {
  /** @internal */
  constructor(
    readonly record: SnapshotRecord,
    readonly lastTrace?: TraceSummary,
  ) {}

  get name(): string {
    return this.record.name;
  }
  get id(): string {
    return this.record.id;
  }
  get storage(): string {
    return this.record.storage;
  }

  toJSON(): Record<string, unknown> {
    const r = this.record;
    return {
      name: r.name,
      id: r.id,
      sandbox: r.sandbox,
      image: r.image,
      storage: r.storage,
      driver: r.memory?.driver ?? r.driver ?? DEFAULT_DRIVER,
      kind: r.memory ? 'memory' : 'filesystem',
      ...(r.memory ? { memoryBytes: r.memory.bytes } : {}),
      limits: r.limits,
      owner: r.owner ?? null,
      createdAt: new Date(r.createdAt).toISOString(),
    };
  }
}
