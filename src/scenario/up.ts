import { mkdir } from 'node:fs/promises';
import { SnaplabError } from '../errors.js';
import type { LabContext } from '../lab/context.js';
import { checkName, newId } from '../lab/names.js';
import { me } from '../lab/lifecycle/owner.js';
import type { ScenarioRecord } from '../store/records.js';
import type { StorageKind } from '../storage/backend.js';
import type { Trace } from '../timing/trace.js';
import { raiseMachine } from './machines.js';
import { checkMemory } from '../drivers/memory.js';
import { DEFAULT_DRIVER } from '../defaults.js';
import { DRIVER_NAMES, driverInfo } from '../drivers/registry.js';
import { ownerDir } from './names.js';
import { wireNetworks } from './wiring.js';
import type { LoadedScenario, ScenarioSpec } from './spec.js';
import { runSteps, waitReady, type Machine } from './steps.js';
import { teardownScenario } from './down.js';
import { noted } from '../cleanup.js';

export interface UpOptions {
  name?: string;
  keepOnFailure?: boolean;
  /** storage of every machine (default: the best that works here) */
  storage?: StorageKind;
  /** the driver of every machine that names none in the file (default: namespaces) */
  driver?: string;
  /** live progress: machine, what it is doing now */
  onProgress?: (machine: string, status: string) => void;
}

/** Raise, provision, start and check one machine, reporting progress. */
async function bringUp(
  ctx: LabContext,
  rec: { name: string; id: string; spec: ScenarioSpec },
  j: number,
  trace: Trace,
  opts: UpOptions,
): Promise<Machine> {
  const m = rec.spec.machines[j]!;
  const say = (s: string): void => opts.onProgress?.(m.name, s);
  say('raising');
  const machine = await trace.phase(`raise ${m.name}`, () =>
    raiseMachine(ctx, rec, j, trace, opts.storage ? { storage: opts.storage } : {}),
  );
  try {
    if (m.provision.length) {
      say('provisioning');
      await trace.phase(`provision ${m.name}`, () => runSteps(ctx, machine, m.provision, 'provision'));
    }
    if (m.start.length) {
      say('starting');
      await trace.phase(`start ${m.name}`, () => runSteps(ctx, machine, m.start, 'start'));
    }
    if (m.ready.length) say('waiting for readiness');
    await trace.phase(`ready ${m.name}`, () => waitReady(ctx, machine));
  } catch (e) {
    // the machine may be kept (--keep-on-failure): its connection must not keep this process alive
    void machine.agent.close();
    throw e;
  }
  say('ready');
  return machine;
}

/**
 * The images the file says how to build, built (cached by their inputs: the same inputs again
 * download nothing), each machine's `image` then the built one's name. Before anything is made.
 */
async function withImages(ctx: LabContext, spec: ScenarioSpec, opts: UpOptions, trace: Trace): Promise<ScenarioSpec> {
  const builds = new Map<string, Promise<string>>();
  const { buildDebian } = await import('../lab/images/build.js');
  const machines = [];
  for (const m of spec.machines) {
    if (!m.build) {
      machines.push(m);
      continue;
    }
    const key = JSON.stringify([m.build, m.image]);
    let built = builds.get(key);
    if (!built) {
      const say = (s: string): void => opts.onProgress?.(m.name, `image: ${s}`);
      say(`building ${m.image || 'an image'} from Debian ${m.build.suite} (cached by its inputs)`);
      built = buildDebian(ctx, m.build, { ...(m.image ? { name: m.image } : {}), onProgress: say }, trace).then(
        (b) => b.image.name,
        (e: unknown) => {
          if (!(e instanceof SnaplabError) || e.code !== 'IMAGE_EXISTS') throw e;
          throw new SnaplabError(
            'IMAGE_EXISTS',
            `machine ${m.name}: ${e.message}`,
            `give its image another name in the scenario file, or remove the old one (\`snaplab image rm ${m.image}\`) to build it from these inputs`,
            { cause: e },
          );
        },
      );
      builds.set(key, built);
    }
    machines.push({ ...m, image: await built });
  }
  return { ...spec, machines };
}

