/**
 * The daemon's state over one embedded Lab: the event log, the processes it runs, long
 * operations, quotas, lifetimes and the once-a-second tick that keeps them true. Routes
 * (routes-*.ts) call it; it calls the SDK. Nothing here is a second implementation of the
 * lifecycle: a sandbox is made, paused and destroyed by the same Lab calls the CLI makes.
 */
import { Lab } from '../sdk/lab.js';
import { resolveCreate } from '../sdk/create-options.js';
import { DAEMON_DEFAULTS } from '../defaults.js';
import type { CheckResult, LabCreateOptions, OnTimeout, SandboxApi, SnapshotApi, SpawnOptions } from '../sdk/api.js';
import type { ExecOptions, ExecResult } from '../lab/io/sandbox-ops.js';
import { KeyedLab } from './keyed-lab.js';
import type { StreamLimiter } from './limits.js';
import { SnaplabError, isSnaplabError } from '../errors.js';
import { noted, orElse } from '../cleanup.js';
import { defaultName, newId } from '../names.js';
import type { TraceSummary } from '../timing/trace.js';
import type { WatchMark } from '../store/store.js';
import type { SandboxState } from '../store/records.js';
import { EventLog } from './events.js';
import type { CreateBody } from './schemas.js';
import { QuotaError } from './http-errors.js';
import { LOCAL, describeCaller, type Caller } from './keys.js';
import { Metrics } from './metrics.js';
import { CeilingGuard } from './ceilings.js';
import { Operations } from './operations.js';
import { Process, Processes } from './processes.js';
import { KeptProcesses, lost, spawnKept } from './kept.js';
import type {
  AdminApi,
  EventQuery,
  EventRecord,
  KeyAdmin,
  OperationsApi,
  PoolRunBody,
  RouteHost,
  ScenariosApi,
  Served,
  ServedLab,
} from './served-lab.js';
import { labAdmin, labScenarios, labUsage, noPlacement } from './lab-admin.js';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { asGone, snapshotFor } from './snapshot-access.js';
import { poolRunView } from './exec-view.js';
import type { RunOutcome } from '../lab/pools/run.js';

export interface DaemonOptions {
  home?: string;
  /** each as in DAEMON_DEFAULTS (src/defaults.ts), which holds its default */
  defaultTimeoutS?: number;
  execTimeoutMs?: number;
  ringBytes?: number;
  tickMs?: number;
  createBoundS?: number;
  benchDir?: string;
  log?: (line: Record<string, unknown>) => void;
}

export const DEFAULTS = DAEMON_DEFAULTS;

/**
 * Of the tick's check passes, every this many is a full one (each machine's process read: a pid
 * taken by another process is seen within a minute); the others only find that it is there.
 */
export const FULL_CHECK_EVERY = 12;

/** What changes what runs in a sandbox (POST /sandboxes/{id}/{verb}). */
export type StateVerb = 'pause' | 'resume' | 'stop' | 'start';

export interface ProcessSpec {
  argv: string[];
  tag?: string;
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
  timeoutMs?: number;
  tty?: { cols: number; rows: number };
  stdin?: boolean;
  /** its end waits for the end of its output (SpawnOptions' `waitOutput`) */
  waitOutput?: boolean;
  /** POST /processes: no deadline unless one is given (it is meant to outlive requests) */
  background?: boolean;
  /**
   * on a connection of its own to the machine (default), so that a client that reads slowly holds
   * this command's output alone; false: on the sandbox's shared one, for a caller that never holds
   * it (an in-process front's commands: no connection to open first)
   */
  detached?: boolean;
  /**
   * kept by the machine's agent past its connection, so that it outlives this daemon (kept.ts);
   * where the agent cannot keep it (an older one's) it runs as without, and its info says so.
   * `true`: asked for, so a tag too long to keep is refused; 'if-able' (a background process's
   * default): such a one runs unkept
   */
  keep?: boolean | 'if-able';
}

export class Daemon implements RouteHost {
  readonly events: EventLog;
  /** gauges of the fronts beside the daemon, read when scraped (serve.ts sets them) */
  readonly gauges: { e2bSessions?: () => number } = {};
  readonly processes: Processes;
  /** the processes a previous daemon left running in the machines (kept.ts) */
  readonly kept: KeptProcesses;
  readonly operations = new Operations();
  readonly metrics = new Metrics();
  readonly ceilings: CeilingGuard;
  private readonly admin: AdminApi;
  private readonly scenarios: ScenariosApi;
  readonly opts: typeof DEFAULTS;
  private readonly cache = new Map<string, SandboxApi>();
  private readonly execs = new Map<string, number>();
  private readonly making = new Map<string, number>();
  /** sandboxes whose TTL is being acted on now */
  private readonly expiring = new Set<string>();
  /** a TTL whose action failed is tried again from then (and told of once) */
  private readonly retryAt = new Map<string, number>();
  private timer: NodeJS.Timeout | undefined;
  private ticking: Promise<void> | undefined;
  private ticks = 0;
  private checks = 0;
  /** gc checked every record against the host just now (start): the first check need not again */
  private reconciled = false;
  /** where the tick got to in the lab's changes (undefined: it reads every record first) */
  private watched: WatchMark | undefined;
  /** passes that read the lab's changes so far: a cache entry made across one is looked at again */
  private changesRead = 0;

