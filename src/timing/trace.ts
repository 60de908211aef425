import { SnaplabError } from '../errors.js';
import { AsyncLocalStorage } from 'node:async_hooks';
import { randomBytes } from 'node:crypto';

export type { Phase, TraceSummary } from '../views.js';
import type { Phase, TraceSummary } from '../views.js';

const nowMs = (): number => Number(process.hrtime.bigint()) / 1e6;

/**
 * The phase running now, for every trace. One storage for the process: Node propagates every
 * AsyncLocalStorage instance to every new promise, so one per trace would make each promise
 * cost more the more traces were ever made.
 */
const running = new AsyncLocalStorage<{ trace: Trace; index: number | null }>();

/**
 * A trace of one lifecycle operation (principle 2). Phases nest through AsyncLocalStorage, so
 * phases started concurrently inside one parent are attributed to that parent correctly.
 */
export class Trace {
  readonly id: string;
  readonly kind: string;
  target: string | null;
  readonly startedAt = Date.now();
  readonly phases: Phase[] = [];
  private readonly t0 = nowMs();
  private endMs: number | undefined;

  constructor(kind: string, target: string | null = null, id?: string) {
    this.kind = kind;
    this.target = target;
    this.id = id ?? `op-${randomBytes(5).toString('hex')}`;
  }

  /** Time `fn` as a phase named `name`, nested under the phase that is running now. */
  private parentIndex(): number | null {
    const cur = running.getStore();
    return cur !== undefined && cur.trace === this ? cur.index : null;
  }

  async phase<T>(name: string, fn: () => Promise<T> | T): Promise<T> {
    const parent = this.parentIndex();
    const rec: Phase = {
      name,
      parent,
      depth: parent === null ? 0 : this.phases[parent]!.depth + 1,
      startMs: nowMs() - this.t0,
      endMs: NaN,
    };
    const index = this.phases.push(rec) - 1;
    try {
      return await running.run({ trace: this, index }, fn);
    } finally {
      rec.endMs = nowMs() - this.t0;
    }
  }

  /** Record a phase measured elsewhere, with absolute monotonic times in ms (see `now()`). */
  record(name: string, startAbsMs: number, endAbsMs: number): void {
    const parent = this.parentIndex();
    this.phases.push({
      name,
      parent,
      depth: parent === null ? 0 : this.phases[parent]!.depth + 1,
      startMs: startAbsMs - this.t0,
      endMs: endAbsMs - this.t0,
    });
  }

  /**
   * Mark that a best-effort step failed and was let go (src/cleanup.ts): a zero-length phase
   * named `cleanup: <what>` with the failure, nested where it happened. False once the trace
   * has finished (the mark would be lost), so the caller logs it instead.
   */
  note(what: string, failed: string): boolean {
    if (this.endMs !== undefined) return false;
    const at = nowMs();
    this.record(`cleanup: ${what}`, at, at);
    this.phases.at(-1)!.failed = failed;
    return true;
  }

  /** The trace whose phase (or `within`) is running now, if any. */
  static current(): Trace | undefined {
    return running.getStore()?.trace;
  }

  /** Run `fn` with this trace current at top level, so best-effort steps in it note here. */
  within<T>(fn: () => Promise<T>): Promise<T> {
    return running.run({ trace: this, index: null }, fn);
  }

  /** Monotonic now in ms, on the same clock as `record`. */
  static now(): number {
    return nowMs();
  }

  elapsedMs(): number {
    return this.endMs ?? nowMs() - this.t0;
  }

  finish(error?: unknown): TraceSummary {
    this.endMs ??= nowMs() - this.t0;
    const top = this.phases
      .filter((p) => p.parent === null && Number.isFinite(p.endMs))
      .map((p) => [p.startMs, p.endMs] as const)
      .sort((a, b) => a[0] - b[0]);
    let covered = 0;
    let reach = 0;
    for (const [s, e] of top) {
      const start = Math.max(s, reach);
      if (e > start) covered += e - start;
      reach = Math.max(reach, e);
    }
    return {
      id: this.id,
      kind: this.kind,
      target: this.target,
      startedAt: this.startedAt,
      totalMs: this.endMs,
      unattributedMs: Math.max(0, this.endMs - covered),
      status: error === undefined ? 'ok' : 'error',
      error: error === undefined ? null : error instanceof Error ? error.message : String(error),
      ...(error instanceof SnaplabError ? { errorCode: error.code, errorHint: error.hint ?? null } : {}),
      phases: this.phases.map((p) => ({ ...p, endMs: Number.isFinite(p.endMs) ? p.endMs : this.endMs! })),
    };
  }
}
