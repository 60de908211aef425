import { resetEgress } from '../net/egress.js';
import { handleOf } from '../lifecycle/handle.js';
import type { AgentClient } from '../../agent/client.js';
import { withLock } from '../../host/lock.js';
import { cgroupFor, isFrozen } from '../../host/cgroups/cgroups.js';
import { pidThere } from '../../host/procs.js';
import type { Volume } from '../../storage/backend.js';
import type { PoolRecord, SandboxRecord, SnapshotRecord } from '../../store/records.js';
import { execIn, snapshotSandbox } from '../io/sandbox-ops.js';
import { startInterpreter } from '../../interpreter/start.js';
import { Trace } from '../../timing/trace.js';
import { captureBaseline, dirtReasons } from '../lifecycle/clean.js';
import type { LabContext } from '../context.js';
import { imageVolume } from '../images/volume.js';
import { resolveImage } from '../images/templates.js';
import { initFor } from '../lifecycle/init.js';
import { getPool, poolLock, reapLeaks, takenBy, templateName, warmedAs } from './admin.js';
import { me } from '../lifecycle/owner.js';
import { raiseSandbox } from '../lifecycle/raise.js';
import { destroyRecord } from '../lifecycle/teardown.js';
import { RAISING } from './raising.js';
import { failureMeans, noted, tellUnkept } from '../../cleanup.js';
import { warmShell } from './warm-shell.js';

/** A warm-up that takes longer is killed, and its standby dropped (a kernel starts in seconds). */
const WARM_TIMEOUT_MS = 120_000;

export interface Taken {
  record: SandboxRecord;
  agent: AgentClient;
  /** a paused standby was there (true), or one was raised on the spot (false) */
  hit: boolean;
}

/**
 * Holds a pool in this process: takes standbys (atomically across processes, through the
 * store), returns them after a clean check or destroys them, and, once started, keeps the pool
 * at its target size in the background. Standbys are ordinary sandboxes in state `paused` (not
 * for direct use): namespace standbys just wait (their agent blocked in epoll, the clean check or
 * a fresh raise having shown nothing else runs), VM standbys are stopped. An idle pool costs no
 * CPU and outlives this process; refilling needs a holder.
 */
export class PoolRunner {
  /** agent connections this process holds, kept across uses of a standby */
  private readonly agents = new Map<string, AgentClient>();
  private raising = 0;
  /** clean sandboxes being made standbys again after their run's answer (release) */
  private recycling = 0;
  /** takes waiting for one of those (nextPutBack) */
  private readonly waiting: (() => void)[] = [];
  private serving = 0;
  private running = false;
  /** closed for good (its pool removed): start() does nothing */
  private closed = false;
  /** refills that failed in a row, and when the next may start (backing off: 1 s, 2 s, … 60 s) */
  private failures = 0;
  private retryAt = 0;
  private timer: NodeJS.Timeout | undefined;
  private readonly inflight = new Set<Promise<unknown>>();
  /** errors of background refills, newest last (at most 20) */
  readonly refillErrors: string[] = [];

  constructor(
    private readonly ctx: LabContext,
    readonly name: string,
  ) {}

