import type { AgentClient } from '../agent/client.js';
import { DEFAULT_ON_TIMEOUT } from '../defaults.js';
import { SnaplabError } from '../errors.js';
import type { LabContext } from '../lab/context.js';
import {
  attachIn,
  connectAgent,
  ensureUsable,
  execIn,
  keptIn,
  pauseSandbox,
  resumeSandbox,
  snapshotSandbox,
  spawnIn,
  stopSandbox,
  type ExecOptions,
  type ExecProcess,
  type ExecResult,
} from '../lab/io/sandbox-ops.js';
import { destroyRecord, takeForRemoval } from '../lab/lifecycle/teardown.js';
import { startSandbox } from '../lab/lifecycle/start.js';
import { isStopped } from '../lab/lifecycle/stopped.js';
import { USERNS_SIZE } from '../host/userns/id-ranges.js';
import type { Limits, OnTimeout, SandboxMeta, SandboxRecord } from '../store/records.js';
import type { TraceSummary } from '../timing/trace.js';
import { Snapshot } from './snapshot.js';
import type {
  AttachedProcess,
  AttachOptions,
  BufferOutput,
  EgressRequest,
  EgressUsage,
  EgressView,
  KeptProcess,
  ProcessApi,
  SandboxApi,
  SandboxFiles,
  SpawnOptions,
} from './api.js';
import { FRONT_METADATA_PREFIXES } from './api.js';
import { changeEgress, egressUsage, egressView } from '../lab/net/egress.js';
import { encoded, type ExecText } from './output.js';
import { Writable, type Readable } from 'node:stream';
import { listDir, makeDir, movePath, readFile, removePath, statPath, writeFile } from '../lab/io/files.js';

export type { SandboxFiles } from './api.js';
import { checkLabels, metaOf, updateMeta } from '../lab/meta.js';
import { copyBetween, copyIn, copyOut, receiveArchive, sendArchive, type CopyResult } from '../lab/io/copy.js';
import { forwardPort, type Forward } from '../lab/io/ports.js';
import type { PortSpec } from '../lab/io/port-spec.js';
import { handledElsewhere } from '../cleanup.js';
import { sandboxUsage, type SandboxUsage } from '../lab/io/usage.js';
import { watchWith, type WatchEvent, type WatchHandle, type WatchOptions } from '../lab/io/watch.js';

/**
 * A running (or paused) isolated machine. Obtain one from `lab.create()`, `lab.restore()` or
 * `lab.get()`. Disposable: `await using box = await lab.create(...)` destroys it at scope end.
 */
export class Sandbox implements SandboxApi {
  /** trace of the operation that produced this object (create or restore), when it did */
  lastTrace: TraceSummary | undefined;
  private agent: AgentClient | undefined;

  /**
   * @internal `listed`: its labels and lifetime as a list read them with its record (a list of
   * thousands reads them once, not once per sandbox and getter); without it they are read live
   */
  constructor(
    private readonly ctx: LabContext,
    private record: SandboxRecord,
    agent?: AgentClient,
    trace?: TraceSummary,
    private listed?: SandboxMeta,
  ) {
    this.agent = agent;
    this.lastTrace = trace;
  }

  /** Its labels and lifetime: as listed, else read now. */
  private meta(): SandboxMeta {
    return this.listed ?? metaOf(this.ctx, this.record.id);
  }

  /** Change its labels or lifetime; read live from then on. */
  private changeMeta(patch: Partial<Omit<SandboxMeta, 'id'>>): void {
    this.listed = undefined;
    updateMeta(this.ctx, this.record.id, patch);
  }

  get id(): string {
    return this.record.id;
  }
  get name(): string {
    return this.record.name;
  }
  get state(): SandboxRecord['state'] {
    return this.record.state;
  }
  get image(): string {
    return this.record.image;
  }
  get storage(): string {
    return this.record.storage;
  }
  get driver(): string {
    return this.record.driver;
  }
  /** labels (selected by `lab.list({ labels })`) and metadata given at create or set since */
  get labels(): Record<string, string> {
    return this.meta().labels;
  }
  get metadata(): Record<string, string> {
    return this.meta().metadata;
  }
  get reason(): string | null {
    return this.record.reason;
  }
  get pool(): string | null {
    return this.record.pool;
  }
  get origin(): string | null {
    return this.record.origin;
  }
  get init(): 'agent' | 'systemd' {
    return this.record.init ?? 'agent';
  }
  get createdAt(): number {
    return this.record.createdAt;
  }
  /** when its timeout ends it (a daemon keeps the clock); null while paused or without one */
  get expiresAt(): number | null {
    return this.meta().expiresAt;
  }
  /** the API key that made it through a daemon ('local': the Unix socket), or null */
  get owner(): string | null {
    return this.meta().owner;
  }
  get timeoutS(): number {
    return this.meta().timeoutS ?? 0;
  }
  /** what it may use: memory, pids, CPUs, disk (those it was made with) */
  get limits(): Limits {
    return this.record.limits;
  }
  get onTimeout(): OnTimeout {
    return this.meta().onTimeout ?? DEFAULT_ON_TIMEOUT;
  }

