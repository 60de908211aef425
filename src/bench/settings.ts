import type { StorageKind } from '../storage/backend.js';

/** What every workload is run with (the command line's options). */
export interface BenchSettings {
  concurrency: number;
  durationMs: number;
  count?: number;
  storage?: StorageKind;
  argv: string[];
  /** snapshot workload: bytes written into the sandbox before snapshots are taken */
  fillBytes?: number;
  /** scenario workloads: the scenario file */
  scenario?: string;
  /** machine driver (default namespaces) */
  driver?: string;
  /** false: sandboxes without a user namespace (--userns off), to measure what one costs */
  userns?: boolean;
  /** raise, restore: systemd (system machines) or agent; absent: the image's default */
  init?: 'systemd' | 'agent';
  /** raise, restore: the image (default busybox) */
  image?: string;
  /** raise, fresh-exec: machines (a pool's standbys) with egress, no lists (--egress on) */
  egress?: boolean;
}

/** What fresh-exec takes on top: recycling of clean host resources, and the standby pool's size. */
export type WorkloadSettings = BenchSettings & { recycle: boolean; poolSize?: number };
