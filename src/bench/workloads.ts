import { DEFAULT_IMAGE } from '../defaults.js';
import { Lab } from '../sdk/lab.js';
import type { LabApi, LabCreateOptions } from '../sdk/api.js';
import { driverInfo } from '../drivers/registry.js';
import { SnaplabError } from '../errors.js';
import type { Sandbox } from '../sdk/sandbox.js';
import { run } from '../host/run.js';
import { freshExec } from './fresh-exec.js';
import { scenarioReset, scenarioUp } from './scenario-bench.js';
import { closedLoop, phasesOf, type LoopResult } from './loop.js';
import type { BenchSettings, WorkloadSettings } from './settings.js';

import type { Workload } from './workload-names.js';
export { SCENARIO_WORKLOADS, WORKLOADS, type Workload } from './workload-names.js';

/** raise: create a sandbox to usable (the trace's total), then destroy it outside the timing. */
async function raise(lab: Lab, s: BenchSettings): Promise<LoopResult> {
  await lab.image(s.image ?? DEFAULT_IMAGE);
  const spec = {
    image: s.image,
    storage: s.storage,
    driver: s.driver,
    userns: s.userns,
    init: s.init,
    ...(s.egress ? { egress: true } : {}),
  };
  // one untimed create so that image import and pool mount are not in the samples
  await (await lab.create(spec)).destroy();
  return closedLoop(s.concurrency, { count: s.count, durationMs: s.durationMs }, async () => {
    const box = await lab.create(spec);
    const t = box.lastTrace!;
    await box.destroy();
    return { latencyMs: t.totalMs, phases: phasesOf(t) };
  });
}

/**
 * exec: argv in one existing sandbox, `concurrency` commands in flight over one connection (or,
 * through a daemon, over its keep-alive HTTP connections: a one-shot exec per request).
 */
async function exec(lab: LabApi, s: BenchSettings): Promise<LoopResult> {
  const box = await lab.create({
    storage: s.storage,
    driver: s.driver,
    userns: s.userns,
    ...(lab instanceof Lab ? {} : { timeoutS: 0 }),
  } as LabCreateOptions);
  try {
    await box.exec(s.argv);
    return await closedLoop(s.concurrency, { count: s.count, durationMs: s.durationMs }, async () => {
      const r = await box.exec(s.argv);
      if (r.exitCode !== 0) throw new Error(`${s.argv.join(' ')} exited ${r.exitCode}: ${r.stderr.toString().trim()}`);
    });
  } finally {
    await box.destroy();
  }
}

/**
 * snapshot: freeze, snapshot, thaw one sandbox (holding fillBytes of data); remove each snapshot
 * untimed. With the VM driver, a memory snapshot (memory, devices and disk at one instant).
 */
async function snapshot(lab: Lab, s: BenchSettings): Promise<LoopResult> {
  const boxes: Sandbox[] = [];
  try {
    for (let i = 0; i < s.concurrency; i++) {
      const box = await lab.create({ storage: s.storage, driver: s.driver, userns: s.userns });
      boxes.push(box);
      if (s.fillBytes) {
        const r = await box.exec([
          'dd',
          'if=/dev/zero',
          'of=/root/fill',
          'bs=1M',
          `count=${Math.max(1, Math.round(s.fillBytes / 2 ** 20))}`,
        ]);
        if (r.exitCode !== 0) throw new Error(`fill failed: ${r.stderr.toString()}`);
        // untimed: write the fill back first, so the samples measure snapshots of a tree of this
        // size, not the one-off writeback of freshly written data (which the first snapshot pays)
        await run('sync', ['-f', box.info.volume!.path]);
      }
    }
    let n = 0;
    return await closedLoop(s.concurrency, { count: s.count, durationMs: s.durationMs }, async (w) => {
      const snap = await boxes[w]!.snapshot(`bench-${process.pid}-${w}-${n++}`, {
        memory: driverInfo(s.driver).capabilities.memorySnapshot,
      });
      await lab.removeSnapshot(snap.name);
      return { latencyMs: snap.lastTrace!.totalMs, phases: phasesOf(snap.lastTrace) };
    });
  } finally {
    for (const b of boxes) await b.destroy();
  }
}

/** restore: snapshot one sandbox once, then restore to usable; destroy each restored sandbox untimed. */
async function restore(lab: Lab, s: BenchSettings): Promise<LoopResult> {
  const box = await lab.create({
    image: s.image,
    storage: s.storage,
    driver: s.driver,
    userns: s.userns,
    init: s.init,
  });
  const name = `bench-restore-${process.pid}-${Date.now()}`;
  try {
    // a VM's memory snapshot: a restore continues the machine, it does not boot
    await box.snapshot(name, { memory: driverInfo(s.driver).capabilities.memorySnapshot });
  } finally {
    await box.destroy();
  }
  try {
    // one untimed restore, as raise does, so that one-off work is not in the samples
    await (await lab.restore(name, { userns: s.userns })).destroy();
    return await closedLoop(s.concurrency, { count: s.count, durationMs: s.durationMs }, async () => {
      const restored = await lab.restore(name, { userns: s.userns });
      const t = restored.lastTrace!;
      await restored.destroy();
      return { latencyMs: t.totalMs, phases: phasesOf(t) };
    });
  } finally {
    await lab.removeSnapshot(name);
  }
}

/** exec and fresh-exec run on either library (`--host`); the rest on the embedded one. */
export function runWorkload(api: LabApi, w: Workload, s: WorkloadSettings): Promise<LoopResult> {
  if (w === 'fresh-exec') return freshExec(api, s);
  if (w === 'exec') return exec(api, s);
  if (!(api instanceof Lab))
    throw new SnaplabError('BAD_INPUT', `--host applies to exec and fresh-exec, not ${w}`, 'drop --host');
  const lab = api;
  if (w === 'scenario-up' || w === 'scenario-reset') {
    const settings = { ...s, file: s.scenario!, storage: s.storage, driver: s.driver };
    return w === 'scenario-up' ? scenarioUp(lab, settings) : scenarioReset(lab, settings);
  }
  return { raise, snapshot, restore }[w](lab, s);
}
