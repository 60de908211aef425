export { Lab, type LabOptions, type CreateOptions, type RestoreOptions } from './lab.js';
export { Sandbox } from './sandbox.js';
export { listCursor } from './paging.js';
export { createMany, removeMany, BulkError, LeftError, BULK_MAX, type BulkOptions, type BulkProgress } from './bulk.js';
export { Snapshot } from './snapshot.js';
export { Pool } from './pool.js';
export { Scenario, type MachineStatus, type ScenarioStatus } from './scenario.js';
export type { PoolSpec, PoolStats } from '../lab/pools/admin.js';
export type { RunSpec, RunOutcome, PutFile } from '../lab/pools/run.js';
export type { ExecOptions, ExecProcess, ExecResult } from '../lab/io/sandbox-ops.js';
export type { CopyResult } from '../lab/io/copy.js';
export type { FileInfo } from '../lab/io/files.js';
export type { SandboxUsage } from '../lab/io/usage.js';
export type { WatchEvent, WatchHandle, WatchOptions } from '../lab/io/watch.js';
export type { SandboxFiles } from './sandbox.js';
export type { Limits, OnTimeout, SandboxRecord, SnapshotRecord, ImageRecord } from '../store/records.js';
export type { TraceSummary, Phase } from '../timing/trace.js';
export { SnaplabError, type ErrorCode } from '../errors.js';
export { renderWaterfall } from '../timing/waterfall.js';
export type {
  LabApi,
  SandboxApi,
  PoolApi,
  ProcessApi,
  SnapshotApi,
  LabCreateOptions,
  ListOptions,
  ListState,
} from './api.js';
export type { RemoteLab, RemoteSandbox, RemoteCreateOptions } from '../client/remote.js';
export type { ConnectOptions } from '../client/http.js';
export type { Encoding, ExecText, Text } from './output.js';