  /**
   * `lab`: what is served, through its interface only (served-lab.ts): the embedded Lab here, any
   * other implementation of ServedLab (a cluster gateway's) the same way.
   */
  constructor(
    readonly lab: ServedLab,
    opts: DaemonOptions,
  ) {
    this.opts = {
      ...DEFAULTS,
      ...Object.fromEntries(Object.entries(opts).filter(([, v]) => v !== undefined)),
    } as typeof DEFAULTS;
    this.events = new EventLog(lab.journal);
    this.processes = new Processes();
    this.kept = new KeptProcesses(this, this.opts.ringBytes);
    this.ceilings = new CeilingGuard(lab);
    this.admin = labAdmin(lab, this.operations);
    this.scenarios = labScenarios(lab, this.operations);
    this.log = opts.log ?? (() => {});
  }

  readonly log: (line: Record<string, unknown>) => void;

  static async open(opts: DaemonOptions = {}): Promise<Daemon> {
    return new Daemon(await Lab.open({ home: opts.home, keepsTime: true }), opts);
  }

  /**
   * Adopt what is there: finish or clean what a dead process left half-made (gc), keep every pool
   * at its target (and, on the tick, those defined since), then tick: the watcher, lifetimes, the reaper.
   */
  async start(): Promise<void> {
    let gc: { removed: string[] };
    try {
      gc = await this.lab.gc();
      this.reconciled = true;
    } catch (e) {
      gc = { removed: [`(gc failed: ${(e as Error).message})`] };
    }
    if (gc.removed.length) this.log({ msg: 'adopted: removed what was left half-made', removed: gc.removed });
    // the log reads on from where it got to before this start: what changed meanwhile, gc's findings
    // included, not every record again
    this.watched = this.events.watchedTo();
    this.lab.holdPools();
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

  /**
   * What changed since the last pass is read, not every record (Lab.changes; every record only
   * when the log has no place in the changes yet, or one too old): a pass beside 10 000 idle
   * sandboxes reads none of them. The watcher tells what changed, the cache lets go of what was
   * removed, a clock stopped behind the daemon's back starts again, and the timeouts that ended are
   * read by their end (Lab.expired).
   */
  private async tickOnce(): Promise<void> {
    // a check every 5 ticks; a full one (each machine's process read, not only found) every 12th
    if (this.ticks++ % 5 === 0) {
      const full = this.checks++ % FULL_CHECK_EVERY === 0;
      await this.checkPass(!full);
      // a pool defined since by another process (an embedded `snaplab pool create`) is kept full too
      this.lab.holdPools();
      // as often as a full check: what the host's connection table keeps of flows egress ended
      // (beside the tick, not in it: it reads the host's whole table; one at a time)
      if (full) this.sweepEgress();
    }
    // read after the check: a change made meanwhile is seen as it is now, not as it was
    const changes = await this.lab.changes(this.watched?.mark, this.watched?.again);
    this.changesRead++;
    this.watched = this.events.watch(changes);
    if (changes.complete) {
      const ids = new Set(changes.sandboxes.map((b) => b.id));
      for (const id of [...this.cache.keys()]) if (!ids.has(id)) this.evict(id);
    }
    for (const id of changes.removed) this.evict(id);
    // a clock that could not be started is read again next pass (its change is not lost with the mark)
    const failed: string[] = [];
    for (const box of changes.sandboxes)
      await this.startClock(box).catch((e: unknown) => {
        failed.push(box.id);
        this.log({ msg: 'starting a timeout clock failed', id: box.id, error: (e as Error).message });
      });
    if (failed.length) this.watched = this.events.retry(failed);
    const now = Date.now();
    for (const box of await this.lab.expired(now)) this.keepTime(box, now);
  }

  /** The egress sweep under way, if one is: the tick starts no second beside it. */
  private sweeping: Promise<void> | undefined;

  /** Sweep egress's ended flows out of the host's table (Lab.sweepEgress), in the background. */
  private sweepEgress(): void {
    this.sweeping ??= this.lab
      .sweepEgress()
      .then(
        (n) => void (n && this.log({ msg: 'egress flows the router had ended, removed from the uplink', count: n })),
        (e: Error) => this.log({ msg: 'sweeping egress flows failed', error: e.message }),
      )
      .finally(() => (this.sweeping = undefined));
  }

  /** The egress sweep under way, waited for (a test sees its end). */
  async swept(): Promise<void> {
    await this.sweeping;
  }

  /**
   * A check pass: every sandbox's record against the host (reconciled), and what a create that a
   * dead process left removed, each told of as failed. On the tick (quick but every twelfth: a
   * machine whose process is there is not read further, lab/lifecycle/check.ts), and at POST /check.
   */
  async check(): Promise<CheckResult['removed']> {
    return this.checkPass(false);
  }

  private async checkPass(quick: boolean): Promise<CheckResult['removed']> {
    // adoption probes each machine once (gc's pass), not twice: the first check only removes
    const { removed } = await this.lab.check({ reconciled: this.reconciled, quick });
    this.reconciled = false;
    for (const r of removed) {
      this.events.record('failed', r, r.reason);
      this.cache.delete(r.id);
    }
    this.closeRevoked();
    return removed;
  }

  /**
   * A timeout's clock runs while its sandbox runs: started again when another process resumed it
   * without (read among the changes). One the daemon is changing now is its own change's to set
   * (a resume here starts the clock, a pause stops it).
   */
  private async startClock(box: SandboxApi): Promise<void> {
    if (!box.timeoutS || box.expiresAt !== null || box.state !== 'running') return;
    if (this.expiring.has(box.id) || this.events.busy.has(box.id)) return;
    await box.setTimeout(box.timeoutS, box.onTimeout);
  }

  /** A timeout that ended (Lab.expired): acted on, unless it is already, or failed and waits to try again. */
  private keepTime(box: SandboxApi, now: number): void {
    const id = box.id;
    if (!box.timeoutS || this.expiring.has(id) || (this.retryAt.get(id) ?? 0) > now) return;
    this.expiring.add(id);
    void this.expire(id).finally(() => this.expiring.delete(id));
  }

  /** A TTL ended: kill (destroy), pause or stop, as the sandbox was made to. */
  private async expire(id: string): Promise<void> {
    const box = await this.lookup(id);
    if (!box) return;
    // paused or stopped by another process: its clock stands still (a resume or a start starts it again)
    if (box.state === 'paused' || box.stopped) return void (await box.setTimeout(box.timeoutS, box.onTimeout));
    const reason = `its timeout of ${box.timeoutS} s ended`;
    if (!this.retryAt.has(id)) this.events.record('timeout', box, reason, { onTimeout: box.onTimeout });
    try {
      // a pause or stop that fails leaves the clock ended, so the next try is a retry, not a new timeout
      if (box.onTimeout === 'pause' && box.state === 'running') await this.pause(id, reason);
      else if (box.onTimeout === 'stop' && box.state === 'running') await this.stopSandbox(id, reason);
      // dead by itself (its init gone): a stop keeps files, so they are kept; its clock is ended
      else if (box.onTimeout === 'stop' && box.state === 'dead') await box.setTimeout(0, 'stop');
      else await this.destroy(id, reason);
      this.retryAt.delete(id);
    } catch (e) {
      this.retryAt.set(id, Date.now() + 30_000);
      this.log({ msg: 'timeout action failed; trying again in 30 s', sandbox: box.name, error: (e as Error).message });
    }
  }

  /**
   * A sandbox the caller may see, as its record stands (no check of the host): for a request's
   * first look, before anything is done to it. Not there or not the caller's: SANDBOX_NOT_FOUND.
   */
  async find(idOrName: string, caller: Caller = LOCAL): Promise<SandboxApi> {
    const box = await this.lookup(idOrName);
    // one answer for "not there" and "not yours": a key learns nothing of others' sandboxes
    if (!box || !this.visible(caller, box))
      throw new SnaplabError(
        'SANDBOX_NOT_FOUND',
        `no sandbox with id or name ${JSON.stringify(idOrName)}`,
        'list them with GET /sandboxes',
      );
    return box;
  }

  /**
   * The sandbox object for id or name, kept while its record lives (its agent connection with
   * it). A key without admin sees only the sandboxes it made; others are "not found" to it.
   */
  async sandbox(idOrName: string, caller: Caller = LOCAL): Promise<SandboxApi> {
    const rec = await this.find(idOrName, caller);
    const hit = this.cache.get(rec.id);
    if (hit && (rec.state === 'running' || rec.state === 'paused')) {
      // changed by another process (a pause, a resume): the same object, its record brought up to date
      if (hit.state !== rec.state) await hit.refresh();
      return hit;
    }
    if (hit) this.evict(rec.id);
    const read = this.changesRead;
    // gone since the first look: the same answer as not there (the lab's would name others')
    const box = await this.lab.get(rec.id).catch((e: unknown) => {
      if (isSnaplabError(e, 'SANDBOX_NOT_FOUND')) return this.find(rec.id, caller);
      throw e;
    });
    if (box.state !== 'running' && box.state !== 'paused') return box;
    // removed since: the same answer as not there
    return (await this.keep(box, read)) ? box : this.find(rec.id, caller);
  }

  /**
   * Cache a sandbox got while the pass `read` counted. A removal (by the CLI, say) that a pass read
   * meanwhile found nothing cached to let go, and no later pass reads it again: so after such a
   * pass its record is asked for here, or the entry would stay, its connection open, until a
   * restart. False when it is gone (a read that fails says nothing: it is kept, as before).
   */
  private async keep(box: SandboxApi, read: number): Promise<boolean> {
    this.cache.set(box.id, box);
    if (this.changesRead === read || (await this.lookup(box.id).catch(orElse(box, `look up ${box.id} after a pass`))))
      return true;
    if (this.cache.get(box.id) === box) this.evict(box.id);
    return false;
  }

  /** The record of a sandbox as it stands (no check of the host), undefined when there is none. */
  private lookup(idOrName: string): Promise<SandboxApi | undefined> {
    return this.lab.get(idOrName, { check: false }).catch((e: unknown) => {
      if (isSnaplabError(e, 'SANDBOX_NOT_FOUND')) return undefined;
      throw e;
    });
  }

  /**
   * A snapshot the caller may see: its key's own (taken of its sandboxes) and the host's (taken
   * without a key: the socket, the CLI); `remove`: its own only. Admin keys and the socket: all.
   * Not there or not the caller's: one answer, SNAPSHOT_NOT_FOUND, naming nothing else.
   */
  snapshotFor(name: string, caller: Caller, remove = false): Promise<SnapshotApi> {
    return snapshotFor(this, name, caller, remove);
  }

  snapshotVisible(caller: Caller, snap: SnapshotApi, remove = false): boolean {
    const owner = (snap.toJSON().owner as string | null | undefined) ?? null;
    return caller.scopes.has('admin') || owner === caller.key || (!remove && owner === null);
  }

  /** The lab every request acts through: one for all callers (the routes keep each to its own). */
  labFor(_caller: Caller): ServedLab {
    return this.lab;
  }

  /** Its lab's pools and images, each long change one of its operations. */
  adminFor(_caller: Caller): AdminApi {
    return this.admin;
  }

  /** POST /sandboxes: made for the caller (create), as the API shows it. */
  async createSandbox(
    caller: Caller,
    body: CreateBody,
  ): Promise<{ view: Record<string, unknown>; opId: string | null }> {
    const box = await this.createFor(caller, body);
    return { view: this.view(box), opId: box.lastTrace?.id ?? null };
  }

  /** A sandbox made for the caller (a daemon has no nodes: a placement is refused). */
  createFor(caller: Caller, body: CreateBody): Promise<SandboxApi> {
    noPlacement(body);
    return this.create(caller, body);
  }

  /**
   * The Lab API as the holder of `token` has it, in this process (keyed-lab.ts): each call is
   * checked as the HTTP route that does the same is (the key, its scope, ownership, quotas,
   * ceilings), by the same functions. The in-process fronts (E2B's, MCP's /mcp) stand on it;
   * `streams`: the key's one count of long streams (its WebSockets and event streams on the TCP
   * listener too), which its commands count in.
   */
  keyed(token: string, streams?: StreamLimiter): KeyedLab {
    return new KeyedLab(this, token, streams);
  }

  async sandboxView(caller: Caller, idOrName: string): Promise<Record<string, unknown>> {
    return this.view(await this.sandbox(idOrName, caller));
  }

  destroySandbox(caller: Caller, idOrName: string): Promise<void> {
    return this.destroy(idOrName, undefined, caller);
  }

  /**
   * POST /pools/{name}/run: `run` with the body's encoding for stdin and the output; `signal`
   * aborts it (its client gone before the answer).
   */
  async runPool(caller: Caller, name: string, b: PoolRunBody, signal?: AbortSignal): Promise<Record<string, unknown>> {
    const r = await this.run(
      caller,
      name,
      {
        argv: b.argv,
        env: b.env,
        cwd: b.cwd,
        user: b.user,
        timeoutMs: b.timeoutMs,
        ...(b.stdin !== undefined ? { stdin: Buffer.from(b.stdin, b.encoding ?? 'utf8') } : {}),
      },
      signal,
    );
    return poolRunView(r, b.encoding);
  }

  /**
   * A command in a fresh sandbox of the pool, for HTTP's route and /rpc's run alike: held to the
   * key's ceilings (the standby's limits, egress, a user namespace) and its exec quota while it
   * runs; `signal` (its client gone) kills it.
   */
  async run(
    caller: Caller,
    name: string,
    spec: Omit<ExecOptions, 'encoding'> & { argv: string[]; stdin?: Buffer },
    signal?: AbortSignal,
  ): Promise<RunOutcome & { trace?: TraceSummary }> {
    // the run's sandbox is a standby like a take's: held to the key's ceilings while it runs
    const ceiling = await this.ceilings.claim(caller, { pool: name });
    let release = (): void => ceiling.release();
    try {
      const exec = await this.claimExec(caller);
      release = () => {
        exec();
        ceiling.release();
      };
      const { argv, ...opts } = spec;
      const r = await this.lab
        .pool(name)
        .run(argv, { ...opts, timeoutMs: this.deadline(spec.timeoutMs), encoding: 'buffer', signal });
      if (r.trace) this.metrics.observeTrace(r.trace);
      return r;
    } finally {
      release();
    }
  }

  /** The caller, and what this host holds its key to (the defaults where the key names none). */
  whoami(caller: Caller): Record<string, unknown> {
    return { ...describeCaller(caller) };
  }

  /** Its metrics: sandboxes by state, pools, processes, execs, operation phases, the home's disk. */
  async metricsText(): Promise<string> {
    // counted in the store: a scrape beside 10 000 makes no sandbox object (a stopped one is dead here)
    const { byState } = await this.lab.count({ check: false });
    const sandboxes: Record<SandboxState, number> = { creating: 0, running: 0, paused: 0, dead: 0, removing: 0 };
    for (const [st, n] of Object.entries(byState)) sandboxes[st === 'stopped' ? 'dead' : (st as SandboxState)] += n;
    return this.metrics.render({
      sandboxes,
      pools: await this.lab.pools(),
      processes: this.processes.running(),
      execs: this.execsRunning(),
      home: this.lab.home,
      egress: await this.lab.egressTotals(),
      e2bSessions: this.gauges.e2bSessions?.(),
    });
  }

  /** Every visible machine's memory, pids and CPU time now, from its cgroup (with `ids`, those only). */
  usage(caller: Caller, ids?: string[]): Promise<unknown[]> {
    return labUsage(this.lab, this.ownedBy(caller), ids);
  }

  /**
   * The event log as server-sent events, with ids: replayed after `q.after` (else from now), then
   * live. A key without admin is told of its own sandboxes only.
   */
  streamEvents(caller: Caller, _req: IncomingMessage, res: ServerResponse, q: EventQuery): void {
    let after = q.after ?? this.lab.journal.lastId();
    res.writeHead(200, {
      'content-type': 'text/event-stream',
      'cache-control': 'no-cache',
      connection: 'keep-alive',
      'x-accel-buffering': 'no',
    });
    const all = caller.scopes.has('admin');
    const write = (e: EventRecord): void => {
      if (e.id <= after) return;
      after = e.id;
      if (q.sandbox && e.sandbox !== q.sandbox && e.name !== q.sandbox) return;
      if (!all && (!e.sandbox || e.data?.owner !== caller.key)) return;
      // a reader that does not keep up is let go: it reconnects with Last-Event-ID and misses nothing
      if (res.writableLength > 1 << 20) return void res.destroy();
      res.write(
        `id: ${e.id}\nevent: ${e.type}\ndata: ${JSON.stringify({ ...e, at: new Date(e.at).toISOString() })}\n\n`,
      );
    };
    // listen first, then replay: nothing falls between the two
    const queued: EventRecord[] = [];
    let live = false;
    const onEvent = (e: EventRecord): void => (live ? write(e) : void queued.push(e));
    this.events.on('event', onEvent);
    for (let batch = this.events.after(after); batch.length; batch = this.events.after(after)) batch.forEach(write);
    live = true;
    queued.forEach(write);
    res.write(': connected\n\n');
    const keepalive = setInterval(() => res.write(': keepalive\n\n'), 15_000);
    const untrack = this.track(caller, { close: () => res.destroy() });
    res.on('close', () => {
      clearInterval(keepalive);
      this.events.off('event', onEvent);
      untrack();
    });
  }

  /** Its lab's scenarios. */
  scenariosFor(_caller: Caller): ScenariosApi {
    return this.scenarios;
  }

  /** The daemon's long operations (one list for every caller). */
  operationsFor(_caller: Caller): OperationsApi {
    return { list: async () => this.operations.list(), get: (id, waitS) => this.operations.get(id, waitS) };
  }

  /** The daemon's API keys (its lab's store). */
  readonly keyAdmin: KeyAdmin = {
    list: async () => this.lab.keys.list(),
    create: async (name, opts) => this.lab.keys.create(name, opts),
    remove: async (name) => this.lab.keys.remove(name),
  };

  /** Admin keys and the socket see every sandbox; other keys those they made. */
  visible(caller: Caller, box: { owner: string | null }): boolean {
    return caller.scopes.has('admin') || box.owner === caller.key;
  }

  /** What `lab.list` is asked for a caller: every sandbox for admin, else those of its key. */
  ownedBy(caller: Caller): string | undefined {
    return caller.scopes.has('admin') ? undefined : caller.key;
  }

  private evict(id: string): void {
    const box = this.cache.get(id);
    this.cache.delete(id);
    this.kept.drop(id);
    // its connection may carry other requests' commands: closed once they have ended
    if (box && !this.processes.of(id).some((p) => !p.ended)) box.close();
  }

  /** A sandbox as the API shows it: its toJSON (owner and timeout included). */
  view(box: SandboxApi): Record<string, unknown> {
    return box.toJSON();
  }

  async create(caller: Caller, body: CreateBody): Promise<SandboxApi> {
    const asked = resolveCreate(body, { timeoutS: this.opts.defaultTimeoutS });
    // root inside being root outside is for the host's administrators to choose, not any key's
    if (body.userns === false && !caller.scopes.has('admin')) {
      throw new SnaplabError(
        'FORBIDDEN',
        `key ${caller.key} may not create a sandbox without a user namespace (root inside would be root on the host)`,
        'this needs a key with the admin scope',
      );
    }
    const life = { owner: caller.key, timeoutS: asked.timeoutS, onTimeout: body.onTimeout };
    if (asked.from === 'snapshot') await this.snapshotFor(asked.snapshot, caller);
    const release = await this.claimSandbox(caller);
    const ceiling = await this.ceilings.claim(caller, body).catch((e: unknown) => {
      release();
      throw e;
    });
    // a name of our own is drawn again while it is taken (or being made by another request here)
    let name = body.name ?? defaultName(newId());
    while (body.name === undefined && (this.events.making.has(name) || (await this.taken(name))))
      name = defaultName(newId());
    this.events.making.add(name);
    const signal = AbortSignal.timeout(this.opts.createBoundS * 1000);
    let taking = false;
    const read = this.changesRead;
    try {
      let box: SandboxApi;
      let how: string;
      if (asked.from === 'pool') {
        this.events.taking++;
        taking = true;
        box = await this.lab.create({ pool: asked.pool, labels: body.labels, metadata: body.metadata, ...life });
        how = `a standby of pool ${asked.pool}`;
      } else if (asked.from === 'snapshot') {
        // the limits are the ceilings' (as asked where the caller has none: the Unix socket)
        box = await this.lab
          .restore(asked.snapshot, {
            name,
            limits: ceiling.limits,
            ...(ceiling.limits ? { diskAsked: asked.limits?.diskBytes !== undefined || 'server' } : {}),
            userns: asked.userns,
            ...(asked.ids !== undefined ? { ids: asked.ids } : {}),
            labels: body.labels,
            metadata: body.metadata,
            signal,
            ...(asked.egress ? { egress: asked.egress } : {}),
            ...life,
          })
          .catch(asGone(asked.snapshot));
        how = `restored from snapshot ${asked.snapshot}`;
      } else {
        const opts: LabCreateOptions & Served = {
          image: asked.image,
          name,
          storage: asked.storage,
          driver: asked.driver,
          limits: ceiling.limits ?? asked.limits,
          ...(ceiling.limits ? { diskAsked: asked.limits?.diskBytes !== undefined || 'server' } : {}),
          userns: asked.userns,
          ...(asked.ids !== undefined ? { ids: asked.ids } : {}),
          init: asked.init,
          ...(asked.egress ? { egress: asked.egress } : {}),
          labels: body.labels,
          metadata: body.metadata,
          signal,
          ...life,
        };
        box = await this.lab.create(opts);
        how = `from image ${box.image}`;
      }
      await this.keep(box, read);
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
      ceiling.release();
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
      this.events.remember(box);
      this.endProcesses(box.id);
      const t = await box.destroy();
      this.observe(t);
      this.cache.delete(box.id);
      this.events.record('destroyed', box, reason, { operation: t?.id ?? null });
    });
  }

