/**
 * Commands the daemon runs for clients that may go away: every streamed exec and every
 * background process. Its output goes into a bounded ring, one byte-offset space over stdout and
 * stderr in the order they came, so a client that reconnects asks for "from offset N" and gets
 * everything after N that the ring still holds, and is told of a gap if it does not. The command
 * lives until it exits or its deadline kills its process group, whoever is attached.
 */
import { EventEmitter } from 'node:events';
import { randomBytes } from 'node:crypto';
import { SnaplabError } from '../errors.js';
import { toSnaplab } from './http-errors.js';
import type { ExecProcess, ExecResult } from '../lab/io/sandbox-ops.js';

export type StreamName = 'stdout' | 'stderr';

export interface Chunk {
  stream: StreamName;
  /** offset of its first byte in the process's output */
  offset: number;
  data: Buffer;
}

/** The last `capacity` bytes of output, as the chunks they came in. */
export class Ring {
  private chunks: Chunk[] = [];
  private held = 0;
  /** bytes ever written */
  total = 0;

  constructor(readonly capacity: number) {}

  /** the first offset still held */
  get start(): number {
    return this.chunks[0]?.offset ?? this.total;
  }

  push(stream: StreamName, data: Buffer): Chunk {
    const c = { stream, offset: this.total, data };
    this.chunks.push(c);
    this.total += data.length;
    this.held += data.length;
    while (this.held > this.capacity && this.chunks.length > 1) this.held -= this.chunks.shift()!.data.length;
    // one chunk larger than the ring: keep its tail
    if (this.held > this.capacity) {
      const only = this.chunks[0]!;
      const cut = this.held - this.capacity;
      this.chunks[0] = { stream: only.stream, offset: only.offset + cut, data: only.data.subarray(cut) };
      this.held = this.capacity;
    }
    return c;
  }

  /**
   * Count what it holds from `base` on: the output of a command found after `base` bytes (kept.ts),
   * before anyone has read it, so that an old offset below `base` is told as a gap.
   */
  rebase(base: number): void {
    for (const c of this.chunks) c.offset += base;
    this.total += base;
  }

  /** What is held from `offset` on; `gap` when some of what was asked for is gone. */
  from(offset: number): { chunks: Chunk[]; gap: { from: number; to: number } | null } {
    const start = this.start;
    const gap = offset < start ? { from: offset, to: start } : null;
    const at = Math.max(offset, start);
    const out: Chunk[] = [];
    for (const c of this.chunks) {
      const end = c.offset + c.data.length;
      if (end <= at) continue;
      out.push(c.offset >= at ? c : { stream: c.stream, offset: at, data: c.data.subarray(at - c.offset) });
    }
    return { chunks: out, gap };
  }
}

export interface ProcessInfo {
  id: string;
  sandbox: string;
  tag: string | null;
  argv: string[];
  pid: number | null;
  tty: boolean;
  /** it outlives the daemon: a daemon started after it finds it again (its output since then only) */
  kept: boolean;
  /** a daemon started since found it running in its machine: its output offsets go on from what it had written (the agent's count) */
  found: boolean;
  /** it has a stdin pipe */
  stdin: boolean;
  startedAt: string;
  state: 'running' | 'exited' | 'lost';
  /** output offsets: everything before `start` is gone from the ring; `end` is the next byte */
  output: { start: number; end: number };
  result: Omit<ExecResult, 'stdout' | 'stderr'> | null;
  error: { code: string; message: string; hint?: string } | null;
}

/** One command: its handle, its ring, and who listens ('chunk', 'exit'). */
export class Process extends EventEmitter {
  readonly id: string;
  readonly ring: Ring;
  readonly startedAt: number;
  /** the machine's agent keeps it past its connection, so it outlives this daemon (kept.ts) */
  kept = false;
  /** it has a stdin pipe */
  stdin = false;
  /** a previous daemon started it and this one found it in its machine (kept.ts) */
  readonly found: boolean;
  pid: number | null = null;
  result: ExecResult | null = null;
  error: SnaplabError | null = null;
  handle: ExecProcess | undefined;
  /** pause and resume the command's output at its source (its own agent connection) */
  private holdOutput: ((on: boolean) => void) | undefined;
  private holders = 0;
  /** how long it is kept after it exits (a client that read its end needs it no longer) */
  keepMs: number | undefined;
  endedAt: number | null = null;
  /** its own agent connection, closed with it (or with its sandbox, or the daemon) */
  agent: { close(): unknown; pauseOutput(on: boolean): void } | undefined;
  /** its output can be held at its source (a connection of its own, or an agent's that takes HOLD_OUTPUT) */
  canHold = false;