  /** A usable sandbox from the pool: a thawed standby whose agent answered, or a new one on a miss. */
  async take(trace: Trace): Promise<Taken> {
    const pool = getPool(this.ctx, this.name);
    this.serving++;
    try {
      for (;;) {
        // only a standby warmed as this build warms them: after an upgrade, one that runs the old
        // build's server is not handed out (a holder's start and a fill remove them: dropStale)
        const rec = await trace.phase('claim', () =>
          this.ctx.store.claimStandby(this.name, takenBy(), me('hold'), warmedAs(pool)),
        );
        if (!rec) {
          // one being put back is a standby in a few ms, where a raise costs far more
          if (this.recycling > 0) {
            await trace.phase('wait for a standby', () => this.nextPutBack());
            continue;
          }
          break;
        }
        const driver = this.ctx.driver(rec.driver);
        // only a standby known dead is dropped; one that cannot be told is tried (its agent answers or not)
        if ((await driver.inspect(handleOf(rec))).state === 'dead') {
          // a reaper may have found it dead meanwhile: whoever claims its removal counts it
          if (this.ctx.store.claimRemoval(rec, me('remove'))) {
            await destroyRecord(this.ctx, rec).catch(noted(`remove ${rec.name}`));
            this.ctx.store.countPool(this.name, 'leaks');
          }
          continue;
        }
        let agent: AgentClient;
        try {
          // (a namespace standby frozen by an earlier snaplab, which froze them all, is thawed too)
          if (driver.capabilities.pauseStandbys || (await isFrozen(cgroupFor(rec.id)).catch(failureMeans(false))))
            await trace.phase('thaw', () => driver.resume(handleOf(rec)));
          rec.state = 'running';
          agent = this.agents.get(rec.id) ?? (await trace.phase('connect', () => driver.connect(handleOf(rec))));
          this.agents.set(rec.id, agent);
          // a VM's clock stood still while it waited (a namespace sandbox shares the host's)
          if (driver.capabilities.clockStopsWhilePaused)
            await trace.phase('clock set', () => agent.setClock(BigInt(Date.now()) * 1_000_000n));
          else await trace.phase('agent ready', () => agent.ping());
        } catch {
          // a standby that cannot be woken is of no use to anyone: drop it, take another
          if (this.ctx.store.claimRemoval(rec, me('remove'))) {
            await this.drop(rec).catch(noted(`drop standby ${rec.name}`));
            this.ctx.store.countPool(this.name, 'leaks');
          }
          continue;
        }
        this.ctx.store.countPool(this.name, 'hits');
        this.kick();
        return { record: rec, agent, hit: true };
      }
      this.ctx.store.countPool(this.name, 'misses');
      const made = await this.raise(trace, pool.target > 0);
      this.kick();
      return { ...made, hit: false };
    } finally {
      this.serving--;
    }
  }

  /**
   * Give a taken sandbox back. It is paused and returned to the pool only when the pool wants
   * it and it passes the clean check; otherwise it is destroyed (and counted when it was dirty).
   */
  async release(t: Taken, trace: Trace): Promise<{ recycled: boolean; reasons: string[] }> {
    const pool = this.ctx.store.getPool(this.name);
    const rec = t.record;
    let reasons: string[] = [];
    if (pool?.recycle && rec.baseline) {
      reasons = await trace.phase('clean check', () => dirtReasons(this.ctx, rec, t.agent));
      // a clean one always goes back (refill raises only what is missing); a pool is trimmed
      // back to its target by resize
      if (reasons.length === 0) {
        if (!this.running || !rec.egress) {
          await this.putBack(rec, trace);
          return { recycled: true, reasons };
        }
        // a pool this process keeps (a daemon's): the firewall's reset (~25-40 ms of nft) is done
        // after the answer. The sandbox stays held by this process until it is a standby again, so
        // no one takes it meanwhile, and a crash leaves it to the reapers (orphaned: destroyed).
        this.recycling++;
        const back = this.putBack(rec)
          .catch(async (e: unknown) => {
            noted(`put ${rec.name} back in pool ${this.name}`)(e);
            await this.drop(rec).catch(noted(`drop ${rec.name}`));
            this.ctx.store.countPool(this.name, 'leaks');
          })
          .finally(() => {
            this.recycling--;
            this.inflight.delete(back);
            for (const wake of this.waiting.splice(0)) wake();
            this.kick();
          });
        this.inflight.add(back);
        return { recycled: true, reasons };
      }
      if (reasons.length) this.ctx.store.countPool(this.name, 'refused_dirty');
    }
    await trace.phase('destroy', () => this.drop(rec));
    this.kick();
    return { recycled: false, reasons };
  }

  /**
   * A clean sandbox made a standby again: its next user gets the pool's egress lists and counters
   * from zero, whatever this one set; frozen where the driver freezes standbys. A pool removed
   * meanwhile gets nothing back: the sandbox is destroyed.
   */
  private async putBack(rec: SandboxRecord, trace?: Trace): Promise<void> {
    const phase = <T>(name: string, fn: () => Promise<T>): Promise<T> => (trace ? trace.phase(name, fn) : fn());
    const pool = this.ctx.store.getPool(this.name);
    if (!pool) return this.drop(rec);
    if (rec.egress && pool.egress) await phase('egress reset', () => resetEgress(this.ctx, rec, pool.egress!));
    const driver = this.ctx.driver(rec.driver);
    if (driver.capabilities.pauseStandbys) await phase('freeze', () => driver.pause(handleOf(rec)));
    this.ctx.store.updateSandbox(rec.id, { state: 'paused', reason: null, owner: null });
    this.ctx.store.countPool(this.name, 'recycled');
  }