  /** A new timeout from now (0: none); its clock runs while the sandbox runs. Needs a daemon's lab. */
  async setTimeout(timeoutS: number, onTimeout?: OnTimeout): Promise<void> {
    if (!Number.isSafeInteger(timeoutS) || timeoutS < 0)
      throw new SnaplabError('BAD_INPUT', `invalid timeoutS ${timeoutS}`, 'give whole seconds ≥ 0 (0: no timeout)');
    if (timeoutS) checkKeepsTime(this.ctx);
    this.changeMeta({
      timeoutS,
      ...(onTimeout ? { onTimeout } : {}),
      expiresAt: timeoutS && this.record.state === 'running' ? Date.now() + timeoutS * 1000 : null,
    });
  }

  /** Its outbound network, or null: loopback only (docs/egress.md). */
  get egress(): EgressView | null {
    return egressView(this.record);
  }

  /** Replace its egress lists: new connections meet them at once, established ones go on. */
  async setEgress(lists: EgressRequest): Promise<void> {
    await changeEgress(this.ctx, this.record, lists);
  }

  /** Its egress with its counters (bytes out, connections, refusals). */
  egressUsage(): Promise<EgressUsage> {
    return egressUsage(this.ctx, this.record);
  }

  /** Replace its labels and/or metadata (a front's own metadata keys are kept unless named: FRONT_METADATA_PREFIXES). */
  async setLabels(change: { labels?: Record<string, string>; metadata?: Record<string, string> }): Promise<void> {
    const patch: { labels?: Record<string, string>; metadata?: Record<string, string> } = {};
    if (change.labels) patch.labels = checkLabels('label', change.labels);
    if (change.metadata) {
      const fronts = Object.entries(this.metadata).filter(([k]) =>
        Object.values(FRONT_METADATA_PREFIXES).some((p) => k.startsWith(p)),
      );
      patch.metadata = { ...Object.fromEntries(fronts), ...checkLabels('metadata', change.metadata) };
    }
    this.changeMeta(patch);
  }

  /** the stored record: limits, pid, volume, origin */
  get info(): Readonly<SandboxRecord> {
    return this.record;
  }

  /** @internal the agent connection (opened on first use) */
  agentConnection(): Promise<AgentClient> {
    return this.connection();
  }

  /** @internal read its state and reason again from the store (another process paused or resumed it) */
  sync(): void {
    const now = this.ctx.store.getSandbox(this.record.id);
    // all of it: a start elsewhere gave it a new init (pid) along with its state
    if (now) Object.assign(this.record, now);
  }

  /** Watch a directory of the machine (inotify inside it, on a connection of its own); `close()` ends it. */
  async watch(path: string, opts: WatchOptions, onEvent: (e: WatchEvent) => void): Promise<WatchHandle> {
    return watchWith((argv, o) => this.spawn(argv, o), path, opts, onEvent);
  }

  /** Its memory, CPU time, processes and disk now (from its cgroup and its storage). */
  async usage(): Promise<SandboxUsage> {
    return sandboxUsage(this.ctx, this.record);
  }

  /** Its state and reason read again, and its labels and lifetime from now on read live. */
  async refresh(): Promise<this> {
    this.sync();
    this.listed = undefined;
    return this;
  }

  private connecting: Promise<AgentClient> | undefined;
  /** close() calls so far: a connection opened across one is not kept (nothing would close it) */
  private closes = 0;

  /**
   * One connection, also for calls that come at once before it is open; one that ended (its
   * agent's socket closed under it) is opened again, not kept failing every call of a machine
   * that may well be running (a call that fails on it asks: ensureUsable).
   */
  private async connection(): Promise<AgentClient> {
    if (this.agent && !this.agent.closed) return this.agent;
    this.agent = undefined;
    const closes = this.closes;
    if (!this.connecting) {
      const opening: Promise<AgentClient> = connectAgent(this.ctx, this.record).finally(() => {
        if (this.connecting === opening) this.connecting = undefined;
      });
      this.connecting = opening;
    }
    const agent = await this.connecting;
    if (closes !== this.closes) {
      void agent.close();
      throw new SnaplabError(
        'AGENT_UNREACHABLE',
        `the connection to sandbox ${this.name} was closed while it was being opened`,
        'get the sandbox again (lab.get) and retry',
      );
    }
    this.agent = agent;
    return agent;
  }

