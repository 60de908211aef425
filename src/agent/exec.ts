/**
 * One command run by the agent, as a state machine over its frames: started, output and stdin
 * credits, then exit (or an error, an abort, or the connection's end).
 */
import { handledElsewhere } from '../cleanup.js';
import { SnaplabError } from '../errors.js';
import { aborted, execErrorOf } from './agent-errors.js';
import { collected, type Collected } from './output-cap.js';
import {
  decodeError,
  decodeExit,
  decodeStarted,
  encodeExec,
  encodeResize,
  encodeU32,
  ExitFlag,
  MsgType,
  type Frame,
  type WindowSize,
} from './protocol.js';
import { STDIN_CHUNK, STDIN_WINDOW, StdinWindow } from './stdin-window.js';

export interface ExecRequest {
  /** Run as given: argv[0] is looked up in the PATH of `env`, no shell is involved. */
  argv: string[];
  /** The command's whole environment, "KEY=value" items. */
  env: string[];
  cwd?: string;
  /** "UID:GID[:G1,G2,...]" (numeric): the agent sets groups, gid and uid before exec */
  user?: string;
  /** On expiry the agent SIGKILLs the command's process group; the result says timedOut. */
  timeoutMs?: number;
  /** Give the command a stdin pipe fed by write()/end(); otherwise stdin is /dev/null. */
  stdin?: boolean;
  /**
   * Run the command on a pseudo-terminal of this size (protocol 1.2): it leads a new session
   * with the terminal as its controlling tty, its output (stdout and stderr alike) comes as
   * stdout, input (with stdin: true) goes to the terminal, resize() changes its size.
   */
  tty?: WindowSize;
  /**
   * (1.5) The command outlives this connection: when it closes the agent lets the command run on
   * (its output read and dropped) instead of killing it, lists it (`kept()`, with this tag, at most
   * 4096 bytes) and lets another connection take it on (`attach(pid)`).
   */
  keep?: { tag: string };
  /**
   * (1.8) The result waits for the end of the command's stdout and stderr, not only its process:
   * what it left running in the background and still writes there is read until it closes them
   * (as Go's exec and E2B's envd wait). A timeout, a SIGKILL or SIGTERM through kill(), or this
   * connection's end stops the wait. Pipes only (a terminal's end is its process's); an agent
   * before 1.8 ignores it.
   */
  waitOutput?: boolean;
}

export interface ExecOptions {
  onStdout?(b: Buffer): void;
  onStderr?(b: Buffer): void;
  /** Aborting SIGKILLs the command and rejects with ABORTED. */
  signal?: AbortSignal;
}

export interface ExecUsage {
  userMs: number;
  systemMs: number;
  maxRssKb: number;
  wallMs: number;
}

export interface ExecResult {
  /** Exit code; 128+N when killed by signal N; 124 when timed out; 127 not found; 126 not executable. */
  exitCode: number;
  signal: number | null;
  timedOut: boolean;
  notFound: boolean;
  /** Collected only when no onStdout callback was given (else empty). */
  stdout: Buffer;
  /** Collected only when no onStderr callback was given (else empty). */
  stderr: Buffer;
  /** collected output went past MAX_COLLECTED bytes on a stream; the rest was dropped (stream it instead) */
  truncated: boolean;
  usage: ExecUsage;
}

export interface ExecHandle {
  pid: Promise<number>;
  /**
   * bytes of output the command had written before this handle's first (0 for a command started
   * here; for an attach, what it wrote before, held or dropped): resolves with `pid`
   */
  since: Promise<number>;
  /**
   * Queues input for the command; false once 4 MiB are unacknowledged or waiting (protocol 1.2
   * credits; with an older agent, the socket's queue): wait for drained() before writing more.
   */
  write(b: Buffer | string): boolean;
  /** resolves when the input in flight or waiting is below 2 MiB again (or the exec ended) */
  drained(): Promise<void>;
  end(): void;
  kill(sig: number): void;
  /** a tty exec's new terminal size (the command gets SIGWINCH); ignored otherwise */
  resize(size: WindowSize): void;
  /**
   * Hold (true) or release this exec's output at the agent (HOLD_OUTPUT, 1.2): its command blocks
   * on a full pipe meanwhile, the connection's other execs go on. Only to an agent's own
   * connection, or a VM's relay from 1.7 (an older one would route it as a new request).
   */
  hold(on: boolean): void;
  result: Promise<ExecResult>;
}

/** A request waiting for its answer frames, as the connection dispatches them by id. */
export interface Pending {
  onFrame(f: Frame): void;
  onClose(err: SnaplabError): void;
}

