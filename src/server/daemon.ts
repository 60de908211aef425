/**
 * The daemon's state over one embedded Lab: the event log, the processes it runs, long
 * operations, quotas, lifetimes and the once-a-second tick that keeps them true. Routes
 * (routes-*.ts) call it; it calls the SDK. Nothing here is a second implementation of the
 * lifecycle: a sandbox is made, paused and destroyed by the same Lab calls the CLI makes.
 */
import { Lab, type CreateOptions } from '../sdk/lab.js';
import { checkCreateInputs } from '../sdk/create-options.js';
import type { Sandbox } from '../sdk/sandbox.js';
import { SnaplabError, isSnaplabError } from '../errors.js';
import { defaultName, newId, sandboxKey } from '../lab/names.js';
import { metaOf, updateMeta } from '../lab/meta.js';
import { reconcile } from '../lab/reconcile.js';
import { destroyRecord } from '../lab/teardown.js';
import { connectAgent, spawnIn, type ExecOptions } from '../lab/sandbox-ops.js';
import type { AgentClient } from '../agent/client.js';
import type { SandboxMeta, SandboxRecord } from '../store/records.js';
import { EventLog } from './events.js';
import type { CreateBody } from './schemas.js';
import { QuotaError } from './http-errors.js';
import { LOCAL, type Caller } from './keys.js';
import { sandboxNotFound } from '../lab/removals.js';
import { Metrics } from './metrics.js';
import { Operations } from './operations.js';
import { Process, Processes } from './processes.js';
import { noted, orElse } from '../cleanup.js';

export interface DaemonOptions {
  home?: string;
  /** TTL of a sandbox made through the API when the request gives none (s); 0: none */
  defaultTimeoutS?: number;
  /** deadline of an exec or process when the request gives none (ms); 0: none */
  execTimeoutMs?: number;
  /** output a process keeps for a client that reconnects (bytes) */
  ringBytes?: number;
  /** how often lifetimes, the watcher and the reaper run (ms) */
  tickMs?: number;
  /** a create (or restore) of the daemon's own that takes longer than this is aborted and cleaned (s) */
  createBoundS?: number;
  /** where the dashboard finds `snaplab bench --results` directories (default $SNAPLAB_HOME/bench) */
  benchDir?: string;
  log?: (line: Record<string, unknown>) => void;
}

export const DEFAULTS = {
  defaultTimeoutS: 300,
  execTimeoutMs: 60_000,
  ringBytes: 1 << 20,
  tickMs: 1000,
  createBoundS: 300,
  benchDir: undefined as string | undefined,
};

export interface ProcessSpec {
  argv: string[];
  tag?: string;
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
  timeoutMs?: number;
  tty?: { cols: number; rows: number };
  stdin?: boolean;
  /** POST /processes: no deadline unless one is given (it is meant to outlive requests) */
  background?: boolean;
}

export class Daemon {
  readonly events: EventLog;
  readonly processes: Processes;
  readonly operations = new Operations();
  readonly metrics = new Metrics();
  readonly opts: typeof DEFAULTS;
  private readonly cache = new Map<string, Sandbox>();
  private readonly execs = new Map<string, number>();
  private readonly making = new Map<string, number>();
  /** sandboxes whose TTL is being acted on now */
  private readonly expiring = new Set<string>();
  /** a TTL whose action failed is tried again from then (and told of once) */
  private readonly retryAt = new Map<string, number>();
  private timer: NodeJS.Timeout | undefined;
  private ticking: Promise<void> | undefined;
  private ticks = 0;

  private constructor(
    readonly lab: Lab,
    opts: DaemonOptions,
  ) {
    this.opts = {
      ...DEFAULTS,
      ...Object.fromEntries(Object.entries(opts).filter(([, v]) => v !== undefined)),
    } as typeof DEFAULTS;
    this.events = new EventLog(lab.context.store);
    this.processes = new Processes();
    this.log = opts.log ?? (() => {});
  }

