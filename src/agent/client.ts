/**
 * Host side of the agent protocol: one connection, many concurrent requests multiplexed by id.
 */
import { randomInt } from 'node:crypto';
import { createConnection, type Socket } from 'node:net';
import { constants as osConstants } from 'node:os';
import { SnaplabError } from '../errors.js';
import {
  decodeError,
  decodeExit,
  decodeHello,
  decodeStarted,
  encodeExec,
  encodeFilePut,
  encodeFrame,
  encodeResize,
  encodeSetClock,
  encodeIdentity,
  type Identity,
  encodeU32,
  ExitFlag,
  HEADER_SIZE,
  FrameDecoder,
  MsgType,
  PROTOCOL_MAJOR,
  type Frame,
  type Hello,
  type WindowSize,
} from './protocol.js';

export interface ConnectOptions {
  /** How long to wait for the socket to accept and the agent to say HELLO. */
  timeoutMs: number;
  signal?: AbortSignal;
  /**
   * Start a new session on a long-lived stream (a VM's virtio-serial port behind QEMU's chardev
   * socket): send RESET first, and take the HELLO answering it as the session start. Whatever
   * the agent sent before it (leftovers of an earlier host connection, even a torn frame, or an
   * unsolicited HELLO) is skipped; frames for unknown ids are ignored. The agent kills the
   * execs of the earlier session. See docs/agent-protocol.md, "Stream transport".
   */
  reset?: boolean;
}

/** A HELLO is 8 bytes plus the version string: anything longer is not one. */
const MAX_HELLO = 4096;

/**
 * Looks for the frame answering RESET `id` (HELLO, or ERROR from an agent that lacks RESET) in
 * bytes whose start may be torn. Returns its offset, or -1 with `keep` set to how many trailing
 * bytes may still begin it.
 */
function findResetAnswer(b: Buffer, id: number): { at: number; keep: number } {
  for (let i = 0; i + HEADER_SIZE <= b.length; i++) {
    const type = b.readUInt16LE(i + 4);
    if (
      (type !== MsgType.HELLO && type !== MsgType.ERROR) ||
      b.readUInt16LE(i + 6) !== 0 ||
      b.readUInt32LE(i + 8) !== id
    )
      continue;
    const len = b.readUInt32LE(i);
    if (len >= 4 && len <= MAX_HELLO) return { at: i, keep: 0 };
  }
  return { at: -1, keep: Math.min(b.length, HEADER_SIZE - 1) };
}

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
  result: Promise<ExecResult>;
}

interface Pending {
  onFrame(f: Frame): void;
  onClose(err: SnaplabError): void;
}

const SIGKILL = 9;
const STDIN_CHUNK = 1024 * 1024;
/**
 * Flow control of stdin (protocol 1.2): at most this much of an exec's stdin may be sent ahead of
 * the agent's STDIN_ACKs; write() says "wait" at it and drained() resolves below half of it. With
 * an older agent (no ACKs) the socket's own queue stands in for it.
 */
const STDIN_WINDOW = 4 * 1024 * 1024;
const errnoNames = new Map<number, string>(Object.entries(osConstants.errno).map(([k, v]) => [v, k]));

function agentError(p: Buffer): SnaplabError {
  const { errno, message } = decodeError(p);
  return agentErrorOf(errno, message);
}

/** The error for an agent's ERROR reply (errno and its message), as every exec reports it. */
export function agentErrorOf(errno: number, message: string): SnaplabError {
  const name = errnoNames.get(errno);
  return new SnaplabError('AGENT_ERROR', `agent: ${message}${name ? ` (${name})` : ` (errno ${errno})`}`);
}

function aborted(what: string): SnaplabError {
  return new SnaplabError('ABORTED', `${what} was aborted`);
}

/** Output collected into a result is capped: a command printing without end must not take the host's memory. */
export const MAX_COLLECTED = 16 * 1024 * 1024;

interface Collected {
  chunks: Buffer[];
  bytes: number;
}