/** What an exec needs of its connection. */
export interface ExecChannel {
  /** the protocol minor the agent answered with */
  readonly minor: number;
  /** why the connection is gone, or null */
  closedError(): SnaplabError | null;
  /** throws when the connection is gone */
  send(type: number, id: number, payload: Buffer): void;
  /** a send whose failure the connection reports itself (it rejects every pending request) */
  sendQuiet(type: number, id: number, payload: Buffer): void;
  listen(id: number, p: Pending): void;
  forget(id: number): void;
  /** bytes waiting in the socket's send queue */
  queued(): number;
  /** resolves once the socket's send queue is below STDIN_WINDOW (or the connection is gone) */
  drained(): Promise<void>;
}

export const SIGKILL = 9;

/** Starts `req` as request `id` on `ch`: STARTED, then output and stdin acks, then EXIT (or ERROR). */
export function startExec(ch: ExecChannel, id: number, req: ExecRequest, opts: ExecOptions): ExecHandle {
  const first = { type: MsgType.EXEC, payload: encodeExec(req), label: `exec of ${req.argv[0] ?? '?'}` };
  return new Exec(ch, id, first, { stdin: req.stdin === true, tty: req.tty !== undefined }, opts).start();
}

/**
 * Takes on the kept exec `pid` (1.5) as request `id` on `ch`, as if it had started there: STARTED,
 * its output from now on, then EXIT. Its stdin and terminal are the agent's to say (STARTED's
 * flags); until then input and resizes are sent, and the agent drops what does not apply.
 */
export function attachExec(ch: ExecChannel, id: number, pid: number, opts: ExecOptions): ExecHandle {
  const first = { type: MsgType.ATTACH, payload: encodeU32(pid), label: `attach to command ${pid}` };
  return new Exec(ch, id, first, { stdin: true, tty: true }, opts).start();
}

/** The request that starts an exec's frames (EXEC, or ATTACH), and how errors name it. */
interface First {
  type: number;
  payload: Buffer;
  label: string;
}

class Exec {
  readonly pid: Promise<number>;
  private since = 0;
  private readonly sinceKnown: Promise<number>;
  readonly result: Promise<ExecResult>;
  private resolvePid!: (pid: number) => void;
  private rejectPid!: (e: unknown) => void;
  private resolveResult!: (r: ExecResult) => void;
  private rejectResult!: (e: unknown) => void;
  private readonly out: Collected = { chunks: [], bytes: 0 };
  private readonly err: Collected = { chunks: [], bytes: 0 };
  private truncated = false;
  private started = false;
  private settled = false;
  private ended = false;
  /** stdin flow control by credits (1.2 agents); null: the socket's queue stands in for it */
  private readonly stdin: StdinWindow | null;

  constructor(
    private readonly ch: ExecChannel,
    private readonly id: number,
    private readonly first: First,
    /** what the command has: a stdin pipe, a terminal */
    private readonly has: { stdin: boolean; tty: boolean },
    private readonly opts: ExecOptions,
  ) {
    this.pid = new Promise<number>((res, rej) => {
      this.resolvePid = res;
      this.rejectPid = rej;
    });
    this.pid.catch(handledElsewhere); // a caller that only awaits result must not see an unhandled rejection
    this.sinceKnown = this.pid.then(() => this.since);
    this.sinceKnown.catch(handledElsewhere);
    this.result = new Promise<ExecResult>((res, rej) => {
      this.resolveResult = res;
      this.rejectResult = rej;
    });
    this.stdin =
      ch.minor >= 2
        ? new StdinWindow(
            (b) => ch.sendQuiet(MsgType.STDIN, id, b),
            () => this.settled,
          )
        : null;
  }

  start(): ExecHandle {
    const handle = this.handle();
    if (this.opts.signal?.aborted) {
      this.fail(aborted(this.first.label));
      return handle;
    }
    const closed = this.ch.closedError();
    if (closed) {
      this.fail(closed);
      return handle;
    }
    this.ch.listen(this.id, { onFrame: (f) => this.onFrame(f), onClose: (e) => this.fail(e) });
    this.opts.signal?.addEventListener('abort', this.onAbort, { once: true });
    try {
      this.ch.send(this.first.type, this.id, this.first.payload);
    } catch (e) {
      this.fail(e);
    }
    return handle;
  }