/** The file's spec with `driver` given to every machine that names none (recorded with the scenario). */
function withDriver(spec: ScenarioSpec, driver: string | undefined): ScenarioSpec {
  if (driver === undefined || driver === DEFAULT_DRIVER) return spec;
  if (!DRIVER_NAMES.includes(driver))
    throw new SnaplabError(
      'BAD_INPUT',
      `unknown driver ${JSON.stringify(driver)} for a scenario's machines`,
      `use ${DRIVER_NAMES.join(' or ')}`,
    );
  return { ...spec, machines: spec.machines.map((m) => (m.driver ? m : { ...m, driver })) };
}

/** What no machine can be raised with, said before anything is made (a VM's memory is its guest's RAM: it has a floor). */
function checkMachines(spec: ScenarioSpec): void {
  for (const m of spec.machines) {
    const info = driverInfo(m.driver);
    const bytes = m.limits.memoryBytes;
    const min = info.memory.minBytes;
    if (bytes === undefined || min === undefined) continue;
    const dflt = info.memory.defaultBytes;
    checkMemory(
      info,
      bytes,
      `machine ${m.name}, ${info.machineNoun},`,
      `give it memory: ${min / 2 ** 20}M or more${dflt === undefined ? '' : ` (default ${dflt / 2 ** 20}M)`}`,
    );
  }
}

/**
 * `snaplab up`: record the scenario first (its host objects are named from its id), wire the
 * networks, then raise every machine in parallel. A failure removes everything `up` made, unless
 * keepOnFailure (then the scenario stays, marked failed, for `snaplab exec` and `down`).
 */
export async function upScenario(
  ctx: LabContext,
  loaded: LoadedScenario,
  opts: UpOptions,
  trace: Trace,
): Promise<ScenarioRecord> {
  const name = checkName('scenario', opts.name ?? loaded.spec.name ?? 'scenario');
  const wanted = withDriver(loaded.spec, opts.driver);
  checkMachines(wanted);
  if (ctx.store.getScenario(name)) {
    throw new SnaplabError(
      'SCENARIO_EXISTS',
      `a scenario named ${name} is already up`,
      `take it down with \`snaplab down ${name}\`, or pick another --name`,
    );
  }
  const rec: ScenarioRecord = {
    name,
    id: newId().slice(0, 6),
    file: loaded.path,
    hash: loaded.hash,
    spec: wanted,
    state: 'creating',
    reason: `being raised by pid ${process.pid}`,
    createdAt: Date.now(),
    owner: me('create'),
  };
  const spec = await trace.phase('images', () => withImages(ctx, wanted, opts, trace));
  rec.spec = spec;
  ctx.store.insertScenario(rec);
  trace.target = name;
  const machines: Machine[] = [];
  try {
    await mkdir(ownerDir(ctx.home, rec.id), { recursive: true });
    await wireNetworks(ctx, rec.id, spec, opts.storage ?? (await ctx.defaultStorage()), trace);
    const results = await Promise.allSettled(
      spec.machines.map((_, j) => bringUp(ctx, { name, id: rec.id, spec }, j, trace, opts)),
    );
    for (const r of results) if (r.status === 'fulfilled') machines.push(r.value);
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
    ctx.store.setScenarioState(name, 'up');
    return { ...rec, state: 'up', reason: null, owner: null };
  } catch (e) {
    if (opts.keepOnFailure) {
      ctx.store.setScenarioState(name, 'failed', (e as Error).message);
    } else {
      await trace.phase('clean up', () => teardownScenario(ctx, name)).catch(noted(`clean up scenario ${name}`));
    }
    throw e;
  } finally {
    for (const m of machines) void m.agent.close();
  }
}
