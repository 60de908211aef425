import type { ImageConfig } from '../image/oci.js';
import type { Provenance } from '../image/import.js';
import type { Volume, StorageKind } from '../storage/backend.js';

/**
 * What the end of a sandbox's timeout does: kill (destroy it), pause (freeze it with its memory;
 * a resume thaws its processes) or stop (end its processes and keep its files; a start boots it
 * afresh on them).
 */
export type OnTimeout = 'kill' | 'pause' | 'stop';

export interface Limits {
  memoryBytes?: number;
  pids?: number;
  cpus?: number;
  /** what the machine may write to its filesystem beyond its image or snapshot (0: no cap) */
  diskBytes?: number;
}

export type SandboxState = 'creating' | 'running' | 'paused' | 'dead' | 'removing';

/**
 * The process that holds a record in its current step, as data (never parsed from `reason`):
 * its pid and start time (clock ticks after boot, /proc/PID/stat field 22: a reused pid is not the
 * owner), and the step. 'create' and 'remove' are the creating and removing states; 'hold' is a
 * pool member taken or being raised, or a pool's template VM, which lives only while its holder
 * does; 'start' is a stopped machine being raised again (creating; interrupted, it is stopped
 * again). A dead record keeps the owner it died under (an interrupted create is one whose owner's
 * step was 'create'). `pid` and `start` are null only for owners carried over from the old
 * reason text (by the migration that added these columns), which named no start time and, once
 * dead, no pid.
 */
export interface Owner {
  pid: number | null;
  start: number | null;
  op: 'create' | 'remove' | 'hold' | 'start';
}

export interface ImageRecord {
  name: string;
  source: string;
  path: string;
  sizeBytes: number;
  createdAt: number;
  /** what `run` with no argv runs, and with what environment (OCI and docker images) */
  config?: ImageConfig | null;
  provenance?: Provenance | null;
  /** built images: the hash of what they were built from */
  buildKey?: string | null;
}

export interface SandboxRecord {
  id: string;
  name: string;
  image: string;
  storage: StorageKind;
  driver: string;
  state: SandboxState;
  reason: string | null;
  volume: Volume | null;
  pid: number | null;
  pidStart: number | null;
  limits: Limits;
  /** snapshot name this sandbox was restored from, if any */
  origin: string | null;
  createdAt: number;
  /** the pool this sandbox is a standby of (paused) or was taken from (running) */
  pool: string | null;
  /** the scenario this sandbox is a machine of */
  scenario: string | null;
  /** for pooled sandboxes: what the clean state looked like when it became a standby */
  baseline: CleanBaseline | null;
  /**
   * the first host uid (and gid) of the sandbox's user namespace, which maps 0..ids-1 inside to
   * uidBase.. outside; null where there is none (VMs; --no-userns). Up to 2^32−2: never `| 0` it
   */
  uidBase: number | null;
  /** how many ids its user namespace maps (create's `ids`); null or absent: 65536 */
  ids?: number | null;
  /** 'systemd': a system machine, whose PID 1 is the image's init (null: the agent is PID 1) */
  init?: 'systemd' | null;
  /** who holds it now (null: nobody; it is whoever's uses it) */
  owner?: Owner | null;
  /** a pool's template VM: the pool's name (null: not a template) */
  templateOf?: string | null;
  /** outbound network through the home's router (docs/egress.md), or null: loopback only */
  egress?: SandboxEgress | null;
}

/** A machine's egress: its slot under the router (its address and names) and its lists. */
export interface SandboxEgress {
  /** 0 until the store gives it one, at the insert */
  slot: number;
  allow: string[];
  deny: string[];
  /** the connection mark of its holder (host/net/egress-rules.ts newMark): its flows, nobody else's */
  mark: number;
}

/** The state a recycled standby must be back in before it may be handed out again. */
export interface CleanBaseline {
  /** the root filesystem's change counter (btrfs ctransid; overlay: entries in the upper dir) */
  fsGeneration: string;
  /** entries of the sandbox's /dev, /dev/shm and /run at the start */
  devEntries: string[];
  oomKills: number;
  /** pids.events "max": how often a fork hit the limit */
  pidsMax: number;
  /**
   * processes in its cgroup at the start (a sandbox: its agent alone, bwrap's monitor being let
   * go at launch); the clean check allows at most this many, and never more than two (the agent
   * and a monitor, as before: a baseline without it allows two)
   */
  procs?: number;
}

/** What a pool can start in its standbys ahead of a take (PoolRecord.warm). */
export const POOL_WARMS = ['interpreter'] as const;
export type PoolWarm = (typeof POOL_WARMS)[number];

export interface PoolRecord {
  name: string;
  image: string;
  storage: StorageKind;
  limits: Limits;
  /** the driver of its standbys */
  driver: string;
  /**
   * (drivers with memory snapshots) the memory snapshot standbys are restored from, made from a
   * booted machine when the pool first needs one
   */
  template: string | null;
  /** false: standbys have no user namespace (--no-userns); null: wherever driver and storage allow */
  userns: boolean | null;
  /** its standbys' egress lists (docs/egress.md), or null: they have none */
  egress?: { allow: string[]; deny: string[] } | null;
  /** what each standby starts before it waits: 'interpreter' (the code interpreter's server and kernel), or nothing */
  warm?: PoolWarm | null;
  target: number;
  recycle: boolean;
  hits: number;
  misses: number;
  recycled: number;
  refusedDirty: number;
  leaks: number;
  createdAt: number;
}