  /**
   * Run argv as given (no shell). Resolves with the exit code (127 not found, 124 timed out,
   * 128+N killed by signal N), collected output (strings; Buffers with `encoding: 'buffer'`) and
   * resource use.
   */
  async exec(argv: string[], opts: ExecOptions & BufferOutput): Promise<ExecResult>;
  async exec(argv: string[], opts?: ExecOptions): Promise<ExecText>;
  async exec(argv: string[], opts: ExecOptions = {}): Promise<ExecResult | ExecText> {
    const agent = await this.connection();
    const r = await execIn(this.ctx, this.record, agent, argv, opts);
    return opts.encoding === 'buffer' ? r : (encoded(r, 'utf8') as ExecText);
  }

  /**
   * Start argv without waiting: the handle feeds its stdin (`stdin: true`), signals it, resizes
   * its terminal (`tty: { cols, rows }`) and resolves `result` when it exits. `detached`: on a
   * connection of its own (its output held by `hold` alone), closed when it ends.
   */
  async spawn(argv: string[], opts: SpawnOptions & BufferOutput): Promise<ProcessApi<ExecResult>>;
  async spawn(argv: string[], opts?: SpawnOptions): Promise<ProcessApi>;
  async spawn(argv: string[], opts: SpawnOptions = {}): Promise<ProcessApi<ExecResult> | ProcessApi> {
    // a tag is a kept command's (a daemon's processes show theirs all the same)
    const { detached, keep, tag, ...exec } = opts;
    return this.handOut(detached, opts.encoding, (agent) =>
      spawnIn(this.ctx, this.record, agent, argv, { ...exec, ...(keep ? { keep: { tag } } : {}) }),
    );
  }

  /** The commands started with `keep: true` that still run, as the machine's agent keeps them. */
  async kept(): Promise<KeptProcess[]> {
    // an open connection to a frozen agent would wait for ever: say it is paused
    this.sync();
    if (this.record.state === 'paused') await ensureUsable(this.ctx, this.record);
    return keptIn(await this.connection());
  }

  /** Take on a kept command by pid (`kept()`): its output from now on, its input, signals and end. */
  async attach(pid: number, opts: AttachOptions): Promise<AttachedProcess> {
    // always on a connection of its own: letting go of it (`disconnect`) must not close the shared one
    let since = 0;
    const p = await this.handOut(true, 'buffer', async (agent) => {
      const a = await attachIn(this.ctx, this.record, agent, pid, opts);
      since = a.since;
      return a;
    });
    return { ...(p as ProcessApi<ExecResult>), since };
  }

  /** A command started (or taken on) on the shared connection, or on one of its own (`detached`). */
  private async handOut(
    detached: boolean | undefined,
    encoding: 'utf8' | 'buffer' | undefined,
    start: (agent: AgentClient) => Promise<ExecProcess>,
  ): Promise<ProcessApi<ExecResult> | ProcessApi> {
    const own = detached ? await connectAgent(this.ctx, this.record) : undefined;
    let p: ExecProcess;
    try {
      p = await start(own ?? (await this.connection()));
    } catch (e) {
      void own?.close();
      throw e;
    }
    const conn: Pick<ProcessApi, 'hold' | 'disconnect'> = own
      ? {
          hold: (on) => own.pauseOutput(on),
          disconnect: () => {
            own.pauseOutput(false);
            // never rejects: it waits for the socket's close, or destroys the socket after a second
            void own.close();
          },
        }
      : {};
    if (own) void p.result.then(conn.disconnect, conn.disconnect);
    if (encoding === 'buffer') return { ...p, ...conn };
    const result = p.result.then((r) => encoded(r, 'utf8') as ExecText);
    result.catch(handledElsewhere); // as spawnIn's own: a result nobody awaits must not end the process
    return { ...p, ...conn, result } as ProcessApi;
  }

  /**
   * Copy a host file or tree into the machine at `dest`, as `snaplab cp HOST MACHINE:DEST` does
   * (docker cp's rules; modes, owners, times and links kept; streamed).
   */
  async copyIn(hostPath: string, dest: string, opts: { follow?: boolean } = {}): Promise<CopyResult> {
    return copyIn(this.ctx, this.record, hostPath, dest, opts);
  }

