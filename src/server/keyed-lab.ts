/**
 * The Lab API as one key has it, in the daemon's own process: what the in-process fronts (E2B's,
 * src/e2b/; MCP's /mcp) stand on instead of a client of the daemon's HTTP API on loopback. Each call is held
 * to what the HTTP route that does the same holds a request to, by the same functions, never a copy
 * of them: the key is looked up on every call (`callerOf`: one removed since answers UNAUTHORIZED),
 * its scope checked (`requireScope`, the route's scope), its sandboxes found as its own
 * (`Daemon.sandbox`), its bodies checked against the route's schema (`checked`), its commands held
 * to its exec quota (`Daemon.runExec`, `Daemon.startProcess`), its creates and snapshots to its
 * quotas and ceilings (`Daemon.create`, `Daemon.snapshotOf`), and its changes told as the
 * daemon's events (`Daemon.changeState` …). A command it starts is a process of the daemon (listed,
 * timed, told of when it exits) counted in the key's one stream count; its commands end with their
 * key, and with the lab (`close`: a request of MCP's that its client left).
 */
import { EventEmitter } from 'node:events';
import type { Readable, Writable } from 'node:stream';
import type {
  CallerInfo,
  CountOptions,
  EgressRequest,
  EgressUsage,
  LabApi,
  LabCreateOptions,
  LabRestoreOptions,
  ListOptions,
  OnTimeout,
  ProcessApi,
  SandboxApi,
  SandboxCount,
  SandboxFiles,
  SnapshotApi,
  SpawnOptions,
  WatchHandle,
  WatchOptions,
  WatchEvent,
  BufferOutput,
  KeyedLabApi,
  KeptProcess,
  AttachOptions,
  AttachedProcess,
} from '../sdk/api.js';
import { SnaplabError } from '../errors.js';
import type { ExecOptions, ExecResult } from '../lab/io/sandbox-ops.js';
import { collected, type Collected } from '../agent/output-cap.js';
import { encoded, type ExecText } from '../sdk/output.js';
import { feedInput } from '../lab/io/streams.js';
import { watchWith } from '../lab/io/watch.js';
import { envObject } from '../client/remote.js';
import { handledElsewhere } from '../cleanup.js';
import { aborted } from '../agent/agent-errors.js';
import { callerOf, describeCaller, requireScope, type Caller } from './keys.js';
import { scopeOf, type Route } from './scopes.js';
import { requireEgress } from './ceilings.js';
import { checked } from './checked.js';
import type { TSchema } from 'typebox';
import { CreateBody, EgressBody, ExecBody, LabelsBody, ProcessBody, SnapshotBody, TimeoutBody } from './schemas.js';
import { countFor, listFor } from './owned-list.js';
import { asGone, snapshotFor } from './snapshot-access.js';
import type { Daemon, StateVerb } from './daemon.js';
import type { Process } from './processes.js';
import type { StreamLimiter } from './limits.js';

export class KeyedLab implements KeyedLabApi {
  constructor(
    readonly daemon: Daemon,
    private readonly token: string,
    private readonly streams?: StreamLimiter,
  ) {}

  /** The caller the key stands for now, held to the scope of the route that does what this call does (server/scopes.ts). */
  caller(route: Route): Caller {
    const c = callerOf(this.daemon.lab.keys, this.token);
    requireScope(c, scopeOf(route));
    return c;
  }

  /** A long stream of this key (a command it started) counted until it closes, or refused (429). */
  admit(caller: Caller, closes: EventEmitter): void {
    this.streams?.admit(caller.key, closes);
  }

  /** POST /sandboxes: the options as the remote lab sends them (JSON), checked by its schema. */
  async create(opts: LabCreateOptions = {}): Promise<SandboxApi> {
    const c = this.caller('POST /sandboxes');
    const body = checked(CreateBody, JSON.parse(JSON.stringify(opts)) as unknown, 'create');
    return new KeyedSandbox(this, await this.daemon.createFor(c, body));
  }

