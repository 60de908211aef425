/**
 * The interface the embedded library (Lab.open) and the remote one (Lab.connect) both implement:
 * code written against these types runs either way. The contract suite (test/contract.test.ts)
 * runs the same tests on both.
 */
import type { Readable, Writable } from 'node:stream';
import type { ExecOptions, ExecProcess, ExecResult } from '../lab/io/sandbox-ops.js';
import type { CopyResult } from '../lab/io/copy.js';
import type { PoolSpec, PoolStats } from '../lab/pools/admin.js';
import type { RunOutcome, RunSpec } from '../lab/pools/run.js';
import type { Limits, OnTimeout, SandboxCount } from '../store/records.js';
import type { StorageKind } from '../storage/backend.js';
import type { FileInfo } from '../lab/io/files.js';
import type { SandboxUsage } from '../lab/io/usage.js';
import type { WatchEvent, WatchHandle, WatchOptions } from '../lab/io/watch.js';

export type { OnTimeout, SandboxUsage, WatchEvent, WatchHandle, WatchOptions };
import type { ExecText, Text } from './output.js';
import type { TraceSummary } from '../timing/trace.js';
import type { Ceilings } from '../lab/ceilings.js';

/**
 * Who a lab acts for (`whoami`; a daemon's GET /whoami): its key ('local': the embedded lab and a
 * daemon's Unix socket, every scope, no quota, no ceiling), scopes, quotas and ceilings.
 */
export interface CallerInfo {
  key: string;
  scopes: string[];
  maxSandboxes: number | null;
  maxExecs: number | null;
  /**
   * a daemon's and the embedded lab's: all, the defaults filled in; a cluster gateway's: those
   * the key was made with (each node holds it to its own defaults for the others)
   */
  ceilings: Partial<Ceilings>;
}

/**
 * `sandbox.files`: the same calls on an embedded and on a remote sandbox. Each runs inside as
 * `user` (default root); `owner` (USER[:GROUP], the machine's names or numbers) gives what a write,
 * mkdir or move makes (the file, the directories) to that user, as envd does acting for one.
 */
export interface SandboxFiles {
  stat(path: string, opts?: { follow?: boolean; user?: string }): Promise<FileInfo>;
  /** sorted by name; `depth` N > 1: N levels, a directory's entries right after it (never through a link) */
  list(path: string, opts?: { depth?: number; user?: string }): Promise<FileInfo[]>;
  mkdir(path: string, opts?: { parents?: boolean; mode?: number; user?: string; owner?: string }): Promise<void>;
  remove(path: string, opts?: { recursive?: boolean; force?: boolean; user?: string }): Promise<void>;
  /**
   * rename(2): a file onto a directory, a directory onto a non-empty one, or across filesystems
   * fail (FILE_ERROR); `parents`: the missing directories of `to` made first
   */
  move(from: string, to: string, opts?: { parents?: boolean; user?: string; owner?: string }): Promise<void>;
  /**
   * returns the bytes written. `size`: the bytes a stream will carry, when known: fewer, and the
   * file is left as it was. `xattrs`: `user.*` extended attributes the file lands with (a write
   * makes a new file, so these are all it has; with `append`, they are added to its own);
   * `stat` and `list` report them. A file replaced keeps its owner (where the caller may give it)
   * and, without `mode`, its permission bits. `through`: a link at `path` is written through (the
   * file it ends at is replaced, or made), as an open of it would; by default the link is replaced
   */
  write(
    path: string,
    data: Buffer | string | Readable,
    opts?: {
      mode?: number;
      append?: boolean;
      user?: string;
      owner?: string;
      through?: boolean;
      size?: number;
      xattrs?: Record<string, string>;
    },
  ): Promise<number>;
  read(path: string, opts?: { user?: string }): Promise<Buffer>;
  /** stream into `sink` (ended after); returns the bytes read */
  readTo(path: string, sink: Writable, opts?: { user?: string }): Promise<number>;
}

