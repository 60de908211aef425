/**
 * The shapes the API answers with that the dashboard reads too: one definition for the daemon
 * and the web build (web/ imports this file's types; it imports nothing, so it type checks there
 * with the DOM's types and no Node's).
 */

/** One timed phase; times are milliseconds from the start of its operation (monotonic clock). */
export interface Phase {
  name: string;
  /** index of the enclosing phase in `phases`, or null at top level */
  parent: number | null;
  depth: number;
  startMs: number;
  endMs: number;
  /**
   * Set on a zero-length mark, not a timed phase: a best-effort step (cleanup) that failed and
   * was let go, with what it said (src/cleanup.ts). Stored with the phases, so the operation's
   * stored trace shows it.
   */
  failed?: string;
}

export interface TraceSummary {
  id: string;
  kind: string;
  target: string | null;
  startedAt: number;
  totalMs: number;
  /** time covered by no top-level phase: work the trace did not attribute */
  unattributedMs: number;
  status: 'ok' | 'error';
  error: string | null;
  /** the failure's code and hint, when it was a SnaplabError */
  errorCode?: string | null;
  errorHint?: string | null;
  phases: Phase[];
}

export interface MachineStatus {
  machine: string;
  sandbox: string;
  state: string;
  reason: string | null;
  hostname: string;
  addresses: { network: string; address: string }[];
}

export interface ScenarioStatus {
  name: string;
  state: string;
  reason: string | null;
  file: string;
  machines: MachineStatus[];
  networks: { name: string; subnet: string }[];
  /** pairs of machines whose traffic is dropped now (block, partition), as the kernel has it */
  blocked: [string, string][];
  snapshots: string[];
  /** its standby copy (docs/architecture.md, "Standbys"): null when it has none */
  standby: { state: string; snapshot: string; reason: string | null; raiseMs: number | null } | null;
  /** whether its snapshots and resets keep a standby */
  standbyWanted: boolean;
}