  /** POST /sandboxes with a snapshot: the options as the remote lab sends them, checked by its schema. */
  async restore(snapshot: string, opts: LabRestoreOptions = {}): Promise<SandboxApi> {
    const c = this.caller('POST /sandboxes');
    const body = checked(CreateBody, JSON.parse(JSON.stringify({ snapshot, ...opts })) as unknown, 'restore');
    return new KeyedSandbox(this, await this.daemon.createFor(c, body));
  }

  /** GET /sandboxes/{id} */
  async get(idOrName: string): Promise<SandboxApi> {
    return new KeyedSandbox(this, await this.daemon.sandbox(idOrName, this.caller('GET /sandboxes/:id')));
  }

  /** GET /sandboxes */
  async list(opts: ListOptions = {}): Promise<SandboxApi[]> {
    return (await listFor(this.daemon, this.caller('GET /sandboxes'), opts)).map((b) => new KeyedSandbox(this, b));
  }

  /** GET /counts/sandboxes */
  async count(opts: CountOptions = {}): Promise<SandboxCount> {
    return countFor(this.daemon, this.caller('GET /counts/sandboxes'), opts);
  }

  /** GET /pools */
  async pools(): ReturnType<LabApi['pools']> {
    this.caller('GET /pools');
    return this.daemon.lab.pools();
  }

  /** GET /snapshots: those the key may see */
  async snapshots(): Promise<SnapshotApi[]> {
    const c = this.caller('GET /snapshots');
    return (await this.daemon.labFor(c).snapshots()).filter((s) => this.daemon.snapshotVisible(c, s));
  }

  /** DELETE /snapshots/{name}: one the key may remove, else SNAPSHOT_NOT_FOUND (naming no other) */
  async removeSnapshot(name: string): Promise<void> {
    const c = this.caller('DELETE /snapshots/:name');
    await snapshotFor(this.daemon, name, c, true);
    await this.daemon.labFor(c).removeSnapshot(name).catch(asGone(name));
  }

  /** GET /whoami */
  async whoami(): Promise<CallerInfo> {
    return describeCaller(this.caller('GET /whoami'));
  }

  /** the commands running through this lab now: each one's kill */
  readonly running = new Set<() => void>();

  /**
   * Its commands still running are killed, as a remote lab's are when its connections close (a
   * request of MCP's that its client left); the sandboxes' objects are the daemon's, kept.
   */
  close(): void {
    for (const kill of [...this.running]) kill();
    this.running.clear();
  }
}

/**
 * One sandbox through a keyed lab: its fields are the daemon's object of it as the last call found
 * it; every call finds it again as the key's own (`Daemon.sandbox`: not there or not the key's is
 * SANDBOX_NOT_FOUND), as each request does.
 */
class KeyedSandbox implements SandboxApi {
  constructor(
    private readonly k: KeyedLab,
    private inner: SandboxApi,
  ) {}

  /** The sandbox as the caller may reach it now, for a call that does what this route does. */
  private reach(route: Route): Promise<{ c: Caller; box: SandboxApi }> {
    return this.as(this.k.caller(route));
  }

  /** The sandbox as this caller (its key and scope already checked) may reach it now. */
  private async as(c: Caller): Promise<{ c: Caller; box: SandboxApi }> {
    this.inner = await this.k.daemon.sandbox(this.inner.id, c);
    return { c, box: this.inner };
  }

  get id(): string {
    return this.inner.id;
  }
  get name(): string {
    return this.inner.name;
  }
  get state(): string {
    return this.inner.state;
  }
  get image(): string {
    return this.inner.image;
  }
  get storage(): string {
    return this.inner.storage;
  }
  get driver(): string {
    return this.inner.driver;
  }
  get labels(): Record<string, string> {
    return this.inner.labels;
  }
  get metadata(): Record<string, string> {
    return this.inner.metadata;
  }
  get pool(): string | null {
    return this.inner.pool;
  }
  get stopped(): boolean {
    return this.inner.stopped;
  }
  get reason(): string | null {
    return this.inner.reason;
  }
  get origin(): string | null {
    return this.inner.origin;
  }
  get init(): 'agent' | 'systemd' {
    return this.inner.init;
  }
  get createdAt(): number {
    return this.inner.createdAt;
  }
  get expiresAt(): number | null {
    return this.inner.expiresAt;
  }
  get owner(): string | null {
    return this.inner.owner;
  }
  get timeoutS(): number {
    return this.inner.timeoutS;
  }
  get onTimeout(): OnTimeout {
    return this.inner.onTimeout;
  }
  get limits(): SandboxApi['limits'] {
    return this.inner.limits;
  }
  get hostRoot(): boolean {
    return this.inner.hostRoot;
  }
  get egress(): SandboxApi['egress'] {
    return this.inner.egress;
  }
  get lastTrace(): SandboxApi['lastTrace'] {
    return this.inner.lastTrace;
  }