/**
 * A started command (as `spawn` returns); its result's output is text, or Buffers with `encoding: 'buffer'`.
 * `hold` and `disconnect` are there when it has a connection of its own (`detached: true`; every
 * remote spawn has one, its WebSocket); `hold` also on a shared connection to a namespace machine's
 * agent, which holds one command's output (HOLD_OUTPUT) while the others go on (a VM's relay too, from protocol 1.7).
 */
export type ProcessApi<R = ExecText> = Omit<ExecProcess, 'result'> & {
  result: Promise<R>;
  /** hold its output at its source (true) until released (false): a slow reader holds this command's output, no one else's */
  hold?: (on: boolean) => void;
  /** let go of its connection now (what it ran is ended with it) */
  disconnect?: () => void;
};

/** What `spawn` takes: an exec's options, and whether the command gets a connection of its own. */
export type SpawnOptions = ExecOptions & {
  /**
   * a connection of its own to the machine, closed when it ends: its output can be held (`hold`)
   * without holding anyone else's, as a server does for a client that reads slowly. Default false
   */
  detached?: boolean;
  /**
   * the command outlives the connection that started it (this process, a daemon that restarts):
   * the machine's agent lets it run on, lists it (`kept()`) and lets a later caller take it on
   * (`attach(pid)`), in a VM too (its relay lets it go when its client leaves). An agent too old
   * to keep one (before 1.5; a VM's before 1.6): AGENT_PROTOCOL. Default false: a command ends
   * with its connection
   */
  keep?: boolean;
  /**
   * a kept command's words about itself, given back by `kept()`: at most 4093 bytes of UTF-8
   * (through a daemon, 1024 characters, and what a daemon keeps beside it, its id and argv, must
   * fit the same 4 KiB once written as JSON: else BAD_INPUT)
   */
  tag?: string;
  /**
   * the result waits for the end of the command's output, not only its process: what it left
   * running in the background and still writes to its stdout or stderr is read until that closes
   * them (Go's exec, and E2B's envd, wait so: `sh -c '(sleep 1; echo late) &'` ends with `late`).
   * A timeout or a kill with SIGKILL or SIGTERM stops the wait (so does the caller's going, unless
   * the command is kept: it waits on, and `kept()` lists it until its output ends); a terminal's
   * command ends with its process; so does one on a machine whose agent is older than protocol
   * 1.8. Default false
   */
  waitOutput?: boolean;
};

/** A command started with `keep` that still runs (`kept()`). */
export interface KeptProcess {
  /** its pid as the machine sees it: what `attach` takes */
  pid: number;
  /** what `spawn` was given as `tag`, or null */
  tag: string | null;
  tty: boolean;
  /** it has a stdin pipe (`write`, `end`) */
  stdin: boolean;
  /**
   * someone holds it (its output goes to them): `attach` is refused (PROCESS_BUSY) until they let
   * go. A daemon's processes are never held: any number of its callers read one at once
   */
  held: boolean;
  /** when it started, ms since the epoch (as the machine's agent counts its age) */
  startedAt: number;
}

/** A kept command taken on (`attach`). */
export type AttachedProcess = ProcessApi<ExecResult> & {
  /**
   * bytes of output (stdout and stderr together) the command had written before this attach,
   * read by its earlier holders or dropped while nobody held it: this handle's output starts there
   */
  since: number;
};

/**
 * What `attach` takes: where the output goes from now on (an attach is on a connection of its own,
 * so that letting go of it, `disconnect`, leaves the command running and holds no one else's).
 */
export type AttachOptions = Pick<ExecOptions, 'onStdout' | 'onStderr' | 'signal'>;

export type BufferOutput = { encoding: 'buffer' };

export interface SnapshotApi {
  readonly name: string;
  readonly id: string;
  /** the snapshot operation's trace, when this object came from taking it here */
  readonly lastTrace?: TraceSummary;
  toJSON(): Record<string, unknown>;
}

