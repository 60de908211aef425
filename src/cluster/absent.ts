/**
 * A sandbox the cluster records but whose node cannot answer for it: `lost` (its node lapsed) or
 * `unreachable` (its node stopped, or is not answering). What the store knows is shown; every
 * call is refused with why, except that a lost one's owner may destroy its record.
 */
import { SnaplabError } from '../errors.js';
import type { SandboxApi, SandboxFiles, SnapshotApi } from '../sdk/api.js';
import type { CopyResult } from '../lab/io/copy.js';
import { absentView } from './gateway-api.js';
import { lostError } from './core-errors.js';
import type { ClusterStore, SandboxEntry } from './store.js';

export class AbsentSandbox implements SandboxApi {
  private readonly v: Record<string, unknown>;

  constructor(
    private readonly store: ClusterStore,
    private readonly e: SandboxEntry,
    left: boolean,
  ) {
    this.v = absentView(e, left);
  }

  get id(): string {
    return this.e.id;
  }
  get name(): string {
    return this.e.name;
  }
  get state(): string {
    return this.v.state as string;
  }
  get image(): string {
    return this.e.image ?? '';
  }
  // what the node alone knows is unknown here
  readonly storage = '';
  readonly driver = '';
  readonly metadata: Record<string, string> = {};
  readonly origin = null;
  readonly init = 'agent';
  readonly expiresAt = null;
  readonly timeoutS = 0;
  readonly onTimeout = 'kill';
  readonly hostRoot = false;
  readonly egress = null;
  readonly pool = null;
  readonly limits = {};
  get labels(): Record<string, string> {
    return this.e.labels;
  }
  /** (whatever it was on its node: nothing can be done with it here) */
  readonly stopped = false;
  get reason(): string | null {
    return (this.v.reason as string | null) ?? null;
  }
  get createdAt(): number {
    return this.e.createdAt;
  }
  get owner(): string | null {
    return this.e.owner;
  }

  /** why nothing can be done with it */
  private why(): SnaplabError {
    if (this.e.state === 'lost') return lostError(this.e);
    return new SnaplabError(
      'NODE_UNAVAILABLE',
      `sandbox ${this.e.name}: ${this.reason}`,
      'see `snaplab cluster nodes`',
    );
  }

  private refuse = (): Promise<never> => Promise.reject(this.why());

  get files(): SandboxFiles {
    const r = this.refuse;
    return { stat: r, list: r, mkdir: r, remove: r, move: r, write: r, read: r, readTo: r };
  }

  exec(): Promise<never> {
    return this.refuse();
  }
  spawn(): Promise<never> {
    return this.refuse();
  }
  kept(): Promise<never> {
    return this.refuse();
  }
  attach(): Promise<never> {
    return this.refuse();
  }
  putFile(): Promise<void> {
    return this.refuse();
  }
  getFile(): Promise<Buffer> {
    return this.refuse();
  }
  upload(): Promise<CopyResult> {
    return this.refuse();
  }
  download(): Promise<CopyResult> {
    return this.refuse();
  }
  snapshot(): Promise<SnapshotApi> {
    return this.refuse();
  }
  watch(): Promise<never> {
    return this.refuse();
  }
  usage(): Promise<never> {
    return this.refuse();
  }
  setLabels(): Promise<void> {
    return this.refuse();
  }
  setEgress(): Promise<void> {
    return this.refuse();
  }
  egressUsage(): Promise<never> {
    return this.refuse();
  }
  setTimeout(): Promise<void> {
    return this.refuse();
  }
  pause(): Promise<undefined> {
    return this.refuse();
  }
  resume(): Promise<undefined> {
    return this.refuse();
  }
  stop(): Promise<undefined> {
    return this.refuse();
  }
  start(): Promise<undefined> {
    return this.refuse();
  }

  /**
   * A lost sandbox's record is all there is of it here: removing it is the destroy (its node, if
   * it comes back, still destroys it: the record stays as a tombstone for a day).
   */
  async destroy(): Promise<undefined> {
    if (this.e.state === 'lost' && (await this.store.forget(this.e))) return undefined;
    throw this.why();
  }

  /** What the store says of it now is what this object was made from: a new get() reads it again. */
  async refresh(): Promise<this> {
    return this;
  }

  close(): void {}

  toJSON(): Record<string, unknown> {
    return this.v;
  }
}