  /** The file routes: reading is `read`, changing is `exec`. */
  get files(): SandboxFiles {
    const on = async (route: Route): Promise<SandboxFiles> => (await this.reach(route)).box.files;
    return {
      stat: async (path, o) => (await on('GET /sandboxes/:id/files/stat')).stat(path, o),
      list: async (path, o) => (await on('GET /sandboxes/:id/files/list')).list(path, o),
      mkdir: async (path, o) => (await on('POST /sandboxes/:id/files/mkdir')).mkdir(path, o),
      remove: async (path, o) => (await on('DELETE /sandboxes/:id/files')).remove(path, o),
      move: async (from, to, o) => (await on('POST /sandboxes/:id/files/move')).move(from, to, o),
      write: async (path, data, o) => (await on('PUT /sandboxes/:id/files')).write(path, data, o),
      read: async (path, o) => (await on('GET /sandboxes/:id/files')).read(path, o),
      readTo: async (path, sink, o) => (await on('GET /sandboxes/:id/files')).readTo(path, sink, o),
    };
  }

  /**
   * POST /sandboxes/{id}/exec: no deadline where none is given (0, as the remote lab sends it); its
   * body checked as the route's (ExecBody); killed when its key is removed, as an /rpc exec is.
   */
  async exec(argv: string[], opts: ExecOptions & BufferOutput): Promise<ExecResult>;
  async exec(argv: string[], opts?: ExecOptions): Promise<ExecText>;
  async exec(argv: string[], opts: ExecOptions = {}): Promise<ExecResult | ExecText> {
    const asked = { argv, env: envObject(opts.env), cwd: opts.cwd, user: opts.user, timeoutMs: opts.timeoutMs ?? 0 };
    // the key and its scope first, then the body, then the sandbox: a route's order
    const { c, box } = await this.as(checkedAs(this.k.caller('POST /sandboxes/:id/exec'), ExecBody, asked, 'exec'));
    const d = this.k.daemon;
    let untrack = (): void => {};
    const kill = { fn: (): void => {} };
    try {
      const r = await d.runExec(c, box, argv, { ...opts, ...asked }, 'oneshot', (p) => {
        kill.fn = () => p.kill(9);
        this.k.running.add(kill.fn);
        untrack = d.track(c, { close: kill.fn });
      });
      return encoded(r, opts.encoding);
    } finally {
      this.k.running.delete(kill.fn);
      untrack();
    }
  }

  /**
   * GET /sandboxes/{id}/exec (a streamed exec): a process of the daemon (`startProcess`; on the
   * sandbox's shared connection unless `detached`, as the embedded lab's spawn), killed
   * when the caller lets go of it (`disconnect`) or its key is removed, as a remote spawn is when
   * its WebSocket closes. Its options are checked as the route's (ProcessBody); a stream without a
   * callback is collected into the result (its first 16 MiB, as the remote lab's).
   */
  async spawn(argv: string[], opts: SpawnOptions & BufferOutput): Promise<ProcessApi<ExecResult>>;
  async spawn(argv: string[], opts?: SpawnOptions): Promise<ProcessApi>;
  async spawn(argv: string[], opts: SpawnOptions = {}): Promise<ProcessApi<ExecResult> | ProcessApi> {
    const spec = {
      argv,
      env: envObject(opts.env),
      cwd: opts.cwd,
      user: opts.user,
      timeoutMs: opts.timeoutMs ?? 0,
      tty: opts.tty,
      stdin: opts.stdin !== undefined,
      ...(opts.waitOutput ? { waitOutput: true } : {}),
      tag: opts.tag,
      keep: opts.keep,
    };
    const { c, box } = await this.as(
      checkedAs(this.k.caller('POST /sandboxes/:id/processes'), ProcessBody, spec, 'command'),
    );
    const d = this.k.daemon;
    const closes = new EventEmitter();
    this.k.admit(c, closes);
    let p: Process;
    try {
      // a connection of its own only when asked for (its output then held by `hold`), as the embedded lab's spawn
      p = await d.startProcess(c, box, { ...spec, detached: opts.detached === true });
    } catch (e) {
      closes.emit('close');
      throw e;
    }
    const ended = (): void => {
      if (!p.ended) p.handle?.kill(9);
      p.abandon();
    };
    // a kept one let go of (a front that stops) runs on: that is what keeping it is for
    return this.handOut(c, p, opts, opts.detached === true, ended, p.kept, closes);
  }

