import type { Lab } from '../sdk/lab.js';
import type { StorageKind } from '../storage/backend.js';
import type { Arm, LoopLimits } from './baselines.js';
import { closedLoop } from './loop.js';
import { phasesOf } from './workloads.js';

/** The baseline a restore replaces: raising the same machine (a VM: booting it) to usable. */
export function bootArm(lab: Lab, lim: LoopLimits, driver: string | undefined, storage: StorageKind | undefined): Arm {
  return {
    name: 'boot',
    note: `create to usable with the ${driver ?? 'namespaces'} driver`,
    run: (concurrency) =>
      closedLoop(concurrency, lim, async () => {
        const box = await lab.create({ driver, storage });
        const t = box.lastTrace!;
        await box.destroy();
        return { latencyMs: t.totalMs, phases: phasesOf(t) };
      }),
  };
}