  /** Until a sandbox being put back is done (a standby again, or dropped). */
  private nextPutBack(): Promise<void> {
    return new Promise((wake) => this.waiting.push(wake));
  }

  /** Raise standbys until `target` are ready (foreground: `pool create`, `pool resize`). */
  async fill(onProgress?: (ready: number, target: number) => void): Promise<void> {
    const pool = getPool(this.ctx, this.name);
    await this.dropStale();
    const parallel = 2;
    let ready = this.counts(pool).paused;
    onProgress?.(ready, pool.target);
    while (ready < pool.target) {
      // what another holder is raising for it counts (a daemon refilling it beside this fill)
      const batch = Math.min(parallel, pool.target - ready - this.raisingElsewhere());
      if (batch <= 0) {
        await new Promise((r) => setTimeout(r, 200));
        ready = this.counts(pool).paused;
        continue;
      }
      // every raise of the batch settled before a failure is thrown: none goes on behind the caller's cleanup
      const settled = await Promise.allSettled(Array.from({ length: batch }, () => this.addStandby()));
      const failed = settled.find((r) => r.status === 'rejected');
      if (failed) throw failed.reason;
      ready = this.counts(pool).paused;
      onProgress?.(ready, pool.target);
    }
  }

  /** Keep the pool at its target in the background until stop(). */
  start(): void {
    if (this.running || this.closed) return;
    this.running = true;
    let reaping = false; // one pass at a time: a pass over many members outlasts the second
    this.timer = setInterval(() => {
      if (!reaping) {
        reaping = true;
        void reapLeaks(this.ctx, this.name)
          .catch(noted(`reap leaked members of pool ${this.name}`))
          .finally(() => (reaping = false));
      }
      this.kick();
    }, 1000);
    this.timer.unref();
    // standbys another build warmed go at a holder's start (its refill raises their successors)
    const p = this.dropStale()
      .catch(noted(`remove the standbys another build warmed in pool ${this.name}`))
      .finally(() => {
        this.inflight.delete(p);
        this.kick();
      });
    this.inflight.add(p);
  }

  /**
   * Remove the standbys another build warmed (after an upgrade they run the old build's server,
   * its kernel up since before): takes pass them by, and they count for nothing. Each is claimed
   * for removal first, so that two removers remove it once. A holder's start and a fill do it, not
   * every pass: two builds holding one pool at once would otherwise remove each other's for ever.
   */
  private async dropStale(): Promise<void> {
    const pool = this.ctx.store.getPool(this.name);
    if (!pool) return;
    for (const rec of this.ctx.store.poolStale(this.name, warmedAs(pool)))
      if (this.ctx.store.claimRemoval(rec, me('remove')))
        // one that cannot be removed now is gc's (claimed, it is no standby): the others still go
        await this.drop(rec).catch(noted(`remove standby ${rec.name}, warmed by another build`));
  }

  /** Stop for good (the pool is being removed): as stop(), and start() does nothing after. */
  close(): Promise<void> {
    this.closed = true;
    return this.stop();
  }

  /** Stop refilling; wait for raises in flight; close connections. Standbys stay (paused). */
  async stop(): Promise<void> {
    this.running = false;
    clearInterval(this.timer);
    await Promise.allSettled([...this.inflight]);
    for (const a of this.agents.values()) void a.close();
    this.agents.clear();
  }

  /** Its members by state; `paused`: the standbys a take of this build can have (warmed as it warms them). */
  private counts(pool: PoolRecord): { paused: number; creating: number; running: number } {
    const c = this.ctx.store.poolCounts(this.name);
    const paused = pool.warm ? this.ctx.store.poolReady(this.name, warmedAs(pool)) : (c.paused ?? 0);
    return { paused, creating: c.creating ?? 0, running: c.running ?? 0 };
  }

