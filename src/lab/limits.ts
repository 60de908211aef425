import { SnaplabError } from '../errors.js';
import type { Limits } from '../store/records.js';

/**
 * Limits every sandbox gets unless told otherwise: without them one fork bomb exhausts the host's
 * pid space and one runaway process its memory. Generous enough for builds and tests; raise them
 * per sandbox (--memory, --pids) as needed. No CPU limit by default: the scheduler shares cores.
 */
export const DEFAULT_LIMITS: Readonly<Limits> = { memoryBytes: 1024 ** 3, pids: 1024 };

/** A VM's memory is its guest's RAM (and the size of its memory snapshots): smaller by default. */
export const VM_DEFAULT_MEMORY = 256 * 1024 * 1024;
/**
 * The least a VM boots in: the guest kernel ran out of memory in its initcalls at 72 MiB and
 * booted at 80 (Debian's cloud kernel 6.1, busybox image, measured); 96 leaves room.
 */
export const VM_MIN_MEMORY = 96 * 1024 * 1024;

/**
 * What a machine may write to its own filesystem unless told otherwise (`--disk`): without a cap,
 * one sandbox fills the storage pool that every sandbox and snapshot shares (a 3 GiB write went
 * through before). Applied where a cap costs nothing (btrfs with simple quotas); overlay and dir
 * make a filesystem per capped machine, so only an explicit --disk (or a snapshot's) caps there;
 * where no cap can hold (a VM) an explicit --disk is refused. `snaplab doctor` says which.
 */
export const DEFAULT_DISK_BYTES = 4 * 1024 ** 3;

export function withDefaults(l: Limits | undefined, driver = 'namespaces'): Limits {
  return { ...DEFAULT_LIMITS, ...(driver === 'qemu' ? { memoryBytes: VM_DEFAULT_MEMORY } : {}), ...l };
}

/** A VM's memory below VM_MIN_MEMORY: `what` names it (a scenario's machine). */
export function vmTooSmall(
  bytes: number,
  what = 'a VM',
  hint = `give --memory ${VM_MIN_MEMORY / 2 ** 20}M or more (default ${VM_DEFAULT_MEMORY / 2 ** 20}M)`,
): SnaplabError {
  return new SnaplabError(
    'BAD_SIZE',
    `${what} needs at least ${VM_MIN_MEMORY / 2 ** 20} MiB of memory, not ${Math.round(bytes / 2 ** 20)} MiB`,
    hint,
  );
}