  /** GET /sandboxes/{id}/processes: the daemon's kept ones that run (a previous daemon's too) */
  async kept(): Promise<KeptProcess[]> {
    const { box } = await this.reach('GET /sandboxes/:id/processes');
    return (await this.k.daemon.processesOf(box))
      .filter((p) => p.kept && !p.ended && p.pid !== null)
      .map((p) => ({
        pid: p.pid!,
        tag: p.tag,
        tty: p.tty,
        stdin: p.stdin,
        held: false, // the daemon's processes are read by any number of readers at once
        startedAt: p.startedAt,
      }));
  }

  /**
   * GET /sandboxes/{id}/processes/{process}/attach from the output's end, by the command's pid:
   * its output from now on; letting go of it (`disconnect`) leaves it running.
   */
  async attach(pid: number, opts: AttachOptions): Promise<AttachedProcess> {
    const { c, box } = await this.reach('GET /sandboxes/:id/processes/:pid/attach');
    const running = (x: Process): boolean => x.kept && x.pid === pid && !x.ended;
    // the daemon's first, its machine's only if it is not there
    const p = this.k.daemon.processes.of(box.id).find(running) ?? (await this.k.daemon.processesOf(box)).find(running);
    if (!p)
      throw new SnaplabError(
        'PROCESS_NOT_FOUND',
        `no kept command has pid ${pid} in sandbox ${box.name}`,
        'it has ended, or was not started with keep: list them with kept()',
      );
    const closes = new EventEmitter();
    this.k.admit(c, closes);
    const kill = (): void => {
      if (!p.ended) p.handle?.kill(9);
    };
    const since = p.ring.total;
    const h = this.handOut(c, p, { ...opts, encoding: 'buffer' }, false, kill, true, closes, since);
    return { ...(h as ProcessApi<ExecResult>), since };
  }

  /**
   * A daemon's process to the caller, from `from` in its output on, until it ends or is let go
   * (`disconnect`, this lab closed): `kill` ends it then, unless `runsOn` (a kept one's, an
   * attach's: the caller stops listening, the command runs on). Its key removed, it is killed.
   */
  private handOut(
    c: Caller,
    p: Process,
    opts: SpawnOptions,
    own: boolean,
    kill: () => void,
    runsOn: boolean,
    closes: EventEmitter,
    from = 0,
  ): ProcessApi<ExecResult> | ProcessApi {
    const d = this.k.daemon;
    const argv = p.argv;
    let proc: ProcessApi<ExecResult> | undefined;
    const letGo = runsOn ? (): void => proc?.disconnect?.() : kill;
    const untrack = d.track(c, { close: kill });
    this.k.running.add(letGo);
    proc = processApi(p, opts, own, from, runsOn ? null : kill, () => {
      this.k.running.delete(letGo);
      untrack();
      closes.emit('close');
    });
    // its signal aborts it, as the other labs' spawn: killed, and its result rejects (ABORTED)
    let abortedBy = false;
    const signal = opts.signal;
    const abort = (): void => {
      abortedBy = true;
      proc.kill(9);
    };
    if (signal?.aborted) abort();
    else signal?.addEventListener('abort', abort, { once: true });
    const settled = proc.result.then(
      (r) => {
        signal?.removeEventListener('abort', abort);
        if (abortedBy) throw aborted(`exec of ${argv[0] ?? '?'}`);
        return r;
      },
      (e: unknown) => {
        signal?.removeEventListener('abort', abort);
        throw e;
      },
    );
    settled.catch(handledElsewhere); // a result nobody awaits must not end the caller's process
    const bytes = { ...proc, result: settled };
    if (opts.stdin !== undefined && opts.stdin !== true) feedInput(bytes, opts.stdin);
    if (opts.encoding === 'buffer') return bytes;
    const result = settled.then((r) => encoded(r, 'utf8') as ExecText);
    result.catch(handledElsewhere);
    return { ...proc, result };
  }