  /** Start background raises up to the deficit; fewer while executions are being served. */
  private kick(): void {
    if (!this.running) return;
    const pool = this.ctx.store.getPool(this.name);
    if (!pool) return;
    // a refill that keeps failing (an image without what --warm needs) is not retried at once
    if (Date.now() < this.retryAt) return;
    const c = this.counts(pool);
    // another holder's raises count too (an embedded `pool create` filling beside a daemon)
    const deficit = pool.target - c.paused - this.raising - this.raisingElsewhere() - this.recycling;
    // Refill never starves executions: one raise at a time while takes are in flight.
    const limit = this.serving > 0 ? 1 : 2;
    for (let i = 0; i < Math.min(deficit, limit - this.raising); i++) {
      const p = this.addStandby()
        .then(() => {
          this.failures = 0;
        })
        .catch((e: Error) => {
          this.refillErrors.push(e.message);
          if (this.refillErrors.length > 20) this.refillErrors.shift();
          this.failures++;
          this.retryAt = Date.now() + Math.min(60_000, 1000 * 2 ** (this.failures - 1));
        })
        .finally(() => {
          this.inflight.delete(p);
          this.kick();
        });
      this.inflight.add(p);
    }
  }

  /** Standbys another live process is raising for this pool now (its creates, and its warm-ups). */
  private raisingElsewhere(): number {
    // one query of the few rows in question: this runs on every take (kick), not a read of every
    // member; a holder that is gone is left out (its members are the reapers')
    return this.ctx.store.poolRaisingHolders(this.name, process.pid, RAISING).filter(pidThere).length;
  }

  private async addStandby(): Promise<void> {
    // a refill's trace is not stored: what its steps record goes to stderr when it ends
    const trace = new Trace('pool refill', this.name);
    try {
      await this.addStandbyIn(trace);
    } finally {
      tellUnkept(trace);
    }
  }

  private async addStandbyIn(trace: Trace): Promise<void> {
    const { record } = await this.raise(trace, true, true);
    const driver = this.ctx.driver(record.driver);
    try {
      // a warm standby has more than its agent running (a kernel, its heartbeats): frozen, it
      // costs no CPU while it waits either (a take thaws it, as one frozen by an older snaplab)
      const pool = this.ctx.store.getPool(this.name);
      if (driver.capabilities.pauseStandbys || pool?.warm) await driver.pause(handleOf(record));
      // what it runs, written before it can be taken (a take claims only what its build warms)
      if (pool?.warm) this.ctx.store.setWarmVersion(record.id, warmedAs(pool)!);
      this.ctx.store.updateSandbox(record.id, { state: 'paused', reason: null, owner: null });
    } catch (e) {
      await this.drop(record).catch(noted(`drop standby ${record.name}`)); // a standby that cannot be stopped is not kept running
      throw e;
    }
    // the pool was removed while this standby was being raised: it must not outlive it
    if (!this.ctx.store.getPool(this.name)) await this.drop(record);
  }

  /**
   * Raise a pool member with its clean baseline; a `standby` is warmed as the pool asks (a take's
   * miss is not: its taker may never run code, and the fronts start the interpreter on first use).
   */
  private async raise(trace: Trace, recordBaseline: boolean, standby = false): Promise<Omit<Taken, 'hit'>> {
    const pool = getPool(this.ctx, this.name);
    this.raising++;
    try {
      // VM standbys are restores of the pool's template, a memory snapshot of one booted VM
      const template = this.ctx.driver(pool.driver).capabilities.memorySnapshot
        ? await this.template(trace)
        : undefined;
      const base = template
        ? async (): Promise<Volume> => template.volume
        : (): Promise<Volume> => imageVolume(this.ctx, pool.image, pool.storage, trace);
      // a standby boots as a create of its image would: the image's own systemd where it has one
      const init = template ? undefined : await this.imageInit(pool);
      // held by this process until it is paused or handed out (recorded in the same write that
      // makes it running): if this process dies in between, reapLeaks finds a member whose holder is gone
      const { record, agent } = await raiseSandbox(
        this.ctx,
        {
          image: pool.image,
          storage: pool.storage,
          driver: pool.driver,
          limits: template?.limits ?? pool.limits,
          base,
          origin: template?.name ?? null,
          pool: this.name,
          heldBy: { reason: standby ? `${RAISING} (pid ${process.pid})` : takenBy() },
          memory: template?.memory ?? undefined,
          userns: pool.userns ?? undefined,
          ...(pool.egress ? { egress: pool.egress } : {}),
          ...(init ? { init } : {}),
        },
        trace,
      );
      // a namespace standby's clone has no page cache of its own yet (warm-shell.ts); a VM
      // standby restores its template's memory, page cache with it
      if (standby && !template) {
        try {
          await trace.phase('warm shells', () => warmShell(this.ctx, record, agent));
        } catch (e) {
          await this.drop(record, agent).catch(noted(`drop standby ${record.name}`));
          throw e;
        }
      }
      if (standby && pool.warm === 'interpreter') {
        try {
          await trace.phase('warm interpreter', () =>
            startInterpreter(
              record.name,
              (argv, stdin) => execIn(this.ctx, record, agent, argv, { stdin, timeoutMs: WARM_TIMEOUT_MS }),
              { kernel: true },
            ),
          );
        } catch (e) {
          await this.drop(record, agent).catch(noted(`drop standby ${record.name}`));
          throw e;
        }
      }
      if (recordBaseline && pool.recycle) {
        try {
          record.baseline = await trace.phase('clean baseline', () => captureBaseline(this.ctx, record, agent));
          this.ctx.store.updateSandbox(record.id, { baseline: record.baseline });
        } catch (e) {
          await this.drop(record, agent);
          throw e;
        }
      }
      this.agents.set(record.id, agent);
      return { record, agent };
    } finally {
      this.raising--;
    }
  }