  async pause(idOrName: string, reason: string | null = null, caller: Caller = LOCAL): Promise<SandboxApi> {
    const box = await this.sandbox(idOrName, caller);
    return this.own(box.id, async () => {
      const t = await box.pause(); // its timeout's clock stands still until it is resumed
      this.observe(t);
      this.events.record('paused', box, reason, { operation: t?.id ?? null });
      return box;
    });
  }

  async resume(idOrName: string, caller: Caller = LOCAL): Promise<SandboxApi> {
    const box = await this.sandbox(idOrName, caller);
    return this.own(box.id, async () => {
      const t = await box.resume(); // and its timeout's clock runs again, from now
      this.observe(t);
      this.events.record('resumed', box, null, { operation: t?.id ?? null });
      return box;
    });
  }

  /** Stop it, keeping its filesystem: its commands end, its timeout's clock stands still. */
  async stopSandbox(idOrName: string, reason: string | null = null, caller: Caller = LOCAL): Promise<SandboxApi> {
    const box = await this.sandbox(idOrName, caller);
    return this.own(box.id, async () => {
      this.endProcesses(box.id);
      const t = await box.stop();
      this.observe(t);
      this.cache.delete(box.id);
      this.events.record('stopped', box, reason ?? box.reason, { operation: t?.id ?? null });
      return box;
    });
  }