export interface SnapshotRecord {
  name: string;
  id: string;
  sandbox: string | null;
  image: string;
  storage: StorageKind;
  volume: Volume;
  limits: Limits;
  createdAt: number;
  /** the driver of the sandbox it was taken from (a VM's volume holds its disk, not a tree); absent: namespaces */
  driver?: string | null;
  /** a memory snapshot (VM driver): the whole machine state, and the driver it needs */
  memory?: { dir: string; bytes: number; driver: string } | null;
  /** the init of the machine it was taken from: a restore boots the same */
  init?: 'systemd' | null;
  /** the user namespace size of the sandbox it was taken of (null: 65536): a restore keeps it */
  ids?: number | null;
  /** the API key whose sandbox it was taken of (the sandbox's owner then), or null; counted by its ceilings */
  owner?: string | null;
}

export interface ScenarioRecord {
  name: string;
  /** short id used in host object names (network namespaces) */
  id: string;
  file: string;
  hash: string;
  /** the parsed scenario (ScenarioSpec) as it was raised */
  spec: unknown;
  state: 'up' | 'creating' | 'failed' | 'removing';
  reason: string | null;
  createdAt: number;
  /** the process raising ('create') or removing ('remove') it; null once up or failed */
  owner?: Owner | null;
  /** its standby copy (scenario/standby.ts): null when it has none */
  standby?: ScenarioStandby | null;
  /** whether snapshots and resets keep a standby: null, the scenario file's `standby` key decides */
  standbyWanted?: boolean | null;
}

/**
 * A scenario's standby copy: raised from a snapshot in the background, then swapped in by a reset.
 * queued: a worker was started and has not begun; raising: the worker is raising it; ready: raised,
 * its ready checks passed, waiting; swapping: a reset began to swap it in (the next operation on the
 * scenario finishes the swap); failed: its raise failed (reason), resets take the slow path.
 */
export interface ScenarioStandby {
  state: 'queued' | 'raising' | 'ready' | 'swapping' | 'failed';
  /** the scenario snapshot it was raised from */
  snapshot: string;
  /** the process raising it (queued: the worker, once started; raising) */
  owner: Owner | null;
  /** its raiser is a detached worker (standby-worker.ts), the leader of its process group */
  worker?: boolean;
  /** when it entered this state (ms since the epoch) */
  at?: number;
  reason?: string;
  /** how long its raise took, ms (ready) */
  raiseMs?: number;
  /** the machine sandboxes set aside by the swap, to be removed (swapping) */
  aside?: string[];
}

export interface ScenarioSnapshotRecord {
  scenario: string;
  name: string;
  /** machines → snapshot names, addresses, and the scenario file's hash */
  manifest: unknown;
  createdAt: number;
}

/** What the daemon and the library keep beside a sandbox: labels, metadata, its maker and its lifetime. */
export interface SandboxMeta {
  id: string;
  labels: Record<string, string>;
  metadata: Record<string, string>;
  /** the API key that made it ('local': the Unix socket or the embedded library) */
  owner: string | null;
  /** its TTL in seconds (null or 0: none) and what happens at its end */
  timeoutS: number | null;
  onTimeout: OnTimeout | null;
  /** when the TTL ends (ms since the epoch); null: no clock running (none, or paused) */
  expiresAt: number | null;
}

/** What an API key may ask of the host (lab/ceilings.ts). */
export interface Ceilings {
  /** per sandbox; null: no ceiling */
  memoryBytes: number | null;
  pids: number | null;
  cpus: number | null;
  diskBytes: number | null;
  /** over all of the key's sandboxes at once (their limits, not their use); null: no ceiling */
  totalMemoryBytes: number | null;
  totalDiskBytes: number | null;
  /** snapshots taken of the key's sandboxes that are still there */
  snapshots: number | null;
  /** may its sandboxes have egress (docs/egress.md)? true unless the key was made with --no-egress */
  egress: boolean;
}

export type Scope = 'read' | 'exec' | 'admin';

export interface ApiKeyRecord {
  name: string;
  /** sha256 of the key, hex: the key itself is printed once and never stored */
  hash: string;
  scopes: Scope[];
  maxSandboxes: number | null;
  maxExecs: number | null;
  /** the ceilings it was made with (null: lifted); those not named are the defaults (lab/ceilings.ts) */
  ceilings: Partial<Ceilings>;
  createdAt: number;
}

/**
 * Event types that tell a sandbox's state, and those that end it. The daemon's log rebuilds what
 * it last told of each sandbox from them on a restart, so the journal keeps, however old, each
 * sandbox's newest of them until one ends it (Store.appendEvent).
 */
export const STATE_EVENTS = ['created', 'ready', 'paused', 'resumed', 'stopped', 'started', 'exited'] as const;
export const END_EVENTS = ['destroyed', 'failed'] as const;

export interface EventRecord {
  id: number;
  at: number;
  type: string;
  sandbox: string | null;
  name: string | null;
  reason: string | null;
  data: Record<string, unknown> | null;
}

/** Where a daemon's E2B front keeps its sessions: rows it seals and reads itself (src/e2b/sessions.ts). */
export interface SessionRows {
  list(): { id: string; sealed: string }[];
  put(id: string, sealed: string): void;
  delete(id: string): void;
}

/**
 * How many sandboxes pass a count's filters (LabApi.count): in all, and by state as a list
 * filters it (a ListState: `stopped` apart from `dead`; a cluster gateway adds `lost` and
 * `unreachable` for those of nodes it cannot read). States none is in are left out.
 */
export interface SandboxCount {
  total: number;
  byState: Record<string, number>;
}