/** Keep what fits under the cap; true when something was dropped. */
function collected(c: Collected, b: Buffer): boolean {
  const room = MAX_COLLECTED - c.bytes;
  if (room <= 0) return b.length > 0;
  const keep = b.length <= room ? b : b.subarray(0, room);
  c.chunks.push(keep);
  c.bytes += keep.length;
  return keep.length < b.length;
}

/** STATUS: counts (processes, shm, sem, msg) and the entries of the sandbox's in-memory directories. */
export interface AgentStatus {
  counts: Record<string, number>;
  /** directory → its entries, sorted and comma-joined ("-" when unreadable) */
  entries: Record<string, string>;
}

export class AgentClient implements AsyncDisposable {
  readonly agentVersion: string;
  readonly protocolVersion: string;
  /** The agent's pid as it sees itself (1 when it is the pid namespace's init). */
  readonly agentPid: number;

  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  private closedError: SnaplabError | null = null;
  private corked = false;

  private readonly protocolMinor: number;

  private constructor(
    private readonly socket: Socket,
    private readonly decoder: FrameDecoder,
    hello: Hello,
    firstId = 1,
  ) {
    this.nextId = firstId;
    this.agentVersion = hello.agentVersion;
    this.protocolVersion = `${hello.major}.${hello.minor}`;
    this.protocolMinor = hello.minor;
    this.agentPid = hello.pid;
    socket.on('data', (chunk: Buffer) => this.onData(chunk));
    socket.on('error', (e: Error) => {
      this.closedError ??= new SnaplabError(
        'AGENT_UNREACHABLE',
        `connection to agent failed: ${e.message}`,
        undefined,
        { cause: e },
      );
    });
    socket.on('close', () => this.failAll());
  }

  /** Connects, waits for HELLO and refuses an agent whose protocol major version differs. */
  static connect(socketPath: string, opts: ConnectOptions): Promise<AgentClient> {
    return new Promise((resolve, reject) => {
      if (opts.signal?.aborted) {
        reject(aborted('connecting to the agent'));
        return;
      }
      const sock = createConnection({ path: socketPath });
      const decoder = new FrameDecoder();
      // With reset: a random id, so that the answer to an earlier host's RESET cannot pass for ours.
      const resetId = opts.reset ? randomInt(1, 0xffffffff) : 0;
      let pre: Buffer = Buffer.alloc(0); // reset: bytes before the HELLO answering our RESET
      let synced = !opts.reset;
      let done = false;
      const cleanup = (): void => {
        done = true;
        clearTimeout(timer);
        opts.signal?.removeEventListener('abort', onAbort);
        sock.off('data', onData);
        sock.off('error', onError);
        sock.off('close', onClose);
        sock.off('connect', onConnect);
      };
      const fail = (e: SnaplabError): void => {
        if (done) return;
        cleanup();
        sock.destroy();
        reject(e);
      };
      const onAbort = (): void => fail(aborted('connecting to the agent'));
      const onError = (e: NodeJS.ErrnoException): void =>
        fail(
          new SnaplabError(
            'AGENT_UNREACHABLE',
            `cannot connect to agent at ${socketPath}: ${e.code ?? e.message}`,
            'is the sandbox running? its agent may have died',
            { cause: e },
          ),
        );
      const onClose = (): void =>
        fail(new SnaplabError('AGENT_UNREACHABLE', `agent at ${socketPath} closed the connection before HELLO`));
      const onConnect = (): void => {
        if (opts.reset) sock.write(encodeFrame(MsgType.RESET, resetId));
      };
      const onData = (chunk: Buffer): void => {
        if (!synced) {
          // Skip everything up to the answer to our RESET; the decoder starts there.
          pre = pre.length ? Buffer.concat([pre, chunk]) : chunk;
          const { at, keep } = findResetAnswer(pre, resetId);
          if (at < 0) {
            pre = pre.subarray(pre.length - keep);
            return;
          }
          synced = true;
          chunk = pre.subarray(at);
          pre = Buffer.alloc(0);
        }
        let frames: Frame[];
        try {
          frames = decoder.push(chunk);
        } catch (e) {
          fail(e as SnaplabError);
          return;
        }
        const first = frames[0];
        if (first && opts.reset && first.type === MsgType.ERROR) {
          fail(
            new SnaplabError(
              'AGENT_PROTOCOL',
              `agent at ${socketPath} refused RESET: ${decodeError(first.payload).message}`,
              'rebuild the agent with this snaplab (make -C native)',
            ),
          );
          return;
        }
        if (!first) return;
        if (first.type !== MsgType.HELLO) {
          fail(
            new SnaplabError('AGENT_PROTOCOL', `agent's first frame is type 0x${first.type.toString(16)}, not HELLO`),
          );
          return;
        }
        let hello: Hello;
        try {
          hello = decodeHello(first.payload);
        } catch (e) {
          fail(e as SnaplabError);
          return;
        }
        if (hello.major !== PROTOCOL_MAJOR) {
          fail(
            new SnaplabError(
              'AGENT_PROTOCOL',
              `agent speaks protocol ${hello.major}.${hello.minor}, this snaplab speaks ${PROTOCOL_MAJOR}.x`,
              'rebuild the agent with this snaplab (make -C native) and recreate the sandbox',
            ),
          );
          return;
        }
        cleanup();
        const client = new AgentClient(
          sock,
          decoder,
          hello,
          opts.reset ? (resetId >= 0xffffffff ? 1 : resetId + 1) : 1,
        );
        resolve(client);
        client.dispatch(frames.slice(1));
      };
      const timer = setTimeout(
        () =>
          fail(
            new SnaplabError(
              'TIMEOUT',
              `agent at ${socketPath} did not answer${opts.reset ? ' RESET' : ''} within ${opts.timeoutMs} ms`,
            ),
          ),
        opts.timeoutMs,
      );
      opts.signal?.addEventListener('abort', onAbort, { once: true });
      sock.on('connect', onConnect);
      sock.on('data', onData);
      sock.on('error', onError);
      sock.on('close', onClose);
    });
  }

