import type { LabContext } from '../lab/context.js';
import { poolStats, removePool, trimPool, type PoolStats } from '../lab/pools/admin.js';
import type { PoolRunner } from '../lab/pools/runner.js';
import { runInPool, withImageConfig, type RunOutcome, type RunSpec } from '../lab/pools/run.js';
import { SnaplabError } from '../errors.js';
import { Trace, type TraceSummary } from '../timing/trace.js';
import { Sandbox } from './sandbox.js';
import type { BufferOutput, PoolApi, PoolTakes } from './api.js';
import { poolTakes } from '../lab/lifecycle/check.js';
import { encoded, type Text } from './output.js';

/**
 * A pool of paused standbys, each a fresh sandbox for one execution. Get one with
 * `lab.createPool()` or `lab.pool(name)`. `start()` keeps it at its target size in the
 * background for as long as this process runs; without a holder the pool is not refilled.
 */
export class Pool implements PoolApi {
  /** @internal */
  constructor(
    private readonly ctx: LabContext,
    private readonly runner: PoolRunner,
    /** the pool is being removed: its runner is forgotten; call what it returns once it is gone */
    private readonly onClose: () => () => void,
  ) {}

  get name(): string {
    return this.runner.name;
  }

  /** Target, ready (paused standbys), in use, raising, and the counters: hits, misses, recycled, refused dirty, leaks. */
  stats(): Promise<PoolStats> {
    return poolStats(this.ctx, this.name);
  }

  /** Its takes from the stored traces (see PoolApi.takes). */
  async takes(from: { after?: number; since?: number } = {}): Promise<PoolTakes> {
    return poolTakes(this.ctx, this.name, from);
  }

  /** Raise standbys until the target is ready (progress reported as it goes). */
  fill(onProgress?: (ready: number, target: number) => void): Promise<void> {
    return this.runner.fill(onProgress);
  }

  /** Keep the pool at its target in the background (bounded, and never more than one raise while executions run). */
  start(): void {
    this.runner.start();
  }

  /** Stop refilling; standbys stay paused and usable by other processes. */
  stop(): Promise<void> {
    return this.runner.stop();
  }

  /** Errors of background refills since the last call, newest last. */
  takeRefillErrors(): string[] {
    return this.runner.refillErrors.splice(0);
  }

  /**
   * One execution in a fresh sandbox: take a standby (raising one on a miss), copy files in, run
   * argv, then give the sandbox back: recycled into the pool only if provably clean, destroyed otherwise.
   */
  async run(argv: string[], spec: RunSpec & BufferOutput): Promise<RunOutcome & { trace: TraceSummary }>;
  async run(argv: string[], spec?: RunSpec): Promise<Text<RunOutcome> & { trace: TraceSummary }>;
  async run(argv: string[], spec: RunSpec = {}): Promise<(RunOutcome | Text<RunOutcome>) & { trace: TraceSummary }> {
    const trace = new Trace('run', this.name);
    try {
      const image = this.ctx.store.getPool(this.name)?.image;
      if (image !== undefined) ({ argv, spec } = withImageConfig(this.ctx, image, argv, spec));
      const r = await runInPool(this.ctx, this.runner, argv, spec, trace);
      const summary = trace.finish();
      this.ctx.store.putOperation(summary, { sandbox: r.sandbox, hit: r.hit, recycled: r.recycled, dirt: r.dirt });
      return { ...encoded(r, spec.encoding), trace: summary };
    } catch (e) {
      const summary = trace.finish(e);
      this.ctx.store.putOperation(summary);
      if (e instanceof SnaplabError) (e as SnaplabError & { operationId?: string }).operationId = summary.id;
      throw e;
    }
  }

  /**
   * Take a standby for the caller's own use (a miss raises one): it leaves the pool's rotation,
   * is never recycled, and is the caller's to destroy. The pool refills behind it when started.
   */
  async take(): Promise<Sandbox> {
    const trace = new Trace('take', this.name);
    try {
      const t = await this.runner.take(trace);
      // it leaves the pool: not counted in use, not recycled, not the pool's to remove
      this.ctx.store.updateSandbox(t.record.id, { reason: `taken from pool ${this.name}`, baseline: null, pool: null });
      const summary = trace.finish();
      this.ctx.store.putOperation(summary, { sandbox: t.record.name, hit: t.hit });
      return new Sandbox(
        this.ctx,
        { ...t.record, reason: `taken from pool ${this.name}`, baseline: null, pool: null },
        t.agent,
        summary,
      );
    } catch (e) {
      const summary = trace.finish(e);
      this.ctx.store.putOperation(summary);
      throw e;
    }
  }

  /** Set the target size; shrinking removes paused standbys at once, growing raises them now. */
  async resize(size: number, onProgress?: (ready: number, target: number) => void): Promise<void> {
    if (!Number.isSafeInteger(size) || size < 0)
      throw new SnaplabError('BAD_INPUT', `invalid pool size ${size}`, 'give a whole number ≥ 0');
    this.ctx.store.setPoolTarget(this.name, size);
    await trimPool(this.ctx, this.name, size);
    await this.runner.fill(onProgress);
  }

  /** Destroy the standbys and forget the pool. */
  async remove(): Promise<number> {
    // let go of the runner for good first: a holder's pass (a daemon's holdPools) must neither
    // start it again nor make another while the pool is being removed
    const done = this.onClose();
    try {
      await this.runner.close();
      return await removePool(this.ctx, this.name);
    } finally {
      done();
    }
  }
}