  /** Raise a stopped sandbox again on its volume (a fresh boot); its timeout runs again from now. */
  async startSandbox(idOrName: string, caller: Caller = LOCAL): Promise<SandboxApi> {
    const box = await this.sandbox(idOrName, caller);
    return this.own(box.id, async () => {
      const read = this.changesRead;
      const t = await box.start();
      this.observe(t);
      await this.keep(box, read);
      this.events.record('started', box, null, { operation: t?.id ?? null });
      return box;
    });
  }

  /** POST /sandboxes/{id}/{verb}: the daemon's call of each (its event told), for the route and a keyed lab. */
  changeState(verb: StateVerb, idOrName: string, caller: Caller): Promise<SandboxApi> {
    if (verb === 'pause') return this.pause(idOrName, null, caller);
    if (verb === 'resume') return this.resume(idOrName, caller);
    if (verb === 'stop') return this.stopSandbox(idOrName, null, caller);
    return this.startSandbox(idOrName, caller);
  }

  /** A sandbox's commands end with what runs them (held output or not). */
  private endProcesses(id: string): void {
    for (const p of this.processes.of(id))
      if (!p.ended) {
        p.handle?.kill(9);
        p.abandon();
      }
    this.processes.forget(id);
    this.kept.drop(id);
  }

  /** A new timeout from now (0: none). */
  async setTimeout(
    idOrName: string,
    timeoutS: number,
    onTimeout?: OnTimeout,
    caller: Caller = LOCAL,
  ): Promise<SandboxApi> {
    const box = await this.sandbox(idOrName, caller);
    await box.setTimeout(timeoutS, onTimeout);
    return box;
  }