  /** Round trip to the agent; resolves to the round-trip time in ms. */
  async ping(): Promise<number> {
    const t0 = performance.now();
    await this.call(MsgType.PING, Buffer.alloc(0), MsgType.PONG);
    return performance.now() - t0;
  }

  exec(req: ExecRequest, opts: ExecOptions = {}): ExecHandle {
    // a 1.0 agent ignores the field it does not know: it would run the command as root
    if (req.user !== undefined && this.protocolMinor < 1) throw this.tooOld('run a command as another user', 1);
    // a 1.1 agent would skip the tty field and run the command on pipes
    if (req.tty !== undefined && this.protocolMinor < 2) throw this.tooOld('run a command on a terminal', 2);
    let resolvePid!: (pid: number) => void;
    let rejectPid!: (e: unknown) => void;
    let resolveResult!: (r: ExecResult) => void;
    let rejectResult!: (e: unknown) => void;
    const pid = new Promise<number>((res, rej) => ((resolvePid = res), (rejectPid = rej)));
    pid.catch(() => {}); // a caller that only awaits result must not see an unhandled rejection
    const result = new Promise<ExecResult>((res, rej) => ((resolveResult = res), (rejectResult = rej)));
    const out: Collected = { chunks: [], bytes: 0 };
    const err: Collected = { chunks: [], bytes: 0 };
    let truncated = false;
    let started = false;
    let settled = false;
    let ended = false;
    // stdin sent and not yet acknowledged (1.2 agents), and who waits for it to fall
    const credits = this.protocolMinor >= 2;
    let unacked = 0;
    const backlog: Buffer[] = [];
    let backlogBytes = 0;
    let endPending = false;
    let waiters: (() => void)[] = [];
    // sends what the window has room for, in frames of at most STDIN_CHUNK; then a pending end
    const pump = (): void => {
      while (backlog.length && unacked < STDIN_WINDOW && !settled) {
        const room = Math.min(STDIN_CHUNK, STDIN_WINDOW - unacked);
        const head = backlog[0]!;
        const part = head.length <= room ? head : head.subarray(0, room);
        if (part.length === head.length) backlog.shift();
        else backlog[0] = head.subarray(room);
        backlogBytes -= part.length;
        unacked += part.length;
        this.sendQuiet(MsgType.STDIN, id, part);
      }
      if (endPending && !backlog.length) {
        endPending = false;
        this.sendQuiet(MsgType.STDIN, id, Buffer.alloc(0));
      }
    };
    const wake = (): void => {
      const w = waiters;
      waiters = [];
      for (const f of w) f();
    };
    const id = this.allocId();
    const settle = (): void => {
      settled = true;
      this.pending.delete(id);
      opts.signal?.removeEventListener('abort', onAbort);
      wake();
    };
    const fail = (e: unknown): void => {
      if (settled) return;
      settle();
      rejectPid(e);
      rejectResult(e);
    };
    const onAbort = (): void => {
      if (settled) return;
      this.sendQuiet(MsgType.SIGNAL, id, encodeU32(SIGKILL));
      fail(aborted(`exec of ${req.argv[0] ?? '?'}`));
    };
    const handle: ExecHandle = {
      pid,
      result,
      write: (b) => {
        if (settled || ended) return true;
        if (!req.stdin) throw new SnaplabError('BAD_INPUT', 'exec was started without stdin: true; cannot write to it');
        const buf = typeof b === 'string' ? Buffer.from(b) : b;
        // An empty STDIN frame means EOF on the wire, so empty writes are skipped.
        if (!credits) {
          for (let o = 0; o < buf.length; o += STDIN_CHUNK)
            this.sendQuiet(MsgType.STDIN, id, buf.subarray(o, o + STDIN_CHUNK));
          return this.socket.writableLength < STDIN_WINDOW;
        }
        // what the window has no room for waits here, on the host, and goes as ACKs come
        if (buf.length) backlog.push(buf);
        backlogBytes += buf.length;
        pump();
        return unacked + backlogBytes < STDIN_WINDOW;
      },
      drained: () => {
        if (!credits) return this.drained();
        if (settled || this.closedError || unacked + backlogBytes < STDIN_WINDOW / 2) return Promise.resolve();
        return new Promise<void>((resolve) => waiters.push(resolve));
      },
      resize: (size) => {
        if (!settled && req.tty) this.sendQuiet(MsgType.RESIZE, id, encodeResize(size));
      },
      end: () => {
        if (settled || ended || !req.stdin) return;
        ended = true;
        endPending = true; // after what still waits for the window
        pump();
      },
      kill: (sig) => {
        if (!settled) this.sendQuiet(MsgType.SIGNAL, id, encodeU32(sig));
      },
    };
    if (opts.signal?.aborted) {
      fail(aborted(`exec of ${req.argv[0] ?? '?'}`));
      return handle;
    }
    if (this.closedError) {
      fail(this.closedError);
      return handle;
    }
    this.pending.set(id, {
      onFrame: (f) => {
        switch (f.type) {
          case MsgType.STARTED:
            started = true;
            resolvePid(decodeStarted(f.payload));
            break;
          case MsgType.STDIN_ACK:
            unacked = Math.max(0, unacked - (f.payload.length >= 4 ? f.payload.readUInt32LE(0) : 0));
            pump();
            if (unacked + backlogBytes < STDIN_WINDOW / 2) wake();
            break;
          case MsgType.STDOUT:
            if (opts.onStdout) opts.onStdout(f.payload);
            else if (collected(out, f.payload)) truncated = true;
            break;
          case MsgType.STDERR:
            if (opts.onStderr) opts.onStderr(f.payload);
            else if (collected(err, f.payload)) truncated = true;
            break;
          case MsgType.EXIT: {
            const x = decodeExit(f.payload);
            settle();
            const timedOut = (x.flags & ExitFlag.TIMED_OUT) !== 0;
            const signal = x.signal > 0 ? x.signal : null;
            resolvePid(0); // no-op: STARTED always comes first
            resolveResult({
              exitCode: timedOut ? 124 : signal !== null ? 128 + signal : x.code,
              signal,
              timedOut,
              notFound: (x.flags & ExitFlag.NOT_FOUND) !== 0,
              stdout: Buffer.concat(out.chunks),
              stderr: Buffer.concat(err.chunks),
              truncated,
              usage: {
                userMs: x.userUs / 1000,
                systemMs: x.sysUs / 1000,
                maxRssKb: x.maxRssKb,
                wallMs: x.wallUs / 1000,
              },
            });
            break;
          }
          case MsgType.ERROR:
            // after STARTED an ERROR answers one of our STDIN/SIGNAL/RESIZE frames: the exec is
            // failed here, so its command must not run on unobserved
            if (started) this.sendQuiet(MsgType.SIGNAL, id, encodeU32(SIGKILL));
            fail(agentError(f.payload));
            break;
          default:
            throw new SnaplabError('AGENT_PROTOCOL', `unexpected frame type 0x${f.type.toString(16)} for an exec`);
        }
      },
      onClose: fail,
    });
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      this.send(MsgType.EXEC, id, encodeExec(req));
    } catch (e) {
      fail(e);
    }
    return handle;
  }

  /** Resolves once the socket's send queue is below STDIN_WINDOW (or the connection is gone). */
  drained(): Promise<void> {
    if (this.socket.writableLength < STDIN_WINDOW || this.socket.destroyed) return Promise.resolve();
    return new Promise((resolve) => {
      const done = (): void => {
        this.socket.off('drain', done);
        this.socket.off('close', done);
        resolve();
      };
      this.socket.on('drain', done);
      this.socket.on('close', done);
    });
  }

  /** Stops (or resumes) reading the agent's output: a consumer slower than the command. */
  pauseOutput(paused: boolean): void {
    if (paused) this.socket.pause();
    else this.socket.resume();
  }

  /** Throws AGENT_PROTOCOL unless the agent speaks at least 1.minor (what: what needs it). */
  requireMinor(minor: number, what: string): void {
    if (this.protocolMinor < minor) throw this.tooOld(what, minor);
  }

  private tooOld(what: string, minor: number): SnaplabError {
    return new SnaplabError(
      'AGENT_PROTOCOL',
      `the agent speaks protocol ${this.protocolVersion}, which cannot ${what} (1.${minor} can)`,
      'recreate the machine with this snaplab (its agent is the one it was raised with)',
    );
  }

  /** Writes a file atomically (temp + rename), creating parent directories. */
  async putFile(path: string, data: Buffer, mode = 0o644): Promise<void> {
    await this.call(MsgType.FILE_PUT, encodeFilePut(path, data, mode), MsgType.OK);
  }

  async getFile(path: string): Promise<Buffer> {
    return this.call(MsgType.FILE_GET, Buffer.from(path, 'utf8'), MsgType.DATA);
  }

  /** Sets CLOCK_REALTIME in the sandbox; fails with EPERM where the sandbox shares the host's clock. */
  /**
   * What is left inside the sandbox that may not persist between executions: processes other
   * than the agent, and System V IPC objects (visible only from inside the IPC namespace).
   */
  async status(): Promise<AgentStatus> {
    const data = await this.call(MsgType.STATUS, Buffer.alloc(0), MsgType.DATA);
    const counts: Record<string, number> = {};
    const entries: Record<string, string> = {};
    for (const line of data.toString().split('\n')) {
      const [k, a, b] = line.split(' ');
      if (k === 'entries' && a) entries[a] = b ?? '';
      else if (k && a !== undefined) counts[k] = Number(a);
    }
    return { counts, entries };
  }

  async setClock(ns: bigint): Promise<void> {
    await this.call(MsgType.SET_CLOCK, encodeSetClock(ns), MsgType.OK);
  }

  /**
   * A restored machine's own name, machine id and fresh entropy, set by the agent itself (1.3).
   * An agent that does not answer within `timeoutMs` is TIMEOUT (the connection is then unusable).
   */
  async setIdentity(identity: Identity, timeoutMs = 30_000): Promise<void> {
    this.requireMinor(3, "set a machine's identity");
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        this.socket.destroy();
        reject(
          new SnaplabError(
            'TIMEOUT',
            `the agent did not answer IDENTITY within ${timeoutMs} ms`,
            "see the machine's console (`snaplab logs`)",
          ),
        );
      }, timeoutMs);
    });
    try {
      await Promise.race([this.call(MsgType.IDENTITY, encodeIdentity(identity), MsgType.OK), late]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** The protocol minor the agent answered with (what it can do). */
  get minor(): number {
    return this.protocolMinor;
  }

  /** Ends the connection; the agent kills the execs this connection started. */
  async close(): Promise<void> {
    if (this.socket.destroyed) return;
    await new Promise<void>((resolve) => {
      const t = setTimeout(() => this.socket.destroy(), 1000);
      this.socket.once('close', () => {
        clearTimeout(t);
        resolve();
      });
      this.socket.end();
    });
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  private call(type: number, payload: Buffer, expect: number): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      if (this.closedError) {
        reject(this.closedError);
        return;
      }
      const id = this.allocId();
      this.pending.set(id, {
        onFrame: (f) => {
          this.pending.delete(id);
          if (f.type === expect) resolve(f.payload);
          else if (f.type === MsgType.ERROR) reject(agentError(f.payload));
          else
            reject(
              new SnaplabError(
                'AGENT_PROTOCOL',
                `expected frame type 0x${expect.toString(16)}, got 0x${f.type.toString(16)}`,
              ),
            );
        },
        onClose: reject,
      });
      try {
        this.send(type, id, payload);
      } catch (e) {
        this.pending.delete(id);
        reject(e);
      }
    });
  }

  private allocId(): number {
    const id = this.nextId;
    this.nextId = this.nextId >= 0xffffffff ? 1 : this.nextId + 1; // 0 is HELLO's
    return id;
  }

  private send(type: number, id: number, payload: Buffer): void {
    if (this.closedError) throw this.closedError;
    const frame = encodeFrame(type, id, payload);
    // Frames sent in one tick go out in one write.
    if (!this.corked) {
      this.corked = true;
      this.socket.cork();
      process.nextTick(() => {
        this.corked = false;
        this.socket.uncork();
      });
    }
    this.socket.write(frame);
  }

  private sendQuiet(type: number, id: number, payload: Buffer): void {
    try {
      this.send(type, id, payload);
    } catch {
      // the connection is gone; pending requests are rejected by failAll
    }
  }

  private onData(chunk: Buffer): void {
    let frames: Frame[];
    try {
      frames = this.decoder.push(chunk);
    } catch (e) {
      this.closedError = e as SnaplabError;
      this.socket.destroy();
      return;
    }
    this.dispatch(frames);
  }

  private dispatch(frames: Frame[]): void {
    for (const f of frames) {
      if (f.type === MsgType.HELLO && f.id === 0) {
        // A stream agent greets a host it sees (re)connect after a hang-up: the session this
        // client belongs to is over (its execs were killed). Fail loudly instead of waiting forever.
        this.closedError = new SnaplabError(
          'AGENT_UNREACHABLE',
          'the agent started a new session on its stream (the host side was disconnected)',
          'reconnect with { reset: true }',
        );
        this.socket.destroy();
        return;
      }
      const p = this.pending.get(f.id);
      if (!p) continue; // e.g. output of an exec the caller aborted, or (stream) an unsolicited HELLO
      try {
        p.onFrame(f);
      } catch (e) {
        // A throwing callback or a malformed payload ends that request only.
        this.pending.delete(f.id);
        this.sendQuiet(MsgType.SIGNAL, f.id, encodeU32(SIGKILL));
        p.onClose(e instanceof SnaplabError ? e : new SnaplabError('INTERNAL', String(e), undefined, { cause: e }));
      }
    }
  }

  private failAll(): void {
    const n = this.pending.size;
    const base = this.closedError;
    const err =
      base?.code === 'AGENT_PROTOCOL'
        ? base
        : new SnaplabError(
            'AGENT_UNREACHABLE',
            `connection to agent closed${n ? ` with ${n} request(s) pending` : ''}${base ? `: ${base.message}` : ''}`,
            'the agent or its sandbox may have died',
          );
    this.closedError = err;
    const all = [...this.pending.values()];
    this.pending.clear();
    for (const p of all) p.onClose(err);
  }
}