  /** Copy a path of the machine to the host (no setuid/setgid bits, no device nodes on the host). */
  async copyOut(src: string, hostPath: string, opts: { follow?: boolean } = {}): Promise<CopyResult> {
    return copyOut(this.ctx, this.record, src, hostPath, opts);
  }

  /** Copy a path of this machine into another machine of the same lab (`snaplab cp A:SRC B:DEST`). */
  async copyTo(src: string, to: Sandbox, dest: string, opts: { follow?: boolean } = {}): Promise<CopyResult> {
    return copyBetween(this.ctx, this.record, src, to.record, dest, opts);
  }

  /**
   * Carry connections to 127.0.0.1:`local` (0: a free port) to the machine's port `remote`, until
   * the forward is closed (closeForwards); a failed connection is given to `onError`.
   */
  async forwardPort(spec: PortSpec, onError: (e: unknown) => void): Promise<Forward> {
    return forwardPort(this.ctx, this.record, spec, onError);
  }

  /** Unpack a tar stream into the directory `dest` of the machine (every name kept below it). */
  async upload(dest: string, tar: Readable): Promise<CopyResult> {
    return sendArchive(this.ctx, this.record, dest, tar, { plain: true });
  }

  /** Stream the tar of `src` (named after its last component; `dir/.` for its contents) into `sink`. */
  async download(src: string, sink: Writable, opts: { follow?: boolean } = {}): Promise<CopyResult> {
    return receiveArchive(this.ctx, this.record, src, sink, opts);
  }

  /**
   * The machine's files, each call run inside it as `user` (default root): streamed reads and
   * writes (a write lands whole or not at all), stat, list, mkdir, remove, move.
   */
  get files(): SandboxFiles {
    const ctx = this.ctx;
    const rec = (): SandboxRecord => this.record;
    return {
      stat: (path, o = {}) => statPath(ctx, rec(), path, o),
      list: (path, o = {}) => listDir(ctx, rec(), path, o),
      mkdir: (path, o = {}) => makeDir(ctx, rec(), path, o),
      remove: (path, o = {}) => removePath(ctx, rec(), path, o),
      move: (from, to, o = {}) => movePath(ctx, rec(), from, to, o),
      write: (path, data, o = {}) => writeFile(ctx, rec(), path, data, o),
      readTo: (path, sink, o = {}) => readFile(ctx, rec(), path, sink, o),
      read: async (path, o = {}) => {
        const parts: Buffer[] = [];
        const sink = new Writable({
          write: (b: Buffer, _e, cb) => {
            parts.push(b);
            cb();
          },
        });
        await readFile(ctx, rec(), path, sink, o);
        return Buffer.concat(parts);
      },
    };
  }

  /** Write a file inside the sandbox (parent directories are made). */
  async putFile(path: string, data: Buffer | string, mode = 0o644): Promise<void> {
    await (await this.connection()).putFile(path, Buffer.from(data), mode);
  }

  async getFile(path: string): Promise<Buffer> {
    return (await this.connection()).getFile(path);
  }

  /**
   * A consistent filesystem snapshot: the sandbox is frozen while it is taken (a VM writes its
   * cache to its disk first). Processes are not saved, except with `memory` (VM driver): then the
   * whole machine continues after a restore.
   */
  async snapshot(name: string, opts: { memory?: boolean } = {}): Promise<Snapshot> {
    const { result, trace } = await this.ctx.traced('snapshot', this.name, async (t) => {
      const wasRunning = this.record.state === 'running';
      const rec = await snapshotSandbox(this.ctx, this.record, name, t, {
        memory: opts.memory,
        agent: () => this.connection(),
      });
      // a VM's clock stood still while it was paused for the snapshot
      if (wasRunning && this.ctx.driver(this.record.driver).capabilities.clockStopsWhilePaused) {
        const agent = await this.connection();
        await t.phase('clock set', () => agent.setClock(BigInt(Date.now()) * 1_000_000n));
      }
      return rec;
    });
    return new Snapshot(result, trace);
  }

  /**
   * Stop it and keep its filesystem: a system machine halts cleanly (killed past a 10 s grace).
   * Then `start` (a fresh boot on the same files, under the same id), `snapshot` or `destroy`.
   * Its timeout's clock stands still while it is stopped.
   */
  async stop(): Promise<TraceSummary> {
    this.close();
    const { trace } = await this.ctx.traced('stop', this.name, (t) => stopSandbox(this.ctx, this.record, t));
    if (this.timeoutS) this.changeMeta({ expiresAt: null });
    return trace;
  }

