import { DEFAULT_DRIVER } from '../defaults.js';
import type { Lab } from '../sdk/lab.js';
import type { StorageKind } from '../storage/backend.js';
import type { Arm, LoopLimits } from './baselines.js';
import { closedLoop, phasesOf } from './loop.js';

/** The baseline a restore replaces: raising the same machine (a VM: booting it; a system machine: to systemd running) to usable. */
export function bootArm(
  lab: Lab,
  lim: LoopLimits,
  m: { driver?: string; storage?: StorageKind; image?: string; init?: 'systemd' | 'agent'; userns?: boolean },
): Arm {
  return {
    name: 'boot',
    note: `create to usable with the ${m.driver ?? DEFAULT_DRIVER} driver${m.image ? `, image ${m.image}` : ''}${m.init ? `, --init ${m.init}` : ''}`,
    run: (concurrency) =>
      closedLoop(concurrency, lim, async () => {
        const box = await lab.create({
          driver: m.driver,
          storage: m.storage,
          image: m.image,
          init: m.init,
          userns: m.userns,
        });
        const t = box.lastTrace!;
        await box.destroy();
        return { latencyMs: t.totalMs, phases: phasesOf(t) };
      }),
  };
}
