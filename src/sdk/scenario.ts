import type { LabContext } from '../lab/context.js';
import { getScenario, teardownScenario } from '../scenario/down.js';
import { machineSandbox } from '../scenario/names.js';
import { blockedPairs, heal, impair, partition, setBlocked } from '../scenario/net.js';
import { deleteDiscarded, resetScenario } from '../scenario/reset.js';
import { raiseStandby, standbyWanted, targetSnapshot } from '../scenario/standby.js';
import { finishSwap, removeSetAside, swapStandby } from '../scenario/standby-swap.js';
import { cancelStandby, queueStandby, waitForRaise } from '../scenario/standby-worker.js';
import { Trace } from '../timing/trace.js';
import { noted } from '../cleanup.js';
import { snapshotScenario } from '../scenario/snapshot.js';
import type { ScenarioSpec } from '../scenario/spec.js';
import { reconcile } from '../lab/lifecycle/reconcile.js';
import type { ScenarioSnapshotRecord } from '../store/records.js';
import type { TraceSummary } from '../timing/trace.js';
import { Sandbox } from './sandbox.js';
import { SnaplabError } from '../errors.js';
import { join } from 'node:path';
import { withLock } from '../host/lock.js';
import { ownerDir } from '../scenario/names.js';

export type { MachineStatus, ScenarioStatus } from '../views.js';

/** How long an operation on a scenario waits for the one before it (a reset may wait for a standby's raise). */
const LOCK_WAIT_MS = 30 * 60_000;

export interface ResetOptions {
  /** 0: no standby for this reset (the machines are raised again) nor after it; default: the scenario's setting */
  standby?: 0 | 1;
  /** false: do not queue the next standby after this reset */
  next?: boolean;
}

export interface ResetResult {
  snapshot: string;
  trace: TraceSummary;
  /** 'swapped': a standby was swapped in; else `none: <why>` (the machines were raised again) */
  standby: string;
}

const scenarioGone = (name: string): SnaplabError =>
  new SnaplabError('SCENARIO_NOT_FOUND', `scenario ${name} was taken down`, 'raise it again with `snaplab up FILE`');
import type { ScenarioStatus } from '../views.js';

/** A scenario that is up: several networked machines, snapshotted and reset as one. */
export class Scenario {
  /** trace of the operation that produced this object (up), when it did */
  lastTrace: TraceSummary | undefined;

  /** @internal */
  constructor(
    private readonly ctx: LabContext,
    readonly name: string,
    trace?: TraceSummary,
  ) {
    this.lastTrace = trace;
  }

  get spec(): ScenarioSpec {
    return getScenario(this.ctx, this.name).spec as ScenarioSpec;
  }

  /** A machine of the scenario, as a Sandbox (exec, getFile, putFile...). */
  async machine(name: string): Promise<Sandbox> {
    const rec = this.ctx.store.getSandbox(machineSandbox(this.name, name));
    if (!rec) {
      throw new SnaplabError(
        'SANDBOX_NOT_FOUND',
        `scenario ${this.name} has no machine ${JSON.stringify(name)}`,
        `its machines: ${this.spec.machines.map((m) => m.name).join(', ')}`,
      );
    }
    return new Sandbox(this.ctx, await reconcile(this.ctx, rec));
  }

