/**
 * `spawn` on `/rpc` (docs/api.md): a streamed command as a call of the shared connection rather
 * than a WebSocket of its own, so a client that starts commands one after another pays neither a
 * connection nor an upgrade for each. It is the streamed exec's process (the daemon's `Process`:
 * its ring, its agent connection of its own, held output for a slow reader), only its frames are
 * tagged with the call's id: `{id, started: {pid, process}}`, then binary output frames, then
 * `{id, result}` or `{id, error}`. The client sends stdin as binary frames and `eof`, `signal`,
 * `resize` and `hold` as calls naming the spawn's id, once it is `started`; these are not
 * answered (one refused is answered `{id, refused: error}`, its command running on). The
 * connection's close kills them.
 */
import type { WebSocket } from 'ws';
import { SnaplabError } from '../errors.js';
import type { Daemon } from './daemon.js';
import type { Caller } from './keys.js';
import type { Process } from './processes.js';
import { processSpec, pump, signalNumber, type OutputSink } from './routes-streams.js';
import { toSnaplab } from './http-errors.js';
import { failureMeans } from '../cleanup.js';

/** A binary frame's first byte: what it carries; then the call's id (uint32, big-endian), then the bytes. */
export const FRAME = { stdin: 0, stdout: 1, stderr: 2 } as const;
export const FRAME_HEAD = 5;

/** A binary frame of call `id`. */
export function frame(kind: number, id: number, data: Buffer): Buffer {
  const head = Buffer.allocUnsafe(FRAME_HEAD);
  head[0] = kind;
  head.writeUInt32BE(id, 1);
  return Buffer.concat([head, data]);
}

/** The call id of a binary frame, or undefined when it is too short to have one. */
export function frameId(b: Buffer): number | undefined {
  return b.length >= FRAME_HEAD ? b.readUInt32BE(1) : undefined;
}

/** A spawn's id: a whole number that fits a frame's 32 bits. */
export function spawnId(id: unknown): id is number {
  return Number.isInteger(id) && (id as number) >= 0 && (id as number) < 2 ** 32;
}

interface Running {
  p: Process;
  /** the client holds its output (`hold`): counted once on the process however often it says so */
  held: boolean;
  /** the sink's close listeners: run when the connection goes, dropped when the call ends */
  closers: (() => void)[];
}

/** One connection's spawns, by call id. */
export class RpcSpawns {
  private readonly calls = new Map<number, Running>();
  private closed = false;

  constructor(
    private readonly d: Daemon,
    private readonly ws: WebSocket,
    private readonly caller: Caller,
  ) {}

  /** Start one: resolves once it is started and told (its end is sent when it comes). */
  async start(id: number, call: Record<string, unknown>): Promise<void> {
    if (this.calls.has(id))
      throw new SnaplabError('BAD_INPUT', `rpc: call ${id} is running`, 'give each call an id of its own');
    const spec = processSpec(call);
    if (!spec.argv.length) throw new SnaplabError('BAD_INPUT', 'rpc: spawn needs argv', 'see docs/api.md, /rpc');
    const box = await this.d.sandbox(call.sandbox as string, this.caller);
    const p = await this.d.startProcess(this.caller, box, spec);
    // the connection went while it started: as for every call of it, the command is killed
    if (this.closed) return void p.handle?.kill(9);
    const run: Running = { p, held: false, closers: [] };
    this.calls.set(id, run);
    this.send({ id, started: { pid: await p.handle!.pid.catch(failureMeans(null)), process: p.id } });
    // its reader has had the end: kept a little for a late attach, as a streamed exec's
    pump(p, this.sink(id, run), 0, () => (p.keepMs = 30_000));
  }

  private sink(id: number, run: Running): OutputSink {
    const ws = this.ws;
    return {
      get open() {
        return ws.readyState === ws.OPEN;
      },
      get buffered() {
        return ws.bufferedAmount;
      },
      chunk: (stream, data) => ws.send(frame(FRAME[stream], id, data)),
      gap: (from, to) => this.send({ id, gap: { from, to } }),
      exit: (p) => {
        this.hold(run, false);
        this.calls.delete(id);
        const i = p.info();
        this.send(i.result ? { id, result: i.result, process: p.id } : { id, error: i.error });
      },
      // a reader that has read nothing for 30 s: its whole connection is let go (its calls are killed)
      tooSlow: () => ws.close(1008, 'reader too slow'),
      onClose: (fn) => void run.closers.push(fn),
    };
  }

  /** A binary frame: input for the spawn it names (a frame for none, or for one without stdin: dropped). */
  input(b: Buffer): void {
    const id = frameId(b);
    const h = id === undefined ? undefined : this.calls.get(id)?.p.handle;
    if (!h || b[0] !== FRAME.stdin) return;
    if (!h.write(b.subarray(FRAME_HEAD))) {
      // the whole connection waits for this command's input to drain (never rejects)
      this.ws.pause();
      void h.drained().then(() => this.ws.resume());
    }
  }

  /** `eof`, `signal`, `resize`, `hold` on a running spawn; false: not one of these ops. */
  control(m: { id?: unknown; op?: unknown; signal?: unknown; cols?: unknown; rows?: unknown; on?: unknown }): boolean {
    if (m.op !== 'eof' && m.op !== 'signal' && m.op !== 'resize' && m.op !== 'hold') return false;
    const run = spawnId(m.id) ? this.calls.get(m.id) : undefined;
    const h = run?.p.handle;
    // ended meanwhile: nothing to do
    if (!run || !h || run.p.ended) return true;
    try {
      if (m.op === 'eof') h.end();
      else if (m.op === 'signal') h.kill(signalNumber(m.signal));
      else if (m.op === 'hold') this.hold(run, m.on === true);
      else if (Number.isInteger(m.cols) && Number.isInteger(m.rows)) h.resize(m.cols as number, m.rows as number);
      else throw new SnaplabError('BAD_INPUT', 'rpc: resize needs whole cols and rows', 'see docs/api.md, /rpc');
    } catch (e) {
      this.send({ id: m.id, refused: toSnaplab(e).toJSON() });
    }
    return true;
  }

  private hold(run: Running, on: boolean): void {
    if (run.held !== on) run.p.hold(on);
    run.held = on;
  }

  /** The connection went: every spawn still running is killed, its reader let go. */
  close(): void {
    this.closed = true;
    for (const run of this.calls.values()) {
      this.hold(run, false);
      if (!run.p.ended) run.p.handle?.kill(9);
      for (const fn of run.closers) fn();
    }
    this.calls.clear();
  }

  private send(m: unknown): void {
    if (this.ws.readyState === this.ws.OPEN) this.ws.send(JSON.stringify(m));
  }
}