  /** PUT /sandboxes/{id}/files, as the remote lab's */
  async putFile(path: string, data: Buffer | string, mode = 0o644): Promise<void> {
    await this.files.write(path, data, { mode });
  }

  /** GET /sandboxes/{id}/files, as the remote lab's */
  getFile(path: string): Promise<Buffer> {
    return this.files.read(path);
  }

  /** PUT /sandboxes/{id}/archive */
  async upload(dest: string, tar: Readable): Promise<Awaited<ReturnType<SandboxApi['upload']>>> {
    return (await this.reach('PUT /sandboxes/:id/archive')).box.upload(dest, tar);
  }

  /** GET /sandboxes/{id}/archive: a missing path is FILE_NOT_FOUND before anything is written */
  async download(src: string, sink: Writable): Promise<Awaited<ReturnType<SandboxApi['download']>>> {
    const { box } = await this.reach('GET /sandboxes/:id/archive');
    await box.files.stat(src);
    return box.download(src, sink);
  }

  /** POST /sandboxes/{id}/snapshots */
  async snapshot(name: string, opts: { memory?: boolean } = {}): Promise<SnapshotApi> {
    const asked = { name, memory: opts.memory };
    const { c, box } = await this.as(
      checkedAs(this.k.caller('POST /sandboxes/:id/snapshots'), SnapshotBody, asked, 'snapshot'),
    );
    return this.k.daemon.snapshotOf(c, box, name, opts);
  }

  /** PATCH /sandboxes/{id} */
  async setLabels(change: { labels?: Record<string, string>; metadata?: Record<string, string> }): Promise<void> {
    const c = this.k.caller('PATCH /sandboxes/:id');
    const body = checked(LabelsBody, change, 'labels');
    await (await this.as(c)).box.setLabels(body);
  }

  /** POST /sandboxes/{id}/timeout */
  async setTimeout(timeoutS: number, onTimeout?: OnTimeout): Promise<void> {
    const c = this.k.caller('POST /sandboxes/:id/timeout');
    const b = checked(TimeoutBody, { timeoutS, ...(onTimeout ? { onTimeout } : {}) }, 'timeout');
    this.inner = await this.k.daemon.setTimeout(this.inner.id, b.timeoutS, b.onTimeout, c);
  }

  /** PUT /sandboxes/{id}/egress: refused before the sandbox is looked at for a key without egress */
  async setEgress(lists: EgressRequest): Promise<void> {
    const c = this.k.caller('PUT /sandboxes/:id/egress');
    requireEgress(c, 'new egress lists');
    const body = checked(EgressBody, lists, 'egress lists');
    await (await this.as(c)).box.setEgress(body);
  }

  /** GET /sandboxes/{id}/egress */
  async egressUsage(): Promise<EgressUsage> {
    return (await this.reach('GET /sandboxes/:id/egress')).box.egressUsage();
  }

  /** A watcher in the machine, as the remote lab's: a command of the key's (spawn, above). */
  watch(path: string, opts: WatchOptions, onEvent: (e: WatchEvent) => void): Promise<WatchHandle> {
    return watchWith((argv, o) => this.spawn(argv, o), path, opts, onEvent);
  }

  /** GET /sandboxes/{id}/usage */
  async usage(): Promise<Awaited<ReturnType<SandboxApi['usage']>>> {
    return (await this.reach('GET /sandboxes/:id/usage')).box.usage();
  }