  async status(): Promise<ScenarioStatus> {
    const rec = getScenario(this.ctx, this.name);
    const spec = rec.spec as ScenarioSpec;
    const machines = await Promise.all(
      spec.machines.map(async (m) => {
        const sb = this.ctx.store.getSandbox(machineSandbox(this.name, m.name));
        const r = sb ? await reconcile(this.ctx, sb) : undefined;
        return {
          machine: m.name,
          sandbox: machineSandbox(this.name, m.name),
          state: r?.state ?? 'missing',
          reason: r?.reason ?? null,
          hostname: m.hostname,
          addresses: m.networks.map((n) => ({ network: n.network, address: n.address })),
        };
      }),
    );
    // a scenario whose machines are not all running (one died, a reset was interrupted) is degraded;
    // so is one whose swap was interrupted (its next reset, snapshot or down finishes it)
    const interrupted = rec.standby?.state === 'swapping';
    const state =
      rec.state === 'up' && (interrupted || machines.some((m) => m.state !== 'running')) ? 'degraded' : rec.state;
    const st = rec.standby;
    const networks = spec.networks.map((n) => ({ name: n.name, subnet: n.subnet }));
    const blocked = rec.state === 'up' ? await blockedPairs(this.ctx, this.name) : [];
    return {
      name: this.name,
      state,
      reason: rec.reason,
      file: rec.file,
      machines,
      networks,
      blocked,
      snapshots: this.ctx.store.listScenarioSnapshots(this.name).map((s) => s.name),
      standby: st
        ? {
            state: st.state,
            snapshot: st.snapshot,
            reason: interrupted ? 'a reset was interrupted while it swapped this standby in' : (st.reason ?? null),
            raiseMs: st.raiseMs ?? null,
          }
        : null,
      standbyWanted: standbyWanted(rec),
    };
  }

  /**
   * Freeze every machine, snapshot every filesystem, write one manifest, thaw. Then, unless
   * `standby: 0` or the scenario keeps none, a standby of it is raised in the background.
   */
  async snapshot(
    name: string,
    opts: { standby?: 0 | 1 } = {},
  ): Promise<ScenarioSnapshotRecord & { trace: TraceSummary }> {
    const { result, trace } = await this.exclusive(async () => {
      const taken = await this.ctx.traced('scenario snapshot', this.name, (t) =>
        snapshotScenario(this.ctx, this.name, name, t),
      );
      // a standby is of one snapshot: the new one wants its own (a failed snapshot keeps the old)
      await cancelStandby(this.ctx, this.name);
      return taken;
    });
    if (standbyWanted(getScenario(this.ctx, this.name), opts.standby))
      await queueStandby(this.ctx, this.name, result.name);
    return { ...result, trace };
  }

  /**
   * One snapshot, reset or down of a scenario at a time, across processes. Each first finishes a
   * swap that was interrupted and removes the machines the last one set aside.
   */
  private async exclusive<T>(fn: () => Promise<T>, opts: { tolerant?: boolean } = {}): Promise<T> {
    const id = getScenario(this.ctx, this.name).id;
    try {
      return await withLock(
        join(ownerDir(this.ctx.home, id), 'op.lock'),
        async () => {
          const scn = getScenario(this.ctx, this.name); // still there after the wait?
          if (scn.id !== id) throw scenarioGone(this.name);
          // a down goes on whatever these meet: it removes every copy anyway
          const tidy = async (): Promise<void> => {
            await finishSwap(this.ctx, this.name);
            await removeSetAside(this.ctx, scn);
          };
          if (opts.tolerant) await tidy().catch(noted(`finish the last swap of ${this.name}`));
          else await tidy();
          return fn();
        },
        LOCK_WAIT_MS,
      );
    } catch (e) {
      // taken down while this waited: its run directory (and the lock's) went with it
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') getScenario(this.ctx, this.name);
      throw e;
    }
  }