  readonly log: (line: Record<string, unknown>) => void;

  static async open(opts: DaemonOptions = {}): Promise<Daemon> {
    return new Daemon(await Lab.open({ home: opts.home, keepsTime: true }), opts);
  }

  /**
   * Adopt what is there: finish or clean what a dead process left half-made (gc), keep every pool
   * at its target, then tick: the watcher, lifetimes, the reaper.
   */
  async start(): Promise<void> {
    const gc = await this.lab.gc().catch((e: Error) => ({ removed: [`(gc failed: ${e.message})`], notes: [] }));
    if (gc.removed.length) this.log({ msg: 'adopted: removed what was left half-made', removed: gc.removed });
    for (const p of this.lab.context.store.listPools()) this.lab.pool(p.name).start();
    await this.tick();
    this.timer = setInterval(() => void this.tick(), this.opts.tickMs);
    this.timer.unref();
  }

  /** One pass; never two at once. */
  tick(): Promise<void> {
    this.ticking ??= this.tickOnce()
      .catch((e: Error) => this.log({ msg: 'tick failed', error: e.message }))
      .finally(() => (this.ticking = undefined));
    return this.ticking;
  }

  private async tickOnce(): Promise<void> {
    const ctx = this.lab.context;
    const reconcileNow = this.ticks++ % 5 === 0;
    if (reconcileNow)
      await Promise.all(
        ctx.store
          .listSandboxes()
          .map((r) => (r.pool && r.state === 'paused' ? r : reconcile(ctx, r).catch(orElse(r, `reconcile ${r.name}`)))),
      );
    // read after the reconcile: a change made meanwhile is seen as it is now, not as it was
    const recs = ctx.store.listSandboxes();
    this.events.watch(recs);
    const now = Date.now();
    const byId = new Map(recs.map((r) => [r.id, r]));
    for (const id of [...this.cache.keys()]) if (!byId.has(id)) this.evict(id);
    if (reconcileNow) this.closeRevoked();
    for (const r of recs) {
      // a create that a dead process left: the record is dead, its owner's step 'create'; clean it
      if (r.state === 'dead' && r.owner?.op === 'create' && !r.scenario && !r.pool) {
        await destroyRecord(ctx, r).catch(noted(`remove ${r.name}, left by an interrupted create`));
        this.events.record('failed', r, r.reason);
        this.cache.delete(r.id);
      }
    }
    for (const m of ctx.store.listMeta()) {
      const r = byId.get(m.id);
      // the clock runs while the sandbox runs: started again when it was resumed by another process
      if (
        m.expiresAt === null &&
        m.timeoutS &&
        r?.state === 'running' &&
        !this.events.busy.has(m.id) &&
        !this.expiring.has(m.id)
      ) {
        updateMeta(ctx, m.id, { expiresAt: now + m.timeoutS * 1000 });
        continue;
      }
      if (m.expiresAt === null || m.expiresAt > now || this.expiring.has(m.id) || (this.retryAt.get(m.id) ?? 0) > now)
        continue;
      this.expiring.add(m.id);
      void this.expire(m).finally(() => this.expiring.delete(m.id));
    }
  }

  /** A TTL ended: kill (destroy) or pause, as the sandbox was made to. */
  private async expire(m: SandboxMeta): Promise<void> {
    const rec = this.lab.context.store.getSandbox(m.id);
    if (!rec) return;
    // paused by another process: its clock stands still (a resume starts it again)
    if (rec.state === 'paused') return void updateMeta(this.lab.context, m.id, { expiresAt: null });
    const reason = `its timeout of ${m.timeoutS} s ended`;
    if (!this.retryAt.has(m.id)) this.events.record('timeout', rec, reason, { onTimeout: m.onTimeout ?? 'kill' });
    try {
      if (m.onTimeout === 'pause' && rec.state === 'running') {
        updateMeta(this.lab.context, m.id, { expiresAt: null });
        await this.pause(rec.id, reason);
      } else {
        await this.destroy(rec.id, reason);
      }
      this.retryAt.delete(m.id);
    } catch (e) {
      this.retryAt.set(m.id, Date.now() + 30_000);
      // a pause that failed: the clock stays ended, so the next try is a retry, not a new timeout
      if (m.onTimeout === 'pause') updateMeta(this.lab.context, m.id, { expiresAt: m.expiresAt });
      this.log({ msg: 'timeout action failed; trying again in 30 s', sandbox: rec.name, error: (e as Error).message });
    }
  }

