/**
 * Long operations (image build and import, scenario up, pool fill): the request returns at once
 * with an operation id; `GET /operations/{id}?wait=S` returns its state, waiting up to S seconds
 * for its end. Progress lines are kept. Kept in memory for an hour after the end; the trace of the
 * work itself is stored as every traced operation is (`GET /traces/{id}`).
 */
import { EventEmitter } from 'node:events';
import { randomBytes } from 'node:crypto';
import { SnaplabError } from '../errors.js';
import { toSnaplab } from './http-errors.js';

export interface OperationView {
  id: string;
  kind: string;
  target: string | null;
  state: 'running' | 'done' | 'failed';
  startedAt: string;
  endedAt: string | null;
  progress: string[];
  result: unknown;
  error: { code: string; message: string; hint?: string; operationId?: string } | null;
}

class Operation extends EventEmitter {
  readonly id = randomBytes(8).toString('hex');
  readonly startedAt = Date.now();
  endedAt: number | null = null;
  state: OperationView['state'] = 'running';
  progress: string[] = [];
  result: unknown = null;
  error: OperationView['error'] = null;

  constructor(
    readonly kind: string,
    readonly target: string | null,
  ) {
    super();
  }

  view(): OperationView {
    return {
      id: this.id,
      kind: this.kind,
      target: this.target,
      state: this.state,
      startedAt: new Date(this.startedAt).toISOString(),
      endedAt: this.endedAt ? new Date(this.endedAt).toISOString() : null,
      progress: this.progress,
      result: this.result,
      error: this.error,
    };
  }
}

export class Operations {
  private readonly all = new Map<string, Operation>();

  start(
    kind: string,
    target: string | null,
    work: (progress: (line: string) => void) => Promise<unknown>,
    onEnd?: (v: OperationView) => void,
  ): OperationView {
    const op = new Operation(kind, target);
    this.all.set(op.id, op);
    const progress = (line: string): void => {
      op.progress.push(line);
      if (op.progress.length > 200) op.progress.shift();
    };
    void work(progress)
      .then(
        (r) => {
          op.state = 'done';
          op.result = r ?? null;
        },
        (e) => {
          const err = toSnaplab(e);
          op.state = 'failed';
          op.error = {
            ...err.toJSON(),
            ...((err as { operationId?: string }).operationId
              ? { operationId: (err as { operationId?: string }).operationId }
              : {}),
          };
        },
      )
      .finally(() => {
        op.endedAt = Date.now();
        op.emit('end');
        onEnd?.(op.view());
        setTimeout(() => this.all.delete(op.id), 3600_000).unref();
      });
    return op.view();
  }

  /** The operation, after waiting up to `waitS` seconds for it to end (0: at once). */
  async get(id: string, waitS = 0): Promise<OperationView> {
    const op = this.all.get(id);
    if (!op)
      throw new SnaplabError(
        'OPERATION_NOT_FOUND',
        `no operation ${id}`,
        'operations are kept an hour after they end, and not across a daemon restart; its trace is at GET /traces',
      );
    if (op.state === 'running' && waitS > 0) {
      await new Promise<void>((resolve) => {
        const end = (): void => {
          clearTimeout(timer);
          resolve();
        };
        const timer = setTimeout(() => {
          op.off('end', end);
          resolve();
        }, waitS * 1000);
        op.once('end', end);
      });
    }
    return op.view();
  }

  list(): OperationView[] {
    return [...this.all.values()].map((o) => o.view());
  }
}