  /**
   * A command run to its end for the caller (POST /sandboxes/{id}/exec, an /rpc exec, a keyed
   * lab's exec): held to its key's exec quota while it runs, with the request's deadline (none
   * given: the daemon's default; 0: none), timed into the metrics as `kind`. `started` is told of
   * the command as soon as it runs (a route kills it when its client goes).
   */
  async runExec(
    caller: Caller,
    box: SandboxApi,
    argv: string[],
    opts: ExecOptions,
    kind: 'oneshot' | 'rpc',
    started?: (p: { kill(signal: number): void }) => void,
  ): Promise<ExecResult> {
    const release = await this.claimExec(caller);
    const t0 = Date.now();
    try {
      const p = await box.spawn(argv, { ...opts, timeoutMs: this.deadline(opts.timeoutMs), encoding: 'buffer' });
      started?.(p);
      const r = await p.result;
      this.metrics.exec.observe(`kind="${kind}"`, Date.now() - t0);
      return r;
    } finally {
      release();
    }
  }

  /** A snapshot of the caller's sandbox, held to its key's snapshot ceiling while it is taken. */
  async snapshotOf(caller: Caller, box: SandboxApi, name: string, opts: { memory?: boolean }): Promise<SnapshotApi> {
    const release = await this.ceilings.claimSnapshot(caller);
    const snap = await box.snapshot(name, opts).finally(release);
    if (snap.lastTrace) this.metrics.observeTrace(snap.lastTrace);
    return snap;
  }

