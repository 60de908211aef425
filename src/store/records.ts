import type { Volume, StorageKind } from '../storage/backend.js';

export interface Limits {
  memoryBytes?: number;
  pids?: number;
  cpus?: number;
}

export type SandboxState = 'creating' | 'running' | 'paused' | 'dead' | 'removing';

export interface ImageRecord {
  name: string;
  source: string;
  path: string;
  sizeBytes: number;
  createdAt: number;
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
}