export interface SandboxApi {
  readonly id: string;
  readonly name: string;
  readonly state: string;
  readonly image: string;
  readonly storage: string;
  readonly driver: string;
  readonly labels: Record<string, string>;
  readonly metadata: Record<string, string>;
  /** the pool it stands by in (a standby, nobody's yet), or null: any other, one taken from a pool included */
  readonly pool: string | null;
  /** stopped (`stop`): its state is dead, its filesystem kept, and `start` raises it again */
  readonly stopped: boolean;
  /** why it is in its state (a dead one's cause), or null */
  readonly reason: string | null;
  /** the snapshot it was restored from, or null */
  readonly origin: string | null;
  readonly init: 'agent' | 'systemd';
  /** when it was made (ms since the epoch) */
  readonly createdAt: number;
  /** when its timeout ends it (ms since the epoch), or null: none, or its clock stands still while paused */
  readonly expiresAt: number | null;
  /** the API key that made it through a daemon ('local': the Unix socket), or null */
  readonly owner: string | null;
  /** its timeout in seconds (0: none) and what the timeout's end does (kill, pause or stop) */
  readonly timeoutS: number;
  readonly onTimeout: OnTimeout;
  /** what it may use: memory, pids, CPUs, disk (those it was made with) */
  readonly limits: Limits;
  /** root inside is root on the host (no user namespace): said in `ls` and warned about */
  readonly hostRoot: boolean;
  /** its outbound network, or null: loopback only */
  readonly egress: EgressView | null;
  /** the trace of the operation that produced this object (create or restore), when it was made here */
  readonly lastTrace?: TraceSummary;
  readonly files: SandboxFiles;
  exec(argv: string[], opts: ExecOptions & BufferOutput): Promise<ExecResult>;
  exec(argv: string[], opts?: ExecOptions): Promise<ExecText>;
  spawn(argv: string[], opts: SpawnOptions & BufferOutput): Promise<ProcessApi<ExecResult>>;
  spawn(argv: string[], opts?: SpawnOptions): Promise<ProcessApi>;
  /** the commands started with `keep: true` that still run, oldest first */
  kept(): Promise<KeptProcess[]>;
  /**
   * Take on a kept command (`kept()`) as if it had started here: its output from now on (what it
   * wrote while nobody held it is gone), its input, signals and end. PROCESS_NOT_FOUND when no
   * kept command has that pid (it ended), PROCESS_BUSY when someone else holds it
   */
  attach(pid: number, opts: AttachOptions): Promise<AttachedProcess>;
  putFile(path: string, data: Buffer | string, mode?: number): Promise<void>;
  getFile(path: string): Promise<Buffer>;
  upload(dest: string, tar: Readable): Promise<CopyResult>;
  download(src: string, sink: Writable): Promise<CopyResult>;
  snapshot(name: string, opts?: { memory?: boolean }): Promise<SnapshotApi>;
  setLabels(change: { labels?: Record<string, string>; metadata?: Record<string, string> }): Promise<void>;
  /**
   * A new timeout from now (0: none) and what its end does; the clock runs while the sandbox runs.
   * A daemon keeps the clock: the embedded lab refuses a timeout.
   */
  setTimeout(timeoutS: number, onTimeout?: OnTimeout): Promise<void>;
  /** replace its egress lists (new connections meet them at once); EGRESS_OFF when it has none */
  setEgress(lists: EgressRequest): Promise<void>;
  /** its egress with its counters; EGRESS_OFF when it has none */
  egressUsage(): Promise<EgressUsage>;
  /**
   * Watch a directory of the machine (inotify inside it): `onEvent` is told each change under it,
   * named relative to it, as it happens. Resolves once the watch holds; `close()` ends it.
   */
  watch(path: string, opts: WatchOptions, onEvent: (e: WatchEvent) => void): Promise<WatchHandle>;
  /** its memory, CPU time, processes and disk now, and the CPUs, memory and disk it may use */
  usage(): Promise<SandboxUsage>;
  /** read its state, reason, labels and lifetime again (another process may have paused, resumed or ended it) */
  refresh(): Promise<this>;
  /** each resolves with the operation's trace where the lab has it here (the embedded one), else undefined */
  pause(): Promise<TraceSummary | undefined>;
  resume(): Promise<TraceSummary | undefined>;
  /**
   * Halt every process and keep its filesystem, user namespace range and network address (a system
   * machine halts cleanly); SANDBOX_STOPPED when it is stopped already
   */
  stop(): Promise<TraceSummary | undefined>;
  /**
   * Raise a stopped machine again on its own volume under the same id: a fresh boot (new processes,
   * a new PID 1), the files it had. SANDBOX_RUNNING when it runs or is paused; a start that fails
   * removes what it made and leaves it stopped
   */
  start(): Promise<TraceSummary | undefined>;
  destroy(): Promise<TraceSummary | undefined>;
  close(): void;
  toJSON(): Record<string, unknown>;
}