  /** Is a sandbox of this name there (as recorded)? */
  private async taken(name: string): Promise<boolean> {
    return this.lab.get(name, { check: false }).then(
      () => true,
      (e: unknown) => {
        if (isSnaplabError(e, 'SANDBOX_NOT_FOUND')) return false;
        throw e;
      },
    );
  }

  /** A finished operation's trace into the metrics (a lab that keeps its traces elsewhere gives none). */
  private observe(t: TraceSummary | undefined): void {
    if (t) this.metrics.observeTrace(t);
  }

  /** claims one after another: a count and its claim are not split by another request's */
  private claiming: Promise<unknown> = Promise.resolve();

  /** A slot for one more sandbox of this key, held until the create ends (the lab counts it after). */
  private claimSandbox(caller: Caller): Promise<() => void> {
    const claim = this.claiming.then(() => this.claimNow(caller));
    this.claiming = claim.then(
      () => undefined,
      () => undefined,
    );
    return claim;
  }

  private async claimNow(caller: Caller): Promise<() => void> {
    if (caller.maxSandboxes !== null) {
      const owned = (await this.lab.held(caller.key)).sandboxes;
      const have = owned + (this.making.get(caller.key) ?? 0);
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
  async claimExec(caller: Caller): Promise<() => void> {
    await this.keptCounted(caller);
    const n = this.execs.get(caller.key) ?? 0;
    if (caller.maxExecs !== null && n >= caller.maxExecs)
      throw new QuotaError('maxExecs', `key ${caller.key} runs ${n} of its ${caller.maxExecs} concurrent execs`);
    return this.countExec(caller.key);
  }

  /** keys whose kept commands (a previous daemon's) this daemon has counted; and those being counted */
  private readonly keptKeys = new Set<string>();
  private readonly countingKept = new Map<string, Promise<void>>();

  /**
   * Before a key's first exec here is counted against its quota: the commands a previous daemon
   * started for it that its running machines kept, found (kept.ts) and counted, so that a restart
   * does not give the key its whole quota again on top of them. Once a key (those without an exec
   * quota never): each of its running sandboxes is asked for its kept commands, 8 at a time; a
   * caller waits for that at most 10 s.
   */
  private async keptCounted(caller: Caller): Promise<void> {
    if (caller === LOCAL || caller.maxExecs === null || this.keptKeys.has(caller.key)) return;
    let counting = this.countingKept.get(caller.key);
    if (!counting) {
      counting = (async () => {
        const boxes = await this.lab.list({ owner: caller.key, state: ['running'], check: false });
        for (let i = 0; i < boxes.length; i += 8)
          await Promise.all(
            boxes.slice(i, i + 8).map((b) =>
              this.sandbox(b.id)
                .then((box) => this.kept.adopt(box))
                .catch(noted(`find the kept commands of ${b.name}`)),
            ),
          );
        this.keptKeys.add(caller.key);
      })().finally(() => this.countingKept.delete(caller.key));
      this.countingKept.set(caller.key, counting);
    }
    // at most 10 s (machines whose agents do not answer: each look waits up to 10 s): then on with
    // what is counted, the rest counted as it is found
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([counting, new Promise((r) => (timer = setTimeout(r, 10_000)))]);
    clearTimeout(timer);
  }

  /**
   * One more exec of this key's, past its quota if need be (a process a previous daemon started
   * for it, found running: kept.ts), until the returned release.
   */
  countExec(key: string): () => void {
    this.execs.set(key, (this.execs.get(key) ?? 0) + 1);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      this.execs.set(key, (this.execs.get(key) ?? 1) - 1);
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
  async startProcess(caller: Caller, box: SandboxApi, spec: ProcessSpec): Promise<Process> {
    const release = await this.claimExec(caller);
    const p = new Process(box.id, spec.argv, spec.tag ?? null, spec.tty !== undefined, this.opts.ringBytes);
    p.stdin = spec.stdin === true;
    const opts: SpawnOptions & { encoding: 'buffer' } = {
      env: spec.env,
      cwd: spec.cwd,
      user: spec.user,
      timeoutMs: spec.background ? spec.timeoutMs || undefined : this.deadline(spec.timeoutMs),
      tty: spec.tty,
      ...(spec.waitOutput ? { waitOutput: true } : {}),
      onStdout: (b) => p.output('stdout', b),
      onStderr: (b) => p.output('stderr', b),
      ...(spec.stdin ? { stdin: true as const } : {}),
      // a connection of its own: a slow reader pauses this command's output there, and no one else's
      detached: spec.detached ?? true,
      encoding: 'buffer',
    };
    try {
      const h = await spawnKept(box, p, spec, opts);
      p.agent = { close: () => h.disconnect?.(), pauseOutput: (on) => h.hold?.(on) };
      p.canHold = h.hold !== undefined;
      p.attach(h, (on) => h.hold?.(on));
    } catch (e) {
      release();
      throw e;
    }
    this.runs(box, p, release);
    return p;
  }

  /** A process of this daemon's from now on: listed, told of when it exits, its exec claim released then. */
  runs(box: SandboxApi, p: Process, release: () => void): void {
    this.processes.add(p);
    const started = Date.now();
    p.once('exit', () => {
      release();
      // its connection broke while its machine may run on: listed as lost, and looked for there
      // again (found, it takes this one's place); its end is told when it comes. One no longer
      // listed (its sandbox ended it: endProcesses) has ended, and is told as such
      if (lost(p) && this.processes.has(box.id, p.id) && this.processes.get(box.id, p.id) === p) {
        this.kept.forget(box.id);
        return;
      }
      this.metrics.exec.observe('kind="stream"', Date.now() - started);
      this.events.record('process.exited', box, p.error ? p.error.message : null, {
        process: p.id,
        tag: p.tag,
        exitCode: p.result?.exitCode ?? null,
        timedOut: p.result?.timedOut ?? false,
      });
    });
  }

  /**
   * A sandbox's processes, those a previous daemon started and the machine kept included (found
   * once, the first time they are asked for: kept.ts).
   */
  async processesOf(box: SandboxApi): Promise<Process[]> {
    await this.kept.adopt(box);
    return this.processes.of(box.id);
  }

  close(): void {
    if (this.timer) clearInterval(this.timer);
    this.processes.close();
    for (const b of this.cache.values()) b.close();
    this.lab.close();
  }
}
