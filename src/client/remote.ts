/**
 * The remote library: `await Lab.connect({ url, token })` gives a RemoteLab with the same
 * interface as `Lab.open()` (src/sdk/api.ts), over the daemon's API. One-shot execs are one POST;
 * an exec with streaming callbacks, stdin or a terminal is a WebSocket (docs/api.md).
 */
import type { Readable, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type WebSocket from 'ws';
import { SnaplabError, type ErrorCode } from '../errors.js';
import type { CopyResult } from '../lab/io/copy.js';
import type { FileInfo } from '../lab/io/files.js';
import type { SandboxUsage } from '../lab/io/usage.js';
import { watchWith, type WatchEvent, type WatchHandle, type WatchOptions } from '../lab/io/watch.js';
import type { PoolSpec, PoolStats } from '../lab/pools/admin.js';
import type { RunOutcome, RunSpec } from '../lab/pools/run.js';
import type { ExecOptions, ExecResult } from '../lab/io/sandbox-ops.js';
import { feedInput } from '../lab/io/streams.js';
import { keyValues } from '../lab/io/exec.js';
import type {
  LabRestoreOptions,
  EgressRequest,
  EgressUsage,
  EgressView,
  BufferOutput,
  CheckResult,
  CountOptions,
  LabApi,
  LabCreateOptions,
  ListOptions,
  PoolApi,
  PoolTakes,
  ProcessApi,
  SandboxApi,
  SandboxCount,
  SnapshotApi,
  SpawnOptions,
  StoredTrace,
  TraceQuery,
  CallerInfo,
  KeptProcess,
  AttachOptions,
  AttachedProcess,
} from '../sdk/api.js';
import type { ProcessInfo } from '../server/processes.js';
import { encoded, type ExecText, type Text } from '../sdk/output.js';
import type { SandboxFiles } from '../sdk/sandbox.js';
import type { Limits, OnTimeout } from '../store/records.js';
import { collect, Http, type ConnectOptions } from './http.js';
import { Rpc } from './rpc.js';
import { handledElsewhere } from '../cleanup.js';
import { DEFAULT_ON_TIMEOUT, ON_TIMEOUT_ACTIONS } from '../defaults.js';

const MAX_COLLECTED = 16 * 1024 * 1024;
const enc = encodeURIComponent;

type View = Record<string, unknown> & {
  id: string;
  name: string;
  state: string;
  image: string;
  storage: string;
  driver: string;
  labels: Record<string, string>;
  metadata: Record<string, string>;
};

interface ResultView {
  exitCode: number;
  signal: number | null;
  timedOut: boolean;
  notFound: boolean;
  oomKilled: boolean;
  truncated: boolean;
  stdout: string;
  stderr: string;
  encoding: 'utf8' | 'base64';
  usage: ExecResult['usage'];
}

function toResult(r: ResultView): ExecResult {
  return { ...r, stdout: Buffer.from(r.stdout, r.encoding), stderr: Buffer.from(r.stderr, r.encoding) } as ExecResult;
}

export function envObject(env: ExecOptions['env']): Record<string, string> | undefined {
  return env === undefined || !Array.isArray(env) ? env : keyValues(env);
}

class RemoteSnapshot implements SnapshotApi {
  constructor(private readonly v: Record<string, unknown>) {}
  get name(): string {
    return this.v.name as string;
  }
  get id(): string {
    return this.v.id as string;
  }
  toJSON(): Record<string, unknown> {
    return this.v;
  }
}

export class RemoteSandbox implements SandboxApi {
  constructor(
    private readonly http: Http,
    private v: View,
    private readonly rpc: Rpc,
  ) {}

  get id(): string {
    return this.v.id;
  }
  get name(): string {
    return this.v.name;
  }
  get state(): string {
    return this.v.state;
  }
  get image(): string {
    return this.v.image;
  }
  get storage(): string {
    return this.v.storage;
  }
  get driver(): string {
    return this.v.driver;
  }
  get labels(): Record<string, string> {
    return this.v.labels;
  }
  get metadata(): Record<string, string> {
    return this.v.metadata;
  }
  get stopped(): boolean {
    return this.v.stopped === true;
  }
  get reason(): string | null {
    return (this.v.reason as string | null | undefined) ?? null;
  }
  get pool(): string | null {
    return (this.v.pool as string | null | undefined) ?? null;
  }
  get origin(): string | null {
    return (this.v.origin as string | null | undefined) ?? null;
  }
  get init(): 'agent' | 'systemd' {
    return this.v.init === 'systemd' ? 'systemd' : 'agent';
  }
  get createdAt(): number {
    return Date.parse(this.v.createdAt as string);
  }
  get expiresAt(): number | null {
    return typeof this.v.expiresAt === 'string' ? Date.parse(this.v.expiresAt) : null;
  }
  get hostRoot(): boolean {
    return this.v.hostRoot === true;
  }
  get owner(): string | null {
    return (this.v.owner as string | null | undefined) ?? null;
  }
  get timeoutS(): number {
    return (this.v.timeoutS as number | undefined) ?? 0;
  }
  get limits(): Limits {
    return (this.v.limits as Limits | undefined) ?? {};
  }
  get onTimeout(): OnTimeout {
    return ON_TIMEOUT_ACTIONS.find((a) => a === this.v.onTimeout) ?? DEFAULT_ON_TIMEOUT;
  }
  /** what the daemon said last: its lifetime (timeoutS, expiresAt), owner, limits */
  get info(): Readonly<View> {
    return this.v;
  }

  private path(rest = ''): string {
    return `/sandboxes/${enc(this.v.id)}${rest}`;
  }

  /** Fetch its state again. */
  async refresh(): Promise<this> {
    this.v = await this.http.json<View>('GET', this.path());
    return this;
  }

  /** Watch a directory of the machine: the watcher runs in it as a command of this connection's own (a WebSocket). */
  async watch(path: string, opts: WatchOptions, onEvent: (e: WatchEvent) => void): Promise<WatchHandle> {
    return watchWith((argv, o) => this.spawn(argv, o), path, opts, onEvent);
  }

  /** Its memory, CPU time, processes and disk now, as its daemon reads them. */
  async usage(): Promise<SandboxUsage> {
    return this.http.json<SandboxUsage>('GET', this.path('/usage'));
  }

  async exec(argv: string[], opts: ExecOptions & BufferOutput): Promise<ExecResult>;
  async exec(argv: string[], opts?: ExecOptions): Promise<ExecText>;
  async exec(argv: string[], opts: ExecOptions = {}): Promise<ExecResult | ExecText> {
    const r = await this.execBytes(argv, opts);
    return opts.encoding === 'buffer' ? r : (encoded(r, 'utf8') as ExecText);
  }

  private async execBytes(argv: string[], opts: ExecOptions): Promise<ExecResult> {
    const streamed =
      opts.onStdout ||
      opts.onStderr ||
      opts.tty ||
      opts.stdin === true ||
      (opts.stdin !== undefined && typeof opts.stdin !== 'string' && !Buffer.isBuffer(opts.stdin));
    if (streamed) return (await this.spawn(argv, { ...opts, encoding: 'buffer' })).result;
    const stdin = opts.stdin === undefined ? undefined : Buffer.from(opts.stdin as string | Buffer).toString('base64');
    const call = {
      argv,
      env: envObject(opts.env),
      cwd: opts.cwd,
      user: opts.user,
      timeoutMs: opts.timeoutMs ?? 0,
      ...(stdin ? { stdin } : {}),
    };
    // one request over HTTP when the caller may abort it (the daemon kills it when the request goes); else a call on the shared /rpc socket
    if (opts.signal)
      return toResult(
        await this.http.json<ResultView>('POST', this.path('/exec'), {
          json: { ...call, encoding: 'base64' },
          signal: opts.signal,
        }),
      );
    return toResult(await this.rpc.call<ResultView>({ op: 'exec', sandbox: this.v.id, ...call }));
  }

  /** Start argv over a WebSocket; the command is killed if the connection is lost (use `processes` to outlive it). */
  // every remote command has a connection of its own (its WebSocket): `detached` changes nothing
  async spawn(argv: string[], opts: SpawnOptions & BufferOutput): Promise<ProcessApi<ExecResult>>;
  async spawn(argv: string[], opts?: SpawnOptions): Promise<ProcessApi>;
  async spawn(argv: string[], opts: SpawnOptions = {}): Promise<ProcessApi<ExecResult> | ProcessApi> {
    const ws = await this.http.socket(this.path('/exec'));
    ws.send(
      JSON.stringify({
        type: 'start',
        argv,
        env: envObject(opts.env),
        cwd: opts.cwd,
        user: opts.user,
        timeoutMs: opts.timeoutMs ?? 0,
        tty: opts.tty,
        stdin: opts.stdin !== undefined,
        ...(opts.waitOutput ? { waitOutput: true } : {}),
        tag: opts.tag,
        // a kept command runs on when this connection goes (and when the daemon does)
        ...(opts.keep ? { keep: true, onDisconnect: 'keep' } : { onDisconnect: 'kill' }),
      }),
    );
    const proc = streamProcess(ws, opts);
    if (opts.stdin !== undefined && opts.stdin !== true) feedInput(proc, opts.stdin);
    if (opts.encoding === 'buffer') return proc;
    const result = proc.result.then((r) => encoded(r, 'utf8') as ExecText);
    result.catch(handledElsewhere); // a result nobody awaits must not end the caller's process
    return { ...proc, result } as ProcessApi;
  }

  /** GET /sandboxes/{id}/processes: the daemon's kept processes that run (a previous daemon's too) */
  async kept(): Promise<KeptProcess[]> {
    const all = await this.http.json<ProcessInfo[]>('GET', this.path('/processes'));
    return all
      .filter((p) => p.kept && p.state === 'running' && p.pid !== null)
      .map((p) => ({
        pid: p.pid!,
        tag: p.tag,
        tty: p.tty,
        stdin: p.stdin,
        held: false,
        startedAt: Date.parse(p.startedAt),
      }));
  }

  /** GET /sandboxes/{id}/processes/{process}/attach from its output's end: its output from now on */
  async attach(pid: number, opts: AttachOptions): Promise<AttachedProcess> {
    const all = await this.http.json<ProcessInfo[]>('GET', this.path('/processes'));
    const p = all.find((x) => x.kept && x.pid === pid && x.state === 'running');
    if (!p)
      throw new SnaplabError(
        'PROCESS_NOT_FOUND',
        `no kept command has pid ${pid} in sandbox ${this.name}`,
        'it has ended, or was not started with keep: list them with kept()',
      );
    const since = p.output.end;
    // the daemon speaks first (`attached`): listened to from before the socket opens
    let proc: ProcessApi<ExecResult> | undefined;
    await this.http.socket(this.path(`/processes/${enc(p.id)}/attach?offset=${since}`), (ws) => {
      proc = streamProcess(ws, opts);
    });
    return { ...proc!, since };
  }

  get files(): SandboxFiles {
    const q = (path: string, extra: Record<string, string | number | boolean | undefined> = {}): string =>
      `?${new URLSearchParams(
        Object.entries({ path, ...extra })
          .filter(([, v]) => v !== undefined)
          .map(([k, v]) => [k, String(v)] as [string, string]),
      ).toString()}`;
    return {
      stat: (path, o = {}) => this.http.json<FileInfo>('GET', this.path(`/files/stat${q(path, { user: o.user })}`)),
      list: (path, o = {}) =>
        this.http.json<FileInfo[]>('GET', this.path(`/files/list${q(path, { user: o.user, depth: o.depth })}`)),
      mkdir: async (path, o = {}) =>
        void (await this.http.json('POST', this.path('/files/mkdir'), {
          json: { path, parents: o.parents, user: o.user, owner: o.owner, mode: o.mode?.toString(8).padStart(4, '0') },
        })),
      move: async (from, to, o = {}) =>
        void (await this.http.json('POST', this.path('/files/move'), {
          json: { from, to, parents: o.parents, user: o.user, owner: o.owner },
        })),
      remove: async (path, o = {}) =>
        void (await this.http.json(
          'DELETE',
          this.path(`/files${q(path, { recursive: o.recursive, force: o.force, user: o.user })}`),
        )),
      write: async (path, data, o = {}) => {
        const body = typeof data === 'string' ? Buffer.from(data) : data;
        const query = q(path, {
          user: o.user,
          owner: o.owner,
          mode: o.mode?.toString(8).padStart(4, '0'),
          append: o.append,
          through: o.through,
        });
        // each extended attribute a repeated `xattr=NAME=VALUE`
        const xattrs = Object.entries(o.xattrs ?? {})
          .map(([k, v]) => `&xattr=${encodeURIComponent(`${k}=${v}`)}`)
          .join('');
        const r = await this.http.json<{ bytes: number }>('PUT', this.path(`/files${query}${xattrs}`), { body });
        return r.bytes;
      },
      read: async (path, o = {}) =>
        collect(await this.http.stream('GET', this.path(`/files${q(path, { user: o.user })}`))),
      readTo: async (path, sink, o = {}) => {
        const res = await this.http.stream('GET', this.path(`/files${q(path, { user: o.user })}`));
        let n = 0;
        res.on('data', (b: Buffer) => (n += b.length));
        await pipeline(res, sink);
        return n;
      },
    };
  }

  async putFile(path: string, data: Buffer | string, mode = 0o644): Promise<void> {
    await this.files.write(path, data, { mode });
  }

  getFile(path: string): Promise<Buffer> {
    return this.files.read(path);
  }

  upload(dest: string, tar: Readable): Promise<CopyResult> {
    return this.http.json<CopyResult>('PUT', this.path(`/archive?path=${enc(dest)}`), {
      body: tar,
      contentType: 'application/x-tar',
    });
  }

  async download(src: string, sink: Writable): Promise<CopyResult> {
    const res = await this.http.stream('GET', this.path(`/archive?path=${enc(src)}`));
    let bytes = 0;
    res.on('data', (b: Buffer) => (bytes += b.length));
    await pipeline(res, sink);
    return { bytes, warnings: [], complete: true };
  }

  async snapshot(name: string, opts: { memory?: boolean } = {}): Promise<SnapshotApi> {
    return new RemoteSnapshot(
      await this.http.json('POST', this.path('/snapshots'), {
        json: { name, ...(opts.memory ? { memory: true } : {}) },
      }),
    );
  }

  async setLabels(change: { labels?: Record<string, string>; metadata?: Record<string, string> }): Promise<void> {
    this.v = await this.http.json<View>('PATCH', this.path(), { json: change });
  }

  get egress(): EgressView | null {
    return (this.v.egress as EgressView | null | undefined) ?? null;
  }

  async setEgress(lists: EgressRequest): Promise<void> {
    this.v = await this.http.json<View>('PUT', this.path('/egress'), { json: lists });
  }

  async egressUsage(): Promise<EgressUsage> {
    return this.http.json<EgressUsage>('GET', this.path('/egress'));
  }

  /** A new timeout from now (0: none); `onTimeout` kill (default), pause or stop. */
  async setTimeout(timeoutS: number, onTimeout?: OnTimeout): Promise<void> {
    this.v = await this.http.json<View>('POST', this.path('/timeout'), {
      json: { timeoutS, ...(onTimeout ? { onTimeout } : {}) },
    });
  }

  // the daemon keeps the traces (GET /traces): none is returned here
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

  /** POST /sandboxes/{id}/VERB: the daemon answers with the sandbox as it is now. */
  private async change(verb: 'pause' | 'resume' | 'stop' | 'start'): Promise<undefined> {
    this.v = await this.http.json<View>('POST', this.path(`/${verb}`));
    return undefined;
  }

  async destroy(): Promise<undefined> {
    await this.http.json('DELETE', this.path());
    this.v = { ...this.v, state: 'dead', reason: 'destroyed' };
    return undefined;
  }

  close(): void {}

  async [Symbol.asyncDispose](): Promise<void> {
    await this.destroy().catch((e) => {
      if (!(e instanceof SnaplabError && e.code === 'SANDBOX_NOT_FOUND')) throw e;
    });
  }

  toJSON(): Record<string, unknown> {
    return this.v;
  }
}

/** The client half of a streamed exec (frames: docs/api.md). */
function streamProcess(ws: WebSocket, opts: ExecOptions): ProcessApi<ExecResult> {
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  const collected = [0, 0];
  let truncated = false;
  const keep = (into: Buffer[], i: number, b: Buffer): void => {
    const room = MAX_COLLECTED - collected[i]!;
    if (room <= 0) return void (truncated = true);
    into.push(room < b.length ? b.subarray(0, room) : b);
    if (room < b.length) truncated = true;
    collected[i]! += Math.min(room, b.length);
  };
  let resolvePid!: (n: number) => void;
  let rejectPid!: (e: Error) => void;
  const pid = new Promise<number>((res, rej) => {
    resolvePid = res;
    rejectPid = rej;
  });
  pid.catch(handledElsewhere);
  let aborted = false;
  const result = new Promise<ExecResult>((resolve, reject) => {
    let ended = false;
    ws.on('message', (data: Buffer, isBinary) => {
      if (isBinary) {
        const b = data.subarray(1);
        if (data[0] === 1) opts.onStdout ? opts.onStdout(b) : keep(out, 0, b);
        else opts.onStderr ? opts.onStderr(b) : keep(err, 1, b);
        return;
      }
      const m = JSON.parse(String(data)) as {
        type: string;
        pid?: number;
        result?: Omit<ExecResult, 'stdout' | 'stderr'>;
        error?: { code: ErrorCode; message: string; hint?: string };
      };
      if (m.type === 'started' || m.type === 'attached') {
        resolvePid(m.pid ?? 0);
      } else if (m.type === 'gap') {
        truncated = true; // output the daemon could no longer give (it is said, never silently missing)
      } else if (m.type === 'error' && !(m as { fatal?: boolean }).fatal) {
        // a refused control message (a bad signal, input without stdin): the command runs on
      } else if (m.type === 'exit' || m.type === 'error') {
        ended = true;
        if (aborted) reject(new SnaplabError('ABORTED', 'the exec was aborted', 'its command was killed'));
        else if (m.result)
          resolve({
            ...m.result,
            stdout: Buffer.concat(out),
            stderr: Buffer.concat(err),
            truncated: truncated || m.result.truncated,
          });
        else {
          const e = new SnaplabError(
            m.error?.code ?? 'DAEMON_ERROR',
            m.error?.message ?? 'the command was lost',
            m.error?.hint,
          );
          rejectPid(e);
          reject(e);
        }
      }
    });
    ws.on('close', () => {
      if (ended) return;
      const e = new SnaplabError(
        'DAEMON_UNREACHABLE',
        'the connection to the daemon closed before the command ended',
        'the command was killed with it; use background processes to outlive a connection',
      );
      rejectPid(e);
      reject(e);
    });
    ws.on('error', () => {});
  });
  result.catch(handledElsewhere).finally(() => ws.close());
  // as the embedded library: an aborted exec is killed and rejects with ABORTED
  opts.signal?.addEventListener(
    'abort',
    () => {
      aborted = true;
      if (ws.readyState === ws.OPEN) ws.send(JSON.stringify({ type: 'signal', signal: 9 }));
    },
    { once: true },
  );
  return handle(ws, pid, result);
}

/** What the caller holds of a streamed command: its input, signals, terminal size and socket. */
function handle(ws: WebSocket, pid: Promise<number>, result: Promise<ExecResult>): ProcessApi<ExecResult> {
  const sendJson = (m: unknown): void => {
    if (ws.readyState === ws.OPEN) ws.send(JSON.stringify(m));
  };
  return {
    pid,
    result,
    write: (b) => {
      if (ws.readyState !== ws.OPEN) return true;
      ws.send(Buffer.from(b));
      return ws.bufferedAmount < 4 << 20;
    },
    drained: () => drained(ws),
    end: () => sendJson({ type: 'eof' }),
    kill: (signal) => sendJson({ type: 'signal', signal }),
    resize: (cols, rows) => sendJson({ type: 'resize', cols, rows }),
    // its output held at the socket: the daemon's sends wait in TCP's buffers, then the daemon's own
    hold: (on) => (on ? ws.pause() : ws.resume()),
    disconnect: () => ws.close(),
  };
}

/** Resolves once the socket holds less than 2 MiB unsent (or is closed): stdin's flow control. */
function drained(ws: WebSocket): Promise<void> {
  return new Promise<void>((resolve) => {
    const t = setInterval(() => {
      if (ws.readyState !== ws.OPEN || ws.bufferedAmount < 2 << 20) {
        clearInterval(t);
        resolve();
      }
    }, 5);
  });
}

class RemotePool implements PoolApi {
  constructor(
    private readonly http: Http,
    readonly name: string,
    private readonly rpc: Rpc,
  ) {}

  stats(): Promise<PoolStats> {
    return this.http.json('GET', `/pools/${enc(this.name)}`);
  }

  async run(argv: string[], spec: RunSpec & BufferOutput): Promise<RunOutcome>;
  async run(argv: string[], spec?: RunSpec): Promise<Text<RunOutcome>>;
  async run(argv: string[], spec: RunSpec = {}): Promise<RunOutcome | Text<RunOutcome>> {
    if (
      spec.put?.length ||
      spec.onStdout ||
      spec.onStderr ||
      (spec.stdin !== undefined && typeof spec.stdin !== 'string' && !Buffer.isBuffer(spec.stdin))
    ) {
      throw new SnaplabError(
        'BAD_INPUT',
        'a remote pool run takes argv, env, cwd, user, timeoutMs and stdin as data',
        'take a sandbox (pool.take()) to stream or copy files',
      );
    }
    const stdin = spec.stdin === undefined ? undefined : Buffer.from(spec.stdin as string | Buffer).toString('base64');
    const call = {
      argv,
      env: envObject(spec.env),
      cwd: spec.cwd,
      user: spec.user,
      timeoutMs: spec.timeoutMs ?? 0,
      ...(stdin ? { stdin } : {}),
    };
    type Ran = ResultView & { sandbox: string; hit: boolean; recycled: boolean };
    const r = spec.signal
      ? await this.http.json<Ran>('POST', `/pools/${enc(this.name)}/run`, {
          json: { ...call, encoding: 'base64' },
          signal: spec.signal,
        })
      : await this.rpc.call<Ran>({ op: 'run', pool: this.name, ...call });
    return encoded({ ...toResult(r), sandbox: r.sandbox, hit: r.hit, recycled: r.recycled, dirt: [] }, spec.encoding);
  }

  async take(): Promise<SandboxApi> {
    return new RemoteSandbox(
      this.http,
      await this.http.json<View>('POST', '/sandboxes', { json: { pool: this.name, timeoutS: 0 } }),
      this.rpc,
    );
  }

  async resize(size: number): Promise<void> {
    await waitOperation(this.http, await this.http.json('PATCH', `/pools/${enc(this.name)}`, { json: { size } }));
  }

  async remove(): Promise<number> {
    return (await this.http.json<{ removed: number }>('DELETE', `/pools/${enc(this.name)}`)).removed;
  }

  takes(from: { after?: number; since?: number } = {}): Promise<PoolTakes> {
    const q = new URLSearchParams(
      Object.entries(from)
        .filter(([, v]) => v !== undefined)
        .map(([k, v]) => [k, String(v)] as [string, string]),
    ).toString();
    return this.http.json('GET', `/pools/${enc(this.name)}/takes${q ? `?${q}` : ''}`);
  }
}

/** Wait for a long operation's end; its result, or its error thrown. */
export async function waitOperation<T>(http: Http, op: { id: string }): Promise<T> {
  for (;;) {
    const v = await http.json<{
      state: string;
      result: T;
      error: { code: ErrorCode; message: string; hint?: string } | null;
    }>('GET', `/operations/${enc(op.id)}?wait=30`);
    if (v.state === 'done') return v.result;
    if (v.state === 'failed')
      throw new SnaplabError(
        v.error?.code ?? 'DAEMON_ERROR',
        v.error?.message ?? 'the operation failed',
        v.error?.hint,
      );
  }
}

export interface RemoteCreateOptions extends LabCreateOptions {
  /** through a cluster's gateway: only nodes with these labels (docs/cluster.md); a single daemon refuses it */
  placement?: { labels: Record<string, string> };
}

export class RemoteLab implements LabApi {
  private readonly http: Http;
  private readonly rpc: Rpc;

  constructor(opts: ConnectOptions = {}) {
    const url = opts.url ?? process.env.SNAPLAB_HOST;
    if (!url)
      throw new SnaplabError(
        'BAD_INPUT',
        'no daemon URL given',
        'pass { url } or set SNAPLAB_HOST (http://HOST:PORT or unix:/path/to/daemon.sock)',
      );
    this.http = new Http(url, opts.token ?? process.env.SNAPLAB_TOKEN, opts);
    this.rpc = new Rpc(this.http);
  }

  get url(): string {
    return this.http.url;
  }

  /** @internal the transport, for the CLI and bench */
  get transport(): Http {
    return this.http;
  }

  /** @internal a sandbox over this connection from a view given elsewhere (a gateway adds its node) */
  sandboxOf(view: Record<string, unknown>): RemoteSandbox {
    return new RemoteSandbox(this.http, view as View, this.rpc);
  }

  async health(): Promise<{ ok: boolean; version: string; pid: number }> {
    return this.http.json('GET', '/healthz');
  }

  async create(opts: RemoteCreateOptions = {}): Promise<RemoteSandbox> {
    return new RemoteSandbox(this.http, await this.http.json<View>('POST', '/sandboxes', { json: opts }), this.rpc);
  }

  async restore(snapshot: string, opts: LabRestoreOptions = {}): Promise<RemoteSandbox> {
    return new RemoteSandbox(
      this.http,
      await this.http.json<View>('POST', '/sandboxes', { json: { snapshot, ...opts } }),
      this.rpc,
    );
  }

  // the daemon checks records against its host as it sees fit: `check` is its to decide
  async get(idOrName: string, _opts: { check?: boolean } = {}): Promise<RemoteSandbox> {
    return new RemoteSandbox(this.http, await this.http.json<View>('GET', `/sandboxes/${enc(idOrName)}`), this.rpc);
  }

  async list(opts: ListOptions = {}): Promise<RemoteSandbox[]> {
    const q = new URLSearchParams([
      ...filterQuery(opts),
      ...(opts.check === false ? [['check', 'false'] as [string, string]] : []),
      ...(opts.limit !== undefined ? [['limit', String(opts.limit)] as [string, string]] : []),
      ...(opts.after !== undefined ? [['after', opts.after] as [string, string]] : []),
      ...(opts.order !== undefined ? [['order', opts.order] as [string, string]] : []),
    ]).toString();
    return (await this.http.json<View[]>('GET', `/sandboxes${q ? `?${q}` : ''}`)).map(
      (v) => new RemoteSandbox(this.http, v, this.rpc),
    );
  }

  async count(opts: CountOptions = {}): Promise<SandboxCount> {
    const q = new URLSearchParams([
      ...filterQuery(opts),
      ...(opts.check === false ? [['check', 'false'] as [string, string]] : []),
    ]).toString();
    return this.http.json<SandboxCount>('GET', `/counts/sandboxes${q ? `?${q}` : ''}`);
  }

  async snapshots(): Promise<SnapshotApi[]> {
    return (await this.http.json<Record<string, unknown>[]>('GET', '/snapshots')).map((v) => new RemoteSnapshot(v));
  }

  async snapshot(name: string): Promise<SnapshotApi> {
    return new RemoteSnapshot(await this.http.json('GET', `/snapshots/${enc(name)}`));
  }

  async removeSnapshot(name: string): Promise<void> {
    await this.http.json('DELETE', `/snapshots/${enc(name)}`);
  }

  async createPool(spec: PoolSpec): Promise<PoolApi> {
    await waitOperation(this.http, await this.http.json('POST', '/pools', { json: spec }));
    return this.pool(spec.name);
  }

  pool(name: string): PoolApi {
    return new RemotePool(this.http, name, this.rpc);
  }

  pools(): Promise<PoolStats[]> {
    return this.http.json('GET', '/pools');
  }

  whoami(): Promise<CallerInfo> {
    return this.http.json('GET', '/whoami');
  }

  /** Raise a scenario file that is on the daemon's host; resolves with its status when it is up. */
  async up(file: string, opts: { name?: string; driver?: string } = {}): Promise<Record<string, unknown>> {
    return waitOperation(this.http, await this.http.json('POST', '/scenarios', { json: { file, ...opts } }));
  }

  /** A check pass on the daemon's lab (needs the admin scope). */
  check(): Promise<CheckResult> {
    return this.http.json('POST', '/check');
  }

  /** Stored traces, newest first (a number: the limit); a key without admin sees its own sandboxes' only. */
  traces(query: TraceQuery | number = {}): Promise<StoredTrace[]> {
    const q = typeof query === 'number' ? { limit: query } : query;
    const params = new URLSearchParams([
      ['limit', String(q.limit ?? 20)],
      ...(q.targets ?? []).map((t) => ['target', t] as [string, string]),
    ]);
    // no target at all: none asked for (a target none has gives nothing)
    if (q.targets?.length === 0) return Promise.resolve([]);
    return this.http.json('GET', `/traces?${params.toString()}`);
  }

  async trace(operationId: string): Promise<StoredTrace | undefined> {
    return this.http.json<StoredTrace>('GET', `/traces/${enc(operationId)}`).catch((e: unknown) => {
      if (e instanceof SnaplabError && e.code === 'OPERATION_NOT_FOUND') return undefined;
      throw e;
    });
  }

  close(): void {
    this.rpc.close();
    this.http.close();
  }
}

/** A list's filters as GET /sandboxes (and GET /counts/sandboxes) take them. */
function filterQuery(opts: CountOptions): [string, string][] {
  return [
    ...Object.entries(opts.labels ?? {}).map(([k, v]) => ['label', `${k}=${v}`] as [string, string]),
    // (no key is named "": the empty owner asks for those made without one)
    ...(opts.owner !== undefined ? [['owner', opts.owner ?? ''] as [string, string]] : []),
    ...(opts.metadata !== undefined ? [['metadata', JSON.stringify(opts.metadata)] as [string, string]] : []),
    ...(opts.state !== undefined ? [['state', opts.state.join(',')] as [string, string]] : []),
    ...(opts.createdSince !== undefined ? [['createdSince', String(opts.createdSince)] as [string, string]] : []),
  ];
}