export interface PoolApi {
  readonly name: string;
  stats(): Promise<PoolStats>;
  run(argv: string[], spec: RunSpec & BufferOutput): Promise<RunOutcome>;
  run(argv: string[], spec?: RunSpec): Promise<Text<RunOutcome>>;
  take(): Promise<SandboxApi>;
  resize(size: number): Promise<void>;
  remove(): Promise<number>;
  /**
   * Its takes (a pool run's take phase, or a take for good), from the stored traces: those stored
   * after the cursor `after` (a former answer's `next`), else those that started in the last
   * `since` ms (default 60 000). `now` is the lab's clock, which the times are on.
   */
  takes(from?: { after?: number; since?: number }): Promise<PoolTakes>;
}

export interface PoolTake {
  /** the trace's id */
  id: string;
  at: number;
  kind: string;
  /** how long the take took, or null when its trace does not say */
  ms: number | null;
  hit: boolean;
}

export interface PoolTakes {
  now: number;
  next: number;
  takes: PoolTake[];
}

/**
 * Metadata keys a front keeps for its own work, by prefix: the E2B front's `e2b.` (a sandbox's
 * template, envVars, network and autoResume; docs/e2b.md). A `setLabels` that replaces the metadata
 * keeps those it does not name, so that a caller of another front (the daemon's `PATCH
 * /sandboxes/{id}`) cannot unmake what that front needs to serve the sandbox.
 */
export const FRONT_METADATA_PREFIXES = { e2b: 'e2b.' } as const;

/** Which sandboxes `list` gives, and how it reads them. */
export interface ListOptions {
  /** only those with every key=value given */
  labels?: Record<string, string>;
  /** only those this API key made through a daemon; null: those made without one */
  owner?: string | null;
  /**
   * false: the records as they stand, without asking the host whether their processes still live
   * (cheap enough for a server to read every second); default true
   */
  check?: boolean;
  /**
   * at most this many, oldest first (by creation time, then id): a page. Only the page is checked
   * against the host, so a page costs the same with 10 or 10 000 sandboxes (sdk/paging.ts)
   */
  limit?: number;
  /** the page after this cursor: `listCursor(last)` of the page before (a daemon's X-Next-Cursor) */
  after?: string;
  /**
   * only those whose metadata has, for every key given, this value or one of these values (null
   * among them: or no such key). Keys and values are compared as they are
   */
  metadata?: Record<string, string | readonly (string | null)[]>;
  /**
   * only those in one of these states, as recorded (ListState: a stopped one is `stopped`, not
   * `dead`); [] gives none. With `check` the host may then find one dead: it is listed so
   */
  state?: readonly ListState[];
  /** only those made at or after this time (ms since the epoch) */
  createdSince?: number;
  /** `desc`: newest first, and `after` pages toward older ones; default `asc`, oldest first */
  order?: 'asc' | 'desc';
}