  /**
   * Every machine back to a snapshot (default: the latest), networks and addresses intact, readiness
   * re-checked. With a standby of that snapshot ready, it is swapped in (no machine is raised on
   * the reset's path) and the next is queued; without one, the machines are raised again and
   * `standby` says why.
   */
  async reset(to?: string, opts: ResetOptions = {}): Promise<ResetResult> {
    const r = await this.exclusive(async () => {
      const scn = getScenario(this.ctx, this.name);
      const target = targetSnapshot(this.ctx, this.name, to);
      const use = standbyWanted(scn, opts.standby);
      const st = scn.standby;
      if (st && (!use || st.state === 'queued' || st.snapshot !== target)) await cancelStandby(this.ctx, this.name);
      else if (st) await waitForRaise(this.ctx, this.name, target);
      let why: string | null = use ? null : 'standbys are off';
      const { result, trace } = await this.ctx.traced('reset', this.name, async (t) => {
        if (use) why = await swapStandby(this.ctx, this.name, target, t);
        if (why === null) return { snapshot: target, discarded: [] };
        t.record(`no standby: ${why}`, Trace.now(), Trace.now());
        await cancelStandby(this.ctx, this.name);
        return resetScenario(this.ctx, this.name, target, t);
      });
      // the trace ends when every machine is usable and ready; the discarded volumes go after
      if (result.discarded.length)
        await this.ctx.traced('reset cleanup', this.name, (t) =>
          t.phase('delete discarded volumes', () => deleteDiscarded(this.ctx, result.discarded)),
        );
      return { snapshot: result.snapshot, trace, standby: why === null ? 'swapped' : `none: ${why}` };
    });
    if (opts.next !== false && standbyWanted(getScenario(this.ctx, this.name), opts.standby))
      await queueStandby(this.ctx, this.name, r.snapshot);
    return r;
  }

  /**
   * Raise the standby of the latest snapshot here, in the foreground (`snaplab standby NAME`), or,
   * with `worker`, as the worker a snapshot or reset started (it first removes what the last swap
   * set aside). Turns standbys on for the scenario unless it is a worker.
   */
  async raiseStandby(opts: { worker?: string } = {}): Promise<TraceSummary | null> {
    const scn = getScenario(this.ctx, this.name);
    if (opts.worker !== undefined) {
      if (scn.id !== opts.worker) return null; // another scenario of the same name since
      await this.exclusive(async () => undefined);
      const st = getScenario(this.ctx, this.name).standby;
      if (st?.state !== 'queued' || (st.owner !== null && st.owner.pid !== process.pid)) return null;
      return (
        await this.ctx.traced('standby', this.name, (t) => raiseStandby(this.ctx, this.name, st.snapshot, t, true))
      ).trace;
    }
    this.ctx.store.setScenarioStandbyWanted(this.name, true);
    const target = targetSnapshot(this.ctx, this.name);
    await this.exclusive(() => cancelStandby(this.ctx, this.name));
    return (await this.ctx.traced('standby', this.name, (t) => raiseStandby(this.ctx, this.name, target, t))).trace;
  }

  /** No standby for this scenario from now on (`snaplab standby NAME --off`): a raise under way is stopped, one ready removed. */
  async removeStandby(): Promise<void> {
    this.ctx.store.setScenarioStandbyWanted(this.name, false);
    await this.exclusive(() => cancelStandby(this.ctx, this.name));
  }

  block(a: string, b: string): Promise<void> {
    return setBlocked(this.ctx, this.name, a, b, true);
  }

  unblock(a: string, b: string): Promise<void> {
    return setBlocked(this.ctx, this.name, a, b, false);
  }

  partition(...groups: string[][]): Promise<void> {
    return partition(this.ctx, this.name, groups);
  }

  heal(): Promise<void> {
    return heal(this.ctx, this.name);
  }

  impair(machine: string, opts: { delayMs?: number; jitterMs?: number; lossPct?: number } | null): Promise<void> {
    return impair(this.ctx, this.name, machine, opts);
  }

  /** Remove machines (a standby's too, its raise stopped), snapshots, bridges, veths and namespaces. */
  async down(): Promise<TraceSummary> {
    return this.exclusive(
      async () => {
        const { trace } = await this.ctx.traced('down', this.name, async (t) => {
          await t.phase('stop the standby', () => cancelStandby(this.ctx, this.name));
          await t.phase('teardown', () => teardownScenario(this.ctx, this.name));
        });
        return trace;
      },
      { tolerant: true },
    );
  }
}