  /**
   * The memory snapshot VM standbys are restored from: made on first need by booting a VM of the
   * pool's image and snapshotting it whole (under a lock: one boot, whoever asks). The VM it was
   * taken from is destroyed; the snapshot goes with the pool.
   */
  private async template(trace: Trace): Promise<SnapshotRecord> {
    const name = templateName(getPool(this.ctx, this.name));
    const hit = this.ctx.store.getSnapshot(name);
    if (hit) return hit;
    return withLock(
      poolLock(this.ctx, this.name),
      async () => {
        const again = this.ctx.store.getSnapshot(name);
        if (again) return again;
        const pool = getPool(this.ctx, this.name); // removed meanwhile? say so
        // a VM left by a holder that crashed while making the template
        const reason = `template of pool ${this.name} (held by pid ${process.pid})`;
        for (const s of this.ctx.store.listSandboxes())
          if (s.templateOf === this.name && (s.state === 'running' || s.state === 'paused'))
            await destroyRecord(this.ctx, s);
        const base = (): Promise<Volume> => imageVolume(this.ctx, pool.image, pool.storage, trace);
        const init = await this.imageInit(pool);
        const vm = await trace.phase('boot template', () =>
          raiseSandbox(
            this.ctx,
            {
              image: pool.image,
              storage: pool.storage,
              driver: pool.driver,
              limits: pool.limits,
              base,
              origin: null,
              heldBy: { reason, templateOf: this.name },
              // its standbys continue it with the pool's egress: it has the NIC and resolver they need
              ...(pool.egress ? { egress: pool.egress } : {}),
              ...(init ? { init } : {}),
            },
            trace,
          ),
        );
        try {
          const snap = await trace.phase('snapshot template', () =>
            snapshotSandbox(this.ctx, vm.record, name, trace, {
              memory: true,
              agent: async () => vm.agent,
              internal: true,
            }),
          );
          this.ctx.store.setPoolTemplate(this.name, snap.name);
          return snap;
        } finally {
          // not awaited: close() never rejects (it ends the socket, and destroys it after 1 s)
          void vm.agent.close();
          await destroyRecord(this.ctx, vm.record);
        }
      },
      300_000,
    );
  }

  /** The init the pool's machines boot: the image's own systemd where it has one (lab/lifecycle/init.ts). */
  private async imageInit(pool: {
    image: string;
    driver: string;
    userns: boolean | null;
  }): Promise<'systemd' | undefined> {
    const img = await resolveImage(this.ctx, pool.image);
    return initFor({ driver: pool.driver, userns: pool.userns }, img.provenance?.init);
  }

  private async drop(rec: SandboxRecord, agent?: AgentClient): Promise<void> {
    const a = agent ?? this.agents.get(rec.id);
    this.agents.delete(rec.id);
    void a?.close();
    await destroyRecord(this.ctx, rec);
  }
}