  /**
   * The sandbox object for id or name, kept while its record lives (its agent connection with
   * it). A key without admin sees only the sandboxes it made; others are "not found" to it.
   */
  async sandbox(idOrName: string, caller: Caller = LOCAL): Promise<Sandbox> {
    const ctx = this.lab.context;
    const rec = ctx.store.sandboxState(sandboxKey(idOrName));
    if (!rec || !this.visible(caller, rec.id)) throw sandboxNotFound(ctx, idOrName, (id) => this.visible(caller, id));
    const hit = this.cache.get(rec.id);
    if (hit && (rec.state === 'running' || rec.state === 'paused')) {
      // changed by another process (a pause, a resume): the same object, its record brought up to date
      if (hit.state !== rec.state) hit.sync();
      return hit;
    }
    if (hit) this.evict(rec.id);
    const box = await this.lab.get(rec.id);
    if (box.state === 'running' || box.state === 'paused') this.cache.set(box.id, box);
    return box;
  }

  /** Admin keys and the socket see every sandbox; other keys those they made. */
  visible(caller: Caller, id: string): boolean {
    return caller.scopes.has('admin') || metaOf(this.lab.context, id).owner === caller.key;
  }

  private evict(id: string): void {
    const box = this.cache.get(id);
    this.cache.delete(id);
    // its connection may carry other requests' commands: closed once they have ended
    if (box && !this.processes.of(id).some((p) => !p.ended)) box.close();
  }

  /** A sandbox as the API shows it: its toJSON (owner and timeout included). */
  view(box: Sandbox): Record<string, unknown> {
    return box.toJSON();
  }

  async create(caller: Caller, body: CreateBody): Promise<Sandbox> {
    checkCreateInputs(body);
    // root inside being root outside is for the host's administrators to choose, not any key's
    if (body.userns === false && !caller.scopes.has('admin')) {
      throw new SnaplabError(
        'FORBIDDEN',
        `key ${caller.key} may not create a sandbox without a user namespace (root inside would be root on the host)`,
        'this needs a key with the admin scope',
      );
    }
    const life = { owner: caller.key, timeoutS: body.timeoutS ?? this.opts.defaultTimeoutS, onTimeout: body.onTimeout };
    const release = this.claimSandbox(caller);
    // a name of our own is drawn again while it is taken (or being made by another request here)
    let name = body.name ?? defaultName(newId());
    while (body.name === undefined && (this.events.making.has(name) || this.lab.context.store.getSandbox(name)))
      name = defaultName(newId());
    this.events.making.add(name);
    const signal = AbortSignal.timeout(this.opts.createBoundS * 1000);
    let taking = false;
    try {
      let box: Sandbox;
      let how: string;
      if (body.pool !== undefined) {
        this.events.taking++;
        taking = true;
        box = await this.lab.create({ pool: body.pool, labels: body.labels, metadata: body.metadata, ...life });
        how = `a standby of pool ${body.pool}`;
      } else if (body.snapshot !== undefined) {
        box = await this.lab.restore(body.snapshot, {
          name,
          limits: body.limits,
          userns: body.userns,
          labels: body.labels,
          metadata: body.metadata,
          signal,
          ...life,
        });
        how = `restored from snapshot ${body.snapshot}`;
      } else {
        const opts: CreateOptions = {
          image: body.image,
          name,
          storage: body.storage,
          driver: body.driver,
          limits: body.limits,
          userns: body.userns,
          init: body.init,
          labels: body.labels,
          metadata: body.metadata,
          signal,
          ...life,
        };
        box = await this.lab.create(opts);
        how = `from image ${box.image}`;
      }
      this.cache.set(box.id, box);
      if (box.lastTrace) this.metrics.observeTrace(box.lastTrace);
      this.events.record('created', box, how, {
        image: box.image,
        driver: box.driver,
        operation: box.lastTrace?.id ?? null,
      });
      this.events.record('ready', box, null, { ms: box.lastTrace?.totalMs ?? null });
      return box;
    } catch (e) {
      if (signal.aborted && !isSnaplabError(e, 'TIMEOUT')) {
        throw new SnaplabError(
          'TIMEOUT',
          `the create took longer than ${this.opts.createBoundS} s and was stopped (what it made is removed)`,
          'see its trace; a VM under emulation can be slow to boot',
          { cause: e },
        );
      }
      throw e;
    } finally {
      if (taking) this.events.taking--;
      this.events.making.delete(name);
      release();
    }
  }