/**
 * What a count filters by: a list's filters (ListOptions), without its page. `check` (default
 * true): the records are first brought up to date with the host, as cheaply as a daemon's quick
 * check pass does (a machine whose process is gone is found dead; a reused pid or a zombie is
 * the full check's to see), and then counted, so a `state` filter counts by the state found; a
 * checked list filters by the recorded state and shows the one it finds. false: as they stand.
 */
export type CountOptions = Pick<ListOptions, 'labels' | 'owner' | 'metadata' | 'state' | 'createdSince' | 'check'>;

export type { SandboxCount };

/**
 * A sandbox's state as a list filters it: its `state`, except that one stopped (`stop`: dead, its
 * filesystem kept, `start` raises it again) is `stopped`, and `dead` is every other dead one.
 */
export type ListState = 'creating' | 'running' | 'paused' | 'stopped' | 'dead' | 'removing';

/** A stored operation's trace, with what it recorded (a gc's removals, a take's hit). */
export type StoredTrace = TraceSummary & { details: unknown };

export interface TraceQuery {
  /** at most this many, newest first (default 20) */
  limit?: number;
  /** only those of these targets (sandbox, scenario or pool names and ids); [] gives none */
  targets?: string[];
}

/** What a check pass found: the sandboxes an interrupted create left, which it removed. */
export interface CheckResult {
  removed: { id: string; name: string; reason: string | null; owner: string | null }[];
}

/** A restore's options: a name, limits (the snapshot's disk cap is carried unless another is given), labels. */
export interface LabRestoreOptions {
  name?: string;
  limits?: Limits;
  labels?: Record<string, string>;
  metadata?: Record<string, string>;
  /** as in LabCreateOptions */
  userns?: boolean;
  /** as in LabCreateOptions; default: the size of the snapshot's sandbox */
  ids?: number;
  /** as in LabCreateOptions (a daemon keeps the clock) */
  timeoutS?: number;
  onTimeout?: OnTimeout;
  /** as in LabCreateOptions (a snapshot carries none: default loopback only) */
  egress?: boolean | EgressRequest;
}

export interface LabCreateOptions {
  /**
   * image name; `busybox` is built in, and the built-in templates (`base`, `code-interpreter-v1`:
   * Debian images shaped as E2B's) are built on first use
   */
  image?: string;
  /**
   * the steps of an image built for this create (a built-in template on first use); the embedded
   * lab tells them, a daemon's create does not (the build runs on the daemon, the create waits)
   */
  onProgress?: (step: string) => void;
  name?: string;
  storage?: StorageKind;
  driver?: string;
  limits?: Limits;
  /**
   * false: no user namespace, root inside is root on the host (with the capability set and the
   * seccomp filter only). Default: a user namespace of its own wherever driver and storage allow
   */
  userns?: boolean;
  /**
   * ids its user namespace maps (0..ids-1 inside): a power of two from 1024 to 65536. Smaller
   * ranges let more sandboxes share the host's uids; a file owned on disk by an id ≥ ids shows as
   * nobody (65534) inside and cannot be chowned there. Refused for a system machine and where
   * there is no user namespace. Default 65536
   */
  ids?: number;
  /**
   * 'systemd': a system machine: the image's own systemd is PID 1 (the agent runs beside it), and
   * create returns once `systemctl is-system-running` says running or degraded. On namespaces it
   * needs a user namespace; on qemu the guest's systemd starts the agent as a unit. An image
   * without systemd is refused (BAD_INPUT). Default: 'systemd' for an image whose /sbin/init is
   * systemd (found at build or import: `image inspect` shows it), else 'agent' (the agent is PID 1).
   */
  init?: 'agent' | 'systemd';
  /** labels to select it by (`list({ labels })`) and free metadata, both string to string */
  labels?: Record<string, string>;
  metadata?: Record<string, string>;
  /**
   * take a ready standby of this pool instead of making one (it comes with the pool's image,
   * storage, driver and limits: give none of those, nor a name)
   */
  pool?: string;
  /**
   * a lifetime in seconds (0: none; through a daemon, default its --default-timeout, 300) and what
   * its end does: kill (destroy, the default), pause (freeze it with its memory: `resume` thaws
   * its processes) or stop (end its processes and keep its files: `start` boots it afresh on them).
   * A paused or stopped sandbox's clock stands still until a resume or a start.
   * A daemon keeps the clock; the embedded lab refuses a timeout (nothing of it runs to end one).
   */
  timeoutS?: number;
  onTimeout?: OnTimeout;
  /**
   * outbound network (docs/egress.md): true, or lists of IPv4 addresses and prefixes that it may
   * (`allow`: then only those) and may not (`deny`, which wins) reach. The host, private and
   * link-local networks are denied unless allowed by name. Default: none (loopback only)
   */
  egress?: boolean | EgressRequest;
}

