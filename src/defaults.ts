/**
 * What snaplab uses when it is not told: every lab-wide default, in one place, each with its
 * value as `@default` (as execa's options.d.ts does). The SDK, the lab, scenarios, the daemon, the
 * gateway and the CLI's --help read these; a create's inputs are resolved with them once
 * (resolveCreate, sdk/create-options.ts). A driver's own defaults (a VM's memory) are the
 * driver's (DriverInfo.memory, drivers/<name>/info.ts) and are applied over the lab's (lab/lifecycle/limits.ts).
 *
 * This module sits beside errors.ts, below every layer: it imports nothing but a driver's
 * description (data, no code), so that anything may import it without a cycle.
 */
import { NAMESPACES_INFO } from './drivers/namespaces/info.js';
import type { Limits, OnTimeout } from './store/records.js';

/**
 * The driver a machine gets unless told (a sandbox, a pool's standbys, a scenario's machines).
 * @default 'namespaces'
 */
export const DEFAULT_DRIVER: string = NAMESPACES_INFO.name;

/** The image the lab makes itself from the host's busybox (lab/images/images.ts): every host has it, no import needed. */
export const BUILTIN_IMAGE = 'busybox';

/**
 * The image a machine starts from unless told (a sandbox, a run, a pool, a scenario's machine).
 * @default 'busybox' (BUILTIN_IMAGE)
 */
export const DEFAULT_IMAGE: string = BUILTIN_IMAGE;

/**
 * Limits every machine gets unless told otherwise: without them one fork bomb exhausts the host's
 * pid space and one runaway process its memory. Generous enough for builds and tests; raise them
 * per sandbox (--memory, --pids) as needed. No CPU limit by default: the scheduler shares cores.
 * A driver's own default memory replaces memoryBytes (a VM's is its guest's RAM: drivers/qemu/info.ts).
 * @default { memoryBytes: 1 GiB, pids: 1024 }
 */
export const DEFAULT_LIMITS: Readonly<Limits> = { memoryBytes: 1024 ** 3, pids: 1024 };

/**
 * What a machine may write to its own filesystem unless told otherwise (`--disk`): without a cap,
 * one sandbox fills the storage pool that every sandbox and snapshot shares (a 3 GiB write went
 * through before). Applied where a cap costs nothing (btrfs with simple quotas); overlay and dir
 * make a filesystem per capped machine, so only an explicit --disk (or a snapshot's) caps there;
 * where no cap can hold (a VM) an explicit --disk is refused. `snaplab doctor` says which.
 * @default 4 GiB
 */
export const DEFAULT_DISK_BYTES = 4 * 1024 ** 3;

/**
 * What the end of a sandbox's lifetime does unless told.
 * @default 'kill'
 */
export const DEFAULT_ON_TIMEOUT = 'kill' as const;

/** What the end of a sandbox's lifetime may do (OnTimeout): the list the API, the CLI and the schemas check against. */
export const ON_TIMEOUT_ACTIONS: readonly OnTimeout[] = ['kill', 'pause', 'stop'];

/**
 * The standbys a pool keeps ready unless told (`snaplab pool create --size`).
 * @default 4
 */
export const DEFAULT_POOL_SIZE = 4;

/**
 * A scenario step's `run` deadline unless its file gives one (ms).
 * @default 60_000
 */
export const DEFAULT_RUN_TIMEOUT_MS = 60_000;

/**
 * A scenario readiness check's deadline unless its file gives one (ms).
 * @default 30_000
 */
export const DEFAULT_CHECK_TIMEOUT_MS = 30_000;

/**
 * The daemon's (`snaplab serve`) defaults, each overridable by DaemonOptions (and the flags that
 * set them). A sandbox made through the embedded lab has no lifetime: only a daemon keeps the clock.
 */
export const DAEMON_DEFAULTS = {
  /**
   * The lifetime of a sandbox made through the API whose request gives none (s); 0: none.
   * @default 300
   */
  defaultTimeoutS: 300,
  /**
   * The deadline of an exec or process whose request gives none (ms); 0: none.
   * @default 60_000
   */
  execTimeoutMs: 60_000,
  /**
   * The output a process keeps for a client that reconnects (bytes).
   * @default 1 MiB
   */
  ringBytes: 1 << 20,
  /**
   * How often lifetimes, the watcher and the reaper run (ms).
   * @default 1000
   */
  tickMs: 1000,
  /**
   * A create (or restore) of the daemon's own that takes longer than this is aborted and cleaned (s).
   * @default 300
   */
  createBoundS: 300,
  /**
   * Where the dashboard finds `snaplab bench --results` directories.
   * @default undefined ($SNAPLAB_HOME/bench)
   */
  benchDir: undefined as string | undefined,
};