  /** Run a change of the daemon's own on a sandbox: the watcher leaves it alone meanwhile. */
  private async own<T>(id: string, fn: () => Promise<T>): Promise<T> {
    this.events.busy.add(id);
    try {
      return await fn();
    } finally {
      this.events.busy.delete(id);
    }
  }

  async destroy(idOrName: string, reason = 'destroyed through the API', caller: Caller = LOCAL): Promise<void> {
    const box = await this.sandbox(idOrName, caller);
    await this.own(box.id, async () => {
      this.events.remember(box.id);
      // its commands end with it, held output or not
      for (const p of this.processes.of(box.id))
        if (!p.ended) {
          p.handle?.kill(9);
          p.abandon();
        }
      const t = await box.destroy();
      this.metrics.observeTrace(t);
      this.cache.delete(box.id);
      this.processes.forget(box.id);
      this.events.record('destroyed', box, reason, { operation: t.id });
    });
  }

  async pause(idOrName: string, reason: string | null = null, caller: Caller = LOCAL): Promise<Sandbox> {
    const box = await this.sandbox(idOrName, caller);
    return this.own(box.id, async () => {
      const t = await box.pause(); // its timeout's clock stands still until it is resumed
      this.metrics.observeTrace(t);
      this.events.record('paused', box, reason, { operation: t.id });
      return box;
    });
  }

  async resume(idOrName: string, caller: Caller = LOCAL): Promise<Sandbox> {
    const box = await this.sandbox(idOrName, caller);
    return this.own(box.id, async () => {
      const t = await box.resume(); // and its timeout's clock runs again, from now
      this.metrics.observeTrace(t);
      this.events.record('resumed', box, null, { operation: t.id });
      return box;
    });
  }

  /** A new timeout from now (0: none). */
  async setTimeout(
    idOrName: string,
    timeoutS: number,
    onTimeout?: 'kill' | 'pause',
    caller: Caller = LOCAL,
  ): Promise<Sandbox> {
    const box = await this.sandbox(idOrName, caller);
    await box.setTimeout(timeoutS, onTimeout);
    return box;
  }

  /** A slot for one more sandbox of this key, held until the create ends (the store counts it after). */
  private claimSandbox(caller: Caller): () => void {
    if (caller.maxSandboxes !== null) {
      const have = this.lab.context.store.countOwned(caller.key) + (this.making.get(caller.key) ?? 0);
      if (have >= caller.maxSandboxes)
        throw new QuotaError(
          'maxSandboxes',
          `key ${caller.key} has ${have} of its ${caller.maxSandboxes} sandboxes`,
          5,
        );
    }
    this.making.set(caller.key, (this.making.get(caller.key) ?? 0) + 1);
    return () => this.making.set(caller.key, (this.making.get(caller.key) ?? 1) - 1);
  }

