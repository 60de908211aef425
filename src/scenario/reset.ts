import { handleOf } from '../lab/lifecycle/handle.js';
import { detachRecordEgress } from '../lab/lifecycle/teardown.js';
import { SnaplabError } from '../errors.js';
import type { LabContext } from '../lab/context.js';
import type { Volume } from '../storage/backend.js';
import type { Trace } from '../timing/trace.js';
import { getScenario } from './down.js';
import { raiseMachine } from './machines.js';
import { machineSandbox } from './names.js';
import type { ScenarioManifest } from './snapshot.js';
import type { ScenarioSpec } from './spec.js';
import { runSteps, waitReady } from './steps.js';
import { targetSnapshot } from './standby.js';
import { clearFaults } from './net.js';

/**
 * Every machine back to the snapshot and usable: in parallel, each machine's sandbox is destroyed
 * and a new one raised from its snapshot into the same network namespace (so addresses, bridges
 * and names stay), its start steps run again (processes do not survive a namespace machine's
 * snapshot; a VM continues from its memory, running) and its readiness is checked again.
 * Default: the latest snapshot.
 */
export async function resetScenario(
  ctx: LabContext,
  name: string,
  to: string | undefined,
  trace: Trace,
): Promise<{ snapshot: string; discarded: Volume[] }> {
  const scn = getScenario(ctx, name);
  const snap = ctx.store.getScenarioSnapshot(name, targetSnapshot(ctx, name, to))!;
  const spec = scn.spec as ScenarioSpec;
  const manifest = snap.manifest as ScenarioManifest;
  const discarded: Volume[] = [];
  // storage first, once, before the machines contend for the thread pool
  await trace.phase('storage ready', () =>
    Promise.all(
      [...new Set(manifest.machines.map((x) => ctx.store.getSnapshot(x.snapshot)?.storage))]
        .filter((k) => k !== undefined)
        .map((k) => ctx.readyBackend(k)),
    ),
  );
  await Promise.all(
    spec.machines.map(async (m, j) => {
      const entry = manifest.machines.find((x) => x.machine === m.name);
      const snapRec = entry && ctx.store.getSnapshot(entry.snapshot);
      if (!snapRec)
        throw new SnaplabError(
          'SNAPSHOT_NOT_FOUND',
          `snapshot ${snap.name} of ${name} lacks machine ${m.name}`,
          'take a new scenario snapshot',
        );
      const old = ctx.store.getSandbox(machineSandbox(name, m.name));
      // The old machine's processes must be gone before the new one starts its services in the
      // same network namespace. Its volume is deleted after the reset has taken effect (deleting
      // subvolumes would hold up the clones); if this process dies first, no record owns the
      // volume any more and gc removes it.
      // The new machine is raised while the old one is killed (the old record steps aside under
      // another name); only its start steps, which may bind the same ports, wait for the old to be gone.
      let killed: Promise<void> = Promise.resolve();
      if (old) {
        ctx.store.renameSandbox(old.id, `${old.name}~${old.id}`);
        killed = trace.phase(`discard ${m.name}`, async () => {
          // killed, not halted: its files are thrown away, and a system machine's halt costs time
          await ctx.driver(old.driver).destroy({ ...handleOf(old), init: undefined });
          // its link to the egress router (up0 in the namespace the next machine is raised in)
          await detachRecordEgress(ctx, old);
          ctx.store.deleteSandbox(old.id);
          if (old.volume) discarded.push(old.volume);
        });
      }
      // a VM continues from its memory on the same taps, which the old QEMU must have let go of;
      // a machine with egress gets its link (up0) once the old one's is gone
      const memory = snapRec.memory ?? undefined;
      if (memory || old?.egress) await killed;
      const [machine] = await Promise.all([
        trace.phase(`raise ${m.name}`, () =>
          raiseMachine(ctx, { name, id: scn.id, spec }, j, trace, {
            from: { volume: snapRec.volume, origin: snapRec.name, ...(memory ? { memory } : {}) },
          }),
        ),
        killed,
      ]);
      try {
        // a VM restored from memory has its services running already
        if (m.start.length && !memory)
          await trace.phase(`start ${m.name}`, () => runSteps(ctx, machine, m.start, 'start'));
        await trace.phase(`ready ${m.name}`, () => waitReady(ctx, machine));
      } finally {
        void machine.agent.close();
      }
    }),
  );
  // blocks and impairments set since the snapshot live in the namespaces the machines kept
  await trace.phase('clear faults', () => clearFaults(ctx, name));
  ctx.store.setScenarioState(name, 'up');
  return { snapshot: snap.name, discarded };
}

/** Delete the volumes a reset discarded (after it took effect). */
export async function deleteDiscarded(ctx: LabContext, volumes: Volume[]): Promise<void> {
  await Promise.all(volumes.map(async (v) => (await ctx.readyBackend(v.kind)).delete(v)));
}
