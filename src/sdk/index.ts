export { Lab, type LabOptions, type CreateOptions, type RestoreOptions } from './lab.js';
export { Sandbox } from './sandbox.js';
export { Snapshot } from './snapshot.js';
export type { ExecOptions, ExecResult } from '../lab/sandbox-ops.js';
export type { Limits, SandboxRecord, SnapshotRecord, ImageRecord } from '../store/records.js';
export type { TraceSummary, Phase } from '../timing/trace.js';
export { SnaplabError, type ErrorCode } from '../errors.js';
export { renderWaterfall } from '../timing/waterfall.js';