/** What a machine may reach out to: IPv4 addresses or prefixes (deny wins over allow). */
export interface EgressRequest {
  allow?: string[];
  deny?: string[];
}

/** A machine's egress as it stands: its address, its lists, and (from `egressUsage`) its counters. */
export interface EgressView {
  address: string;
  allow: string[];
  deny: string[];
}

export interface EgressUsage extends EgressView {
  /** bytes sent out, connections let through, packets refused */
  bytesOut: number;
  connections: number;
  denied: number;
}

/**
 * What a front that stands on one key's lab needs of it (the E2B front, MCP's tools): a daemon's
 * in-process keyed lab (server/keyed-lab.ts) serves it; a sandbox's calls are all of SandboxApi.
 */
export type KeyedLabApi = Pick<
  LabApi,
  'create' | 'restore' | 'get' | 'list' | 'count' | 'pools' | 'snapshots' | 'removeSnapshot' | 'whoami' | 'close'
>;

export interface LabApi {
  create(opts?: LabCreateOptions): Promise<SandboxApi>;
  restore(snapshot: string, opts?: LabRestoreOptions): Promise<SandboxApi>;
  /** `check: false` reads the record as it stands (see ListOptions) */
  get(idOrName: string, opts?: { check?: boolean }): Promise<SandboxApi>;
  list(opts?: ListOptions): Promise<SandboxApi[]>;
  /**
   * How many sandboxes a list with these filters would give, by state, without listing them: a
   * lab with a store counts there (one statement, no sandbox read; ~1 ms beside 10 000)
   */
  count(opts?: CountOptions): Promise<SandboxCount>;
  /**
   * One pass over every sandbox: its record checked against the host (one whose processes are
   * gone is dead, with the reason; a pool's paused standbys are left to their pool), and what a
   * create that died half-way left is removed. A server runs it on its tick. `reconciled`: every
   * record was checked against the host just now (a gc's pass): only the removal is done.
   * `quick`: only machines whose recorded process is gone are checked (lab/lifecycle/check.ts:
   * a pid taken since by another process is seen by the next full pass only); a lab that cannot
   * tell cheaply does a full pass.
   */
  check(opts?: { reconciled?: boolean; quick?: boolean }): Promise<CheckResult>;
  /** stored traces, newest first */
  traces(query?: TraceQuery): Promise<StoredTrace[]>;
  trace(operationId: string): Promise<StoredTrace | undefined>;
  snapshots(): Promise<SnapshotApi[]>;
  snapshot(name: string): Promise<SnapshotApi>;
  removeSnapshot(name: string): Promise<unknown>;
  createPool(spec: PoolSpec): Promise<PoolApi>;
  pool(name: string): PoolApi;
  pools(): Promise<PoolStats[]>;
  /** who this lab acts for: a front reads a key's ceilings here once instead of learning them from refusals */
  whoami(): Promise<CallerInfo>;
  close(): void;
}
