import type { Availability } from '../host/probe-types.js';

export type StorageKind = 'btrfs' | 'overlay' | 'dir';

/**
 * A volume is a root filesystem tree that a backend owns. `path` is the directory a sandbox
 * uses as its root (for overlay, the merged mount point). `ref` is backend-private state that
 * must be stored so that the volume can be found again by a later process (JSON-serialisable).
 */
export interface Volume {
  kind: StorageKind;
  /** unique id chosen by the backend, safe as a file name */
  id: string;
  /** directory holding the tree as a sandbox sees it */
  path: string;
  readOnly: boolean;
  /** backend-private, JSON-serialisable; pass back unchanged */
  ref: Record<string, unknown>;
}

export interface Usage {
  /** bytes only this volume holds */
  exclusiveBytes: number;
  /** bytes shared with other volumes (images, snapshots) */
  sharedBytes: number;
}

/**
 * The storage contract. Every backend passes the same contract suite
 * (src/storage/contract.test.ts). All methods are safe to call from a process other than the
 * one that created the volume: state lives on disk and in `Volume.ref`, never in memory.
 */
export interface StorageBackend {
  readonly kind: StorageKind;
  /** Does this backend work on this host? Never throws. */
  probe(): Promise<Availability>;
  /** Prepare the backend (e.g. create and mount the btrfs pool). Idempotent. */
  init(): Promise<void>;
  /** Make a read-only base volume from a plain directory tree (copied; `srcDir` is left as is). */
  importImage(srcDir: string, name: string): Promise<Volume>;
  /**
   * A writable volume whose content starts as `base`'s. `base` may be an image or a snapshot.
   * `mountOnHost: false`: the caller mounts it itself, inside a sandbox's own namespaces (overlay:
   * `stack` says what to mount); backends whose volumes are plain directories ignore it.
   */
  clone(base: Volume, opts?: { mountOnHost?: boolean }): Promise<Volume>;
  /**
   * (overlay) the layers of a clone for a mount the caller makes itself: lower dirs top first, and
   * the upper and work dirs, which share one parent directory
   */
  stack?(volume: Volume): { lowers: string[]; upper: string; work: string };
  /**
   * A read-only point-in-time copy of `volume` (writable or not). The caller freezes writers
   * first; the backend only has to copy consistently what is on disk.
   */
  snapshot(volume: Volume): Promise<Volume>;
  /** Remove the volume and everything it holds on the host (mounts included). Idempotent. */
  delete(volume: Volume): Promise<void>;
  usage(volume: Volume): Promise<Usage>;
  /**
   * A value that is different whenever the writable volume's content has changed since an
   * earlier call (it may also differ when it has not: it fails closed), or null when this backend
   * cannot tell cheaply. Pools recycle a standby only when this is unchanged.
   */
  changeMarker(volume: Volume): Promise<string | null>;
  /**
   * Cap what a writable volume may hold beyond its base: writes past `bytes` fail inside with
   * EDQUOT (0: no cap). Resolves with null when the cap is enforced, or with why it cannot be
   * on this host (a backend without the method cannot at all).
   */
  limitDisk?(volume: Volume, bytes: number): Promise<string | null>;
  /**
   * Why no cap can be enforced on this host, once init() has run (btrfs on Linux before 6.7: no
   * simple quotas), or null when limitDisk enforces one. Absent: as limitDisk's presence says.
   */
  diskCapOff?(): string | null;
  /**
   * Whether a machine that asks for no cap gets the default one (DEFAULT_DISK_BYTES); false where a
   * cap costs something at every create (overlay makes a filesystem per machine). Default: true.
   */
  readonly capsByDefault?: boolean;
  /** What a capped volume holds against its cap; null when this backend or host keeps no count. */
  diskQuota?(volume: Volume): Promise<{ usedBytes: number; limitBytes: number | null } | null>;
  /**
   * Host objects this backend made (mount points, loop devices, directories) whose volume ids are
   * not in `liveIds`; `gc` removes them. Returns a description of each thing it removed.
   */
  gc(liveIds: Set<string>): Promise<string[]>;
}