  /** A slot for one more concurrent exec of this key; call the result when the exec ends. */
  claimExec(caller: Caller): () => void {
    const n = this.execs.get(caller.key) ?? 0;
    if (caller.maxExecs !== null && n >= caller.maxExecs)
      throw new QuotaError('maxExecs', `key ${caller.key} runs ${n} of its ${caller.maxExecs} concurrent execs`);
    this.execs.set(caller.key, n + 1);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      this.execs.set(caller.key, (this.execs.get(caller.key) ?? 1) - 1);
    };
  }

  /** Long-lived connections (WebSockets, event streams) by key: closed when their key is removed. */
  private readonly sockets = new Map<string, Set<{ hash: string | null; close(): void }>>();

  track(caller: Caller, conn: { close(): void }): () => void {
    if (caller === LOCAL) return () => {};
    const entry = { hash: caller.hash ?? null, close: () => conn.close() };
    let set = this.sockets.get(caller.key);
    if (!set) this.sockets.set(caller.key, (set = new Set()));
    set.add(entry);
    return () => set!.delete(entry);
  }

  /** Is this caller's key still there (a key removed by `snaplab key rm` in another process)? */
  stillValid(caller: Caller): boolean {
    return (
      caller === LOCAL || caller.viaGateway === true || (caller.hash !== undefined && this.lab.keys.has(caller.hash))
    );
  }

  private closeRevoked(): void {
    for (const [key, set] of this.sockets) {
      for (const e of set) {
        if (e.hash && !this.lab.keys.has(e.hash)) {
          set.delete(e);
          e.close();
        }
      }
      if (!set.size) this.sockets.delete(key);
    }
  }

  execsRunning(): number {
    return [...this.execs.values()].reduce((a, b) => a + b, 0);
  }

  /** The deadline of an exec: the request's, else the daemon's default; 0 means none. */
  deadline(timeoutMs: number | undefined): number | undefined {
    const ms = timeoutMs ?? this.opts.execTimeoutMs;
    return ms > 0 ? ms : undefined;
  }

  /**
   * Start a command whose output a client may read now or later (a streamed exec, a background
   * process): its deadline kills its process group whoever is attached.
   */
  async startProcess(caller: Caller, box: Sandbox, spec: ProcessSpec): Promise<Process> {
    const release = this.claimExec(caller);
    const p = new Process(box.id, spec.argv, spec.tag ?? null, spec.tty !== undefined, this.opts.ringBytes);
    const opts: ExecOptions = {
      env: spec.env,
      cwd: spec.cwd,
      user: spec.user,
      timeoutMs: spec.background ? spec.timeoutMs || undefined : this.deadline(spec.timeoutMs),
      tty: spec.tty,
      onStdout: (b) => p.output('stdout', b),
      onStderr: (b) => p.output('stderr', b),
      ...(spec.stdin ? { stdin: true as const } : {}),
    };
    // a connection of its own: a slow reader pauses this command's output there, and no one else's
    let agent: AgentClient | undefined;
    try {
      const rec = box.info as SandboxRecord;
      agent = await connectAgent(this.lab.context, rec);
      const a = agent;
      p.agent = a;
      p.attach(await spawnIn(this.lab.context, rec, a, spec.argv, opts), (on) => a.pauseOutput(on));
    } catch (e) {
      release();
      void agent?.close();
      throw e;
    }
    this.processes.add(p);
    const started = Date.now();
    p.once('exit', () => {
      release();
      void agent?.close();
      this.metrics.exec.observe('kind="stream"', Date.now() - started);
      this.events.record('process.exited', box, p.error ? p.error.message : null, {
        process: p.id,
        tag: p.tag,
        exitCode: p.result?.exitCode ?? null,
        timedOut: p.result?.timedOut ?? false,
      });
    });
    return p;
  }

  close(): void {
    if (this.timer) clearInterval(this.timer);
    this.processes.close();
    for (const b of this.cache.values()) b.close();
    this.lab.close();
  }
}