  /**
   * Raise a stopped machine again on its volume, under the same id, name, limits and network
   * address: new processes (a new PID 1), the files it had. Its timeout starts again from now.
   */
  async start(): Promise<TraceSummary> {
    this.close();
    const { result, trace } = await this.ctx.traced('start', this.name, (t) => startSandbox(this.ctx, this.record, t));
    this.agent = result;
    const timeoutS = this.timeoutS;
    if (timeoutS) this.changeMeta({ expiresAt: Date.now() + timeoutS * 1000 });
    return trace;
  }

  /** It is stopped (`stop`): dead, its filesystem kept, and `start` raises it again. */
  get stopped(): boolean {
    return isStopped(this.record);
  }

  /** Freeze every process (cgroup freezer); an idle paused sandbox costs no CPU. */
  async pause(): Promise<TraceSummary> {
    const { trace } = await this.ctx.traced('pause', this.name, (t) => pauseSandbox(this.ctx, this.record, t));
    // a paused sandbox's clock stands still: resume starts its timeout again
    if (this.timeoutS) this.changeMeta({ expiresAt: null });
    return trace;
  }

  async resume(): Promise<TraceSummary> {
    const trace = (
      await this.ctx.traced('resume', this.name, async (t) => {
        await resumeSandbox(this.ctx, this.record, t);
        // a VM's clock stood still while it was paused (a namespace sandbox shares the host's)
        if (this.ctx.driver(this.record.driver).capabilities.clockStopsWhilePaused) {
          const agent = await this.connection();
          await t.phase('clock set', () => agent.setClock(BigInt(Date.now()) * 1_000_000n));
        }
      })
    ).trace;
    const timeoutS = this.timeoutS;
    if (timeoutS) this.changeMeta({ expiresAt: Date.now() + timeoutS * 1000 });
    return trace;
  }

  /** Close the agent connection; the sandbox keeps running. */
  close(): void {
    this.closes++;
    this.connecting = undefined; // a call after this opens its own
    // closing ends its socket; nothing is waited for, and a close has nothing to report
    void this.agent?.close();
    this.agent = undefined;
  }

  /** Kill every process, delete the filesystem, forget the record. */
  async destroy(): Promise<TraceSummary> {
    this.close();
    const { trace } = await this.ctx.traced('rm', this.name, async (t) => {
      const taken = await takeForRemoval(this.ctx, this.record);
      if (taken) await t.phase('destroy', () => destroyRecord(this.ctx, taken, t));
    });
    this.record = { ...this.record, state: 'dead', reason: 'destroyed' };
    return trace;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    if (this.ctx.store.getSandbox(this.id)) await this.destroy();
    else this.close();
  }

  toJSON(): Record<string, unknown> {
    const r = this.record;
    const m = this.meta(); // once: a list's JSON of thousands reads no row per sandbox
    return {
      id: r.id,
      name: r.name,
      state: r.state,
      stopped: this.stopped,
      reason: r.reason,
      image: r.image,
      storage: r.storage,
      driver: r.driver,
      limits: r.limits,
      origin: r.origin,
      pool: r.pool,
      pid: r.pid,
      userns: r.uidBase === null ? null : { uidBase: r.uidBase, size: r.ids ?? USERNS_SIZE },
      init: r.init ?? 'agent',
      hostRoot: this.hostRoot,
      egress: this.egress,
      labels: m.labels,
      metadata: m.metadata,
      ...lifetimeView(m),
      createdAt: new Date(r.createdAt).toISOString(),
    };
  }

  /** A namespace sandbox whose root is the host's root (no user namespace): said in `ls` and warned about. */
  get hostRoot(): boolean {
    // (a dead one runs nothing: its range was given back when its processes ended)
    const { hostRootWithoutUserns } = this.ctx.driver(this.record.driver).capabilities;
    return hostRootWithoutUserns && this.record.uidBase === null && this.record.state !== 'dead';
  }
}

/** A timeout needs a clock that ends it: a daemon's lab keeps one (Lab.open's keepsTime). */
export function checkKeepsTime(ctx: LabContext): void {
  if (!ctx.keepsTime)
    throw new SnaplabError(
      'BAD_INPUT',
      'a timeout needs a daemon: the embedded lab runs nothing that would end the sandbox',
      'create it through `snaplab serve` (SNAPLAB_HOST), or destroy it yourself',
    );
}

/** Its owner and timeout as the API shows them (the daemon's view of a sandbox is its toJSON). */
function lifetimeView(m: SandboxMeta): Record<string, unknown> {
  return {
    owner: m.owner,
    timeoutS: m.timeoutS ?? 0,
    onTimeout: m.onTimeout ?? DEFAULT_ON_TIMEOUT,
    expiresAt: m.expiresAt ? new Date(m.expiresAt).toISOString() : null,
  };
}