  constructor(
    readonly sandbox: string,
    readonly argv: string[],
    readonly tag: string | null,
    readonly tty: boolean,
    ringBytes: number,
    /** a process a previous daemon started (kept.ts): its id and start */
    was?: { id: string; startedAt: number },
  ) {
    super();
    this.setMaxListeners(0);
    this.ring = new Ring(ringBytes);
    this.id = was?.id ?? randomBytes(8).toString('hex');
    this.startedAt = was?.startedAt ?? Date.now();
    this.found = was !== undefined;
  }

  output(stream: StreamName, data: Buffer): void {
    this.emit('chunk', this.ring.push(stream, data));
  }

  /**
   * A reader that does not keep up holds the output at its source until it has caught up, so
   * nothing it is sent goes missing; output keeps flowing (into the ring) while nobody reads.
   */
  hold(on: boolean): void {
    this.holders += on ? 1 : -1;
    if (this.holders < 0) this.holders = 0;
    this.holdOutput?.(this.holders > 0);
  }

  attach(h: ExecProcess, holdOutput?: (on: boolean) => void): void {
    this.handle = h;
    this.holdOutput = holdOutput;
    void h.pid.then(
      (p) => (this.pid = p),
      () => {},
    );
    h.result.then(
      (r) => {
        this.result = r;
        this.endedAt = Date.now();
        this.emit('exit');
      },
      (e) => {
        this.error = toSnaplab(e);
        this.endedAt = Date.now();
        this.emit('exit');
      },
    );
  }

  /** End it now: its connection let go and closed (its sandbox is going, or the daemon). */
  abandon(): void {
    this.holders = 0;
    this.agent?.pauseOutput(false);
    // never rejects: it waits for the socket's close, or destroys the socket after a second
    void this.agent?.close();
  }

  /** ended: exited, or lost (its sandbox died, the agent went away) */
  get ended(): boolean {
    return this.result !== null || this.error !== null;
  }

  info(): ProcessInfo {
    const r = this.result;
    return {
      id: this.id,
      sandbox: this.sandbox,
      tag: this.tag,
      argv: this.argv,
      pid: this.pid,
      tty: this.tty,
      kept: this.kept,
      found: this.found,
      stdin: this.stdin,
      startedAt: new Date(this.startedAt).toISOString(),
      state: r ? 'exited' : this.error ? 'lost' : 'running',
      error: this.error?.toJSON() ?? null,
      output: { start: this.ring.start, end: this.ring.total },
      result: r
        ? {
            exitCode: r.exitCode,
            signal: r.signal,
            timedOut: r.timedOut,
            notFound: r.notFound,
            truncated: r.truncated,
            usage: r.usage,
            oomKilled: r.oomKilled,
          }
        : null,
    };
  }
}

/** Processes by sandbox and id: an id is a sandbox's own (one a machine's root forged names nothing elsewhere). */
function keyOf(sandbox: string, id: string): string {
  return `${sandbox}/${id}`;
}

/** Every process of this daemon; an exited one is kept for `keepMs` so a late client still reads its end. */
export class Processes {
  private readonly all = new Map<string, Process>();

  private readonly sweeper: NodeJS.Timeout;

  constructor(private readonly keepMs = 10 * 60_000) {
    // an ended process is forgotten once its keep is over (its own, when a reader has had its end)
    this.sweeper = setInterval(() => {
      const now = Date.now();
      for (const [id, p] of this.all)
        if (p.endedAt !== null && now - p.endedAt > (p.keepMs ?? this.keepMs)) this.all.delete(id);
    }, 5000);
    this.sweeper.unref();
  }

  add(p: Process): Process {
    this.all.set(keyOf(p.sandbox, p.id), p);
    return p;
  }

  /** Every process of the daemon let go (it is stopping). */
  close(): void {
    clearInterval(this.sweeper);
    for (const p of this.all.values()) if (!p.ended) p.abandon();
  }

  get(sandbox: string, id: string): Process {
    const p = this.all.get(keyOf(sandbox, id));
    if (!p)
      throw new SnaplabError(
        'PROCESS_NOT_FOUND',
        `no process ${id} in this sandbox`,
        'list them with GET /sandboxes/{id}/processes (an exited one is kept 10 minutes)',
      );
    return p;
  }

  of(sandbox: string): Process[] {
    return [...this.all.values()].filter((p) => p.sandbox === sandbox);
  }

  has(sandbox: string, id: string): boolean {
    return this.all.has(keyOf(sandbox, id));
  }

  /** the sandbox is gone: its processes end with it */
  forget(sandbox: string): void {
    for (const p of this.of(sandbox)) this.all.delete(keyOf(p.sandbox, p.id));
  }

  running(): number {
    return [...this.all.values()].filter((p) => !p.ended).length;
  }
}
