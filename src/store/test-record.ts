/** A sandbox record with no machine behind it, for tests of the store and what reads it. */
import type { SandboxRecord } from './records.js';

export function testRecord(id: string, over: Partial<SandboxRecord> = {}): SandboxRecord {
  return {
    id,
    name: `n-${id}`,
    image: 'busybox',
    storage: 'dir',
    driver: 'namespaces',
    state: 'dead',
    reason: null,
    volume: null,
    pid: null,
    pidStart: null,
    limits: {},
    origin: null,
    createdAt: 1,
    pool: null,
    scenario: null,
    baseline: null,
    uidBase: null,
    ...over,
  };
}