  /** GET /sandboxes/{id} */
  async refresh(): Promise<this> {
    await this.reach('GET /sandboxes/:id');
    return this;
  }

  /** POST /sandboxes/{id}/pause … start and DELETE: the daemon's own calls, which tell them as events. */
  pause(): Promise<undefined> {
    return this.change('pause');
  }

  resume(): Promise<undefined> {
    return this.change('resume');
  }

  stop(): Promise<undefined> {
    return this.change('stop');
  }

  start(): Promise<undefined> {
    return this.change('start');
  }

  private async change(verb: StateVerb): Promise<undefined> {
    this.inner = await this.k.daemon.changeState(verb, this.inner.id, this.k.caller(`POST /sandboxes/:id/${verb}`));
    return undefined;
  }

  async destroy(): Promise<undefined> {
    await this.k.daemon.destroySandbox(this.k.caller('DELETE /sandboxes/:id'), this.inner.id);
    return undefined;
  }

  /** Nothing to let go: the object is the daemon's. */
  close(): void {}

  toJSON(): Record<string, unknown> {
    return this.inner.toJSON();
  }
}

/**
 * A daemon's process as the Lab API's spawn gives one back: its output to the caller's callbacks
 * (what came before they were set, from the ring), its input and signals to its handle.
 */
function processApi(
  p: Process,
  opts: ExecOptions,
  own: boolean,
  from: number,
  kill: (() => void) | null,
  done: () => void,
): ProcessApi<ExecResult> {
  const h = p.handle!;
  // a stream without a callback is collected, as the remote lab collects it (its first 16 MiB)
  const kept = { stdout: { chunks: [], bytes: 0 } as Collected, stderr: { chunks: [], bytes: 0 } as Collected };
  let cut = false;
  const deliver = (c: { stream: 'stdout' | 'stderr'; data: Buffer }): void => {
    const fn = c.stream === 'stdout' ? opts.onStdout : opts.onStderr;
    if (fn) fn(c.data);
    else if (collected(kept[c.stream], c.data)) cut = true;
  };
  // what came before this listener since `from`, from the ring (the same tick: nothing comes between)
  const { chunks, gap } = p.ring.from(from);
  for (const c of chunks) deliver(c);
  p.on('chunk', deliver);
  let letGo = (): void => {};
  const result = new Promise<ExecResult>((resolve, reject) => {
    // an attach let go of: no more output to this caller, the command runs on
    letGo = (): void => {
      p.off('chunk', deliver);
      p.off('exit', end);
      done();
      reject(new SnaplabError('ABORTED', `let go of command ${p.pid ?? '?'}; it runs on`));
    };
    const end = (): void => {
      p.off('chunk', deliver);
      done();
      // its reader has had the end: kept a little for a late look, not the full ten minutes (as a streamed exec's)
      p.keepMs = 30_000;
      if (!p.result) {
        reject(p.error);
        return;
      }
      resolve({
        ...p.result,
        stdout: Buffer.concat(kept.stdout.chunks),
        stderr: Buffer.concat(kept.stderr.chunks),
        // a ring that had let some go before the listener (not in one tick: never, but said if so)
        truncated: p.result.truncated || cut || gap !== null,
      });
    };
    if (p.ended) end();
    else p.once('exit', end);
  });
  result.catch(handledElsewhere);
  return {
    pid: h.pid,
    write: (b) => h.write(b),
    drained: () => h.drained(),
    end: () => h.end(),
    kill: (signal) => h.kill(signal),
    resize: (cols, rows) => h.resize(cols, rows),
    result,
    // holding output needs a connection of its own (detached), or an agent that holds one exec's
    ...(own || p.canHold ? { hold: (on: boolean) => p.hold(on) } : {}),
    disconnect: kill ?? ((): void => letGo()),
  };
}

/** The caller, once the call's options (as their JSON body has them) pass the route's schema. */
function checkedAs<T extends TSchema>(c: Caller, schema: T, o: Record<string, unknown>, what: string): Caller {
  checked(schema, defined(o), what);
  return c;
}

/** A call's options as their JSON body has them (what is undefined is not sent), for `checked`. */
function defined<T extends Record<string, unknown>>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}