  private handle(): ExecHandle {
    const { ch, id, has } = this;
    return {
      pid: this.pid,
      since: this.sinceKnown,
      result: this.result,
      write: (b) => this.write(b),
      drained: () => (this.stdin ? this.stdin.drained(this.settled || ch.closedError() !== null) : ch.drained()),
      resize: (size) => {
        if (!this.settled && has.tty) ch.sendQuiet(MsgType.RESIZE, id, encodeResize(size));
      },
      end: () => {
        if (this.settled || this.ended || !has.stdin) return;
        this.ended = true;
        if (this.stdin) this.stdin.end();
        else ch.sendQuiet(MsgType.STDIN, id, Buffer.alloc(0));
      },
      kill: (sig) => {
        if (!this.settled) ch.sendQuiet(MsgType.SIGNAL, id, encodeU32(sig));
      },
      hold: (on) => {
        if (!this.settled) ch.sendQuiet(MsgType.HOLD_OUTPUT, id, encodeU32(on ? 1 : 0));
      },
    };
  }

  private write(b: Buffer | string): boolean {
    if (this.settled || this.ended) return true;
    if (!this.has.stdin)
      throw new SnaplabError('BAD_INPUT', 'exec was started without stdin: true; cannot write to it');
    const buf = typeof b === 'string' ? Buffer.from(b) : b;
    // An empty STDIN frame means EOF on the wire, so empty writes are skipped.
    if (this.stdin) return this.stdin.write(buf);
    for (let o = 0; o < buf.length; o += STDIN_CHUNK) {
      this.ch.sendQuiet(MsgType.STDIN, this.id, buf.subarray(o, o + STDIN_CHUNK));
    }
    return this.ch.queued() < STDIN_WINDOW;
  }

  private readonly onAbort = (): void => {
    if (this.settled) return;
    this.ch.sendQuiet(MsgType.SIGNAL, this.id, encodeU32(SIGKILL));
    this.fail(aborted(this.first.label));
  };

  private settle(): void {
    this.settled = true;
    this.ch.forget(this.id);
    this.opts.signal?.removeEventListener('abort', this.onAbort);
    this.stdin?.wake();
  }

  private fail(e: unknown): void {
    if (this.settled) return;
    this.settle();
    this.rejectPid(e);
    this.rejectResult(e);
  }

  private onFrame(f: Frame): void {
    switch (f.type) {
      case MsgType.STARTED:
        this.started = true;
        // an ATTACH's STARTED says what the command has (1.5)
        if (this.first.type === MsgType.ATTACH && f.payload.length >= 8) {
          const flags = f.payload.readUInt32LE(4);
          this.has.tty = (flags & 2) !== 0;
          this.has.stdin = (flags & 4) !== 0;
          // the machine's count of its output: one past what a number holds exactly is not believed
          const since = f.payload.length >= 16 ? f.payload.readBigUInt64LE(8) : 0n;
          this.since = since <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(since) : 0;
        }
        this.resolvePid(decodeStarted(f.payload));
        break;
      case MsgType.STDIN_ACK:
        this.stdin?.ack(f.payload.length >= 4 ? f.payload.readUInt32LE(0) : 0);
        break;
      case MsgType.STDOUT:
        if (this.opts.onStdout) this.opts.onStdout(f.payload);
        else if (collected(this.out, f.payload)) this.truncated = true;
        break;
      case MsgType.STDERR:
        if (this.opts.onStderr) this.opts.onStderr(f.payload);
        else if (collected(this.err, f.payload)) this.truncated = true;
        break;
      case MsgType.EXIT:
        this.exited(f.payload);
        break;
      case MsgType.ERROR: {
        const e = decodeError(f.payload);
        const err = execErrorOf(e.errno, e.message);
        // after STARTED an ERROR answers one of our STDIN/SIGNAL/RESIZE frames: the exec is
        // failed here, so its command must not run on unobserved. A lost tie (a VM relay's new
        // session) has nothing of it there to signal
        if (this.started && err.code !== 'AGENT_UNREACHABLE')
          this.ch.sendQuiet(MsgType.SIGNAL, this.id, encodeU32(SIGKILL));
        this.fail(err);
        break;
      }
      default:
        throw new SnaplabError('AGENT_PROTOCOL', `unexpected frame type 0x${f.type.toString(16)} for an exec`);
    }
  }

  private exited(payload: Buffer): void {
    const x = decodeExit(payload);
    this.settle();
    const timedOut = (x.flags & ExitFlag.TIMED_OUT) !== 0;
    const signal = x.signal > 0 ? x.signal : null;
    this.resolvePid(0); // no-op: STARTED always comes first
    this.resolveResult({
      exitCode: timedOut ? 124 : signal !== null ? 128 + signal : x.code,
      signal,
      timedOut,
      notFound: (x.flags & ExitFlag.NOT_FOUND) !== 0,
      stdout: Buffer.concat(this.out.chunks),
      stderr: Buffer.concat(this.err.chunks),
      truncated: this.truncated,
      usage: {
        userMs: x.userUs / 1000,
        systemMs: x.sysUs / 1000,
        maxRssKb: x.maxRssKb,
        wallMs: x.wallUs / 1000,
      },
    });
  }
}
