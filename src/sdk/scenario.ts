import type { LabContext } from '../lab/context.js';
import { getScenario, teardownScenario } from '../scenario/down.js';
import { machineSandbox } from '../scenario/names.js';
import { blockedPairs, heal, impair, partition, setBlocked } from '../scenario/net.js';
import { deleteDiscarded, resetScenario } from '../scenario/reset.js';
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
    // a scenario whose machines are not all running (one died, a reset was interrupted) is degraded
    const state = rec.state === 'up' && machines.some((m) => m.state !== 'running') ? 'degraded' : rec.state;
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
    };
  }

  /** Freeze every machine, snapshot every filesystem, write one manifest, thaw. */
  async snapshot(name: string): Promise<ScenarioSnapshotRecord & { trace: TraceSummary }> {
    const { result, trace } = await this.exclusive(() =>
      this.ctx.traced('scenario snapshot', this.name, (t) => snapshotScenario(this.ctx, this.name, name, t)),
    );
    return { ...result, trace };
  }

  /** One snapshot, reset or down of a scenario at a time, across processes. */
  private exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const id = getScenario(this.ctx, this.name).id;
    return withLock(join(ownerDir(this.ctx.home, id), 'op.lock'), async () => {
      getScenario(this.ctx, this.name); // still there after the wait?
      return fn();
    });
  }

  /** Every machine back to a snapshot (default: the latest), networks and addresses intact, readiness re-checked. */
  async reset(to?: string): Promise<{ snapshot: string; trace: TraceSummary }> {
    return this.exclusive(async () => {
      const { result, trace } = await this.ctx.traced('reset', this.name, (t) =>
        resetScenario(this.ctx, this.name, to, t),
      );
      // the trace ends when every machine is usable and ready; the discarded volumes go after
      await this.ctx.traced('reset cleanup', this.name, (t) =>
        t.phase('delete discarded volumes', () => deleteDiscarded(this.ctx, result.discarded)),
      );
      return { snapshot: result.snapshot, trace };
    });
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

  /** Remove machines, snapshots, bridges, veths and namespaces. */
  async down(): Promise<TraceSummary> {
    return this.exclusive(
      async () =>
        (
          await this.ctx.traced('down', this.name, (t) =>
            t.phase('teardown', () => teardownScenario(this.ctx, this.name)),
          )
        ).trace,
    );
  }
}
