import { randomBytes } from 'node:crypto';
import { SnaplabError } from '../errors.js';
import type { Lab } from '../sdk/lab.js';
import type { Scenario } from '../sdk/scenario.js';
import type { StorageKind } from '../storage/backend.js';
import type { LoopLimits, Arm } from './baselines.js';
import { closedLoop, phasesOf, type LoopResult } from './loop.js';
import { noted } from '../cleanup.js';

export interface ScenarioBenchSettings extends LoopLimits {
  concurrency: number;
  file: string;
  storage?: StorageKind;
  /** the driver of machines whose file names none (`bench --driver qemu`: VMs) */
  driver?: string;
}

const now = (): number => Number(process.hrtime.bigint()) / 1e6;
const uniqueName = (what: string): string => `bench-${what}-${randomBytes(2).toString('hex')}`;

function oneAtATime(concurrency: number, workload: string): void {
  if (concurrency !== 1)
    throw new SnaplabError(
      'BAD_INPUT',
      `${workload} runs one scenario at a time`,
      'use --concurrency 1 (or --ladder 1)',
    );
}

/** scenario-up: raise the scenario to every machine ready (the up trace's total); take it down untimed. */
export async function scenarioUp(lab: Lab, s: ScenarioBenchSettings): Promise<LoopResult> {
  oneAtATime(s.concurrency, 'scenario-up');
  return closedLoop(1, s, async () => {
    const scn = await lab.up(s.file, { name: uniqueName('up'), storage: s.storage, driver: s.driver });
    const t = scn.lastTrace!;
    await scn.down();
    return { latencyMs: t.totalMs, phases: phasesOf(t) };
  });
}

/** Wait (untimed) until the scenario's standby is ready, as a user's next rerun finds it; its raise time. */
async function standbyReady(scn: Scenario): Promise<number | null> {
  const end = Date.now() + 600_000;
  for (;;) {
    const st = (await scn.status()).standby;
    if (st?.state === 'ready') return st.raiseMs;
    if (st === null || st.state === 'failed' || Date.now() > end)
      throw new SnaplabError(
        'SCENARIO_FAILED',
        `the bench scenario's standby is ${st ? `${st.state}: ${st.reason ?? ''}` : 'not there'}`,
        'see `snaplab status` and the standby log under $SNAPLAB_HOME/run/net/',
      );
    await new Promise((r) => setTimeout(r, 50));
  }
}

/**
 * scenario-reset: up once and snapshot (untimed), then reset again and again; latency is the reset
 * trace's total (every machine usable and ready). Before each reset its standby is waited for,
 * untimed (the reset is timed as a rerun finds it when its standby is ready; the raise is its own
 * operation, reported as the phase `standby raise (background)`). `standby: 0`: every reset raises
 * the machines again (the no-standby baseline). Down after the rep, untimed.
 */
export async function scenarioReset(lab: Lab, s: ScenarioBenchSettings, standby: 0 | 1 = 1): Promise<LoopResult> {
  oneAtATime(s.concurrency, 'scenario-reset');
  const scn = await lab.up(s.file, { name: uniqueName('reset'), storage: s.storage, driver: s.driver });
  try {
    await scn.snapshot('base', { standby });
    return await closedLoop(1, s, async () => {
      const raiseMs = standby ? await standbyReady(scn) : null;
      const r = await scn.reset('base', { standby });
      if (standby && r.standby !== 'swapped')
        throw new SnaplabError('SCENARIO_FAILED', `a reset did not swap its ready standby in (${r.standby})`, 'a bug');
      const phases = phasesOf(r.trace);
      return {
        latencyMs: r.trace.totalMs,
        phases: raiseMs === null ? phases : { ...phases, 'standby raise (background)': raiseMs },
      };
    });
  } finally {
    await scn.down();
  }
}

/** The reset without a standby: every machine raised again from the snapshot (`reset --standby 0`). */
export function noStandby(lab: Lab, s: Omit<ScenarioBenchSettings, 'concurrency'>): Arm {
  return {
    name: 'no-standby',
    note: 'snaplab reset --standby 0: every machine raised again from the snapshot, started and checked',
    run: (concurrency) => scenarioReset(lab, { ...s, concurrency }, 0),
  };
}

/** The baseline a reset replaces: `down` then `up` of the same scenario, timed together. */
export function downUp(lab: Lab, s: Omit<ScenarioBenchSettings, 'concurrency'>): Arm {
  return {
    name: 'down+up',
    note: 'snaplab down, then snaplab up, of the same scenario file',
    run: async (concurrency) => {
      oneAtATime(concurrency, 'down+up');
      const name = uniqueName('downup');
      let scn = await lab.up(s.file, { name, storage: s.storage, driver: s.driver });
      try {
        return await closedLoop(1, s, async () => {
          const t0 = now();
          await scn.down();
          scn = await lab.up(s.file, { name, storage: s.storage, driver: s.driver });
          return { latencyMs: now() - t0 };
        });
      } finally {
        await scn.down().catch(noted('take the bench scenario down'));
      }
    },
  };
}
