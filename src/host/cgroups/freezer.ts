import type { Cgroup } from './types.js';
import * as v1 from './v1.js';
import * as v2 from './v2.js';

const FREEZE_TIMEOUT_MS = 2000;

/** Stop every process of the cgroup; returns once the kernel says the cgroup is frozen. */
export function freeze(cg: Cgroup, timeoutMs = FREEZE_TIMEOUT_MS): Promise<void> {
  return cg.version === 1 ? v1.freezeV1(cg, timeoutMs) : v2.freezeV2(cg, timeoutMs);
}
export function thaw(cg: Cgroup): Promise<void> {
  return cg.version === 1 ? v1.thawV1(cg) : v2.thawV2(cg);
}
export function isFrozen(cg: Cgroup): Promise<boolean> {
  return cg.version === 1 ? v1.isFrozenV1(cg) : v2.isFrozenV2(cg);
}
