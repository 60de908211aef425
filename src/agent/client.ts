/**
 * Host side of the agent protocol: one connection, many concurrent requests multiplexed by id.
 * Opening it is handshake.ts, a command's run exec.ts (its stdin window stdin-window.ts, its
 * collected output output-cap.ts).
 */
import type { Socket } from 'node:net';
import { SnaplabError } from '../errors.js';
import { agentError } from './agent-errors.js';
import {
  SIGKILL,
  attachExec,
  startExec,
  type ExecChannel,
  type ExecHandle,
  type ExecOptions,
  type ExecRequest,
  type Pending,
} from './exec.js';
import { greet, type ConnectOptions } from './handshake.js';
import { type Deadline, deadline } from '../timing/deadline.js';
import {
  decodeKept,
  type KeptExec,
  TAG_MAX,
  encodeFilePut,
  encodeFrame,
  encodeSetClock,
  encodeIdentity,
  type Identity,
  encodeU32,
  type FrameDecoder,
  MsgType,
  type Frame,
  type Hello,
} from './protocol.js';
import { STDIN_WINDOW } from './stdin-window.js';

export { agentErrorOf } from './agent-errors.js';
export type { ExecHandle, ExecOptions, ExecRequest, ExecResult, ExecUsage } from './exec.js';
export type { ConnectOptions } from './handshake.js';
export type { KeptExec } from './protocol.js';
export { MAX_COLLECTED } from './output-cap.js';

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
  /** what exec.ts sees of this connection */
  private readonly channel: ExecChannel;

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
    this.channel = {
      minor: hello.minor,
      closedError: () => this.closedError,
      send: (type, id, payload) => this.send(type, id, payload),
      sendQuiet: (type, id, payload) => this.sendQuiet(type, id, payload),
      listen: (id, p) => {
        this.pending.set(id, p);
        this.held();
      },
      forget: (id) => {
        this.pending.delete(id);
        this.held();
      },
      queued: () => this.socket.writableLength,
      drained: () => this.drained(),
    };
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
    this.held();
  }

  /**
   * An idle connection does not keep the process alive (as Node's HTTP agent lets go of a free
   * socket): a script that leaves its sandboxes running ends when its work does. A request or a
   * command under way holds it.
   */
  private held(): void {
    // (a destroyed socket has no handle: its ref and unref would wait for a 'connect' that never comes)
    if (this.socket.destroyed) return;
    if (this.pending.size > 0) this.socket.ref();
    else this.socket.unref();
  }

  /** Connects, waits for HELLO and refuses an agent whose protocol major version differs. */
  static connect(socketPath: string, opts: ConnectOptions): Promise<AgentClient> {
    return greet(socketPath, opts, (g) => {
      const client = new AgentClient(g.socket, g.decoder, g.hello, g.firstId);
      client.dispatch(g.rest);
      return client;
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
    // a 1.4 agent would ignore the flag and kill the command with this connection
    if (req.keep !== undefined) {
      if (this.protocolMinor < 5) throw this.tooOld('keep a command past its connection', 5);
      if (Buffer.byteLength(req.keep.tag) > TAG_MAX)
        throw new SnaplabError('BAD_INPUT', `a kept command's tag is at most ${TAG_MAX} bytes`);
    }
    return startExec(this.channel, this.allocId(), req, opts);
  }

  /** The commands started with `keep` that still run, oldest first (1.5). */
  async kept(): Promise<KeptExec[]> {
    this.requireMinor(5, 'keep a command past its connection');
    return decodeKept(await this.call(MsgType.LIST_KEPT, Buffer.alloc(0), MsgType.DATA));
  }

  /**
   * Takes on a kept command that no connection holds (1.5), as if it had started on this one: its
   * output from now on, its input, signals and exit. ESRCH (NOT_FOUND) when no kept command has
   * that pid, EBUSY when a connection holds it.
   */
  attach(pid: number, opts: ExecOptions = {}): ExecHandle {
    this.requireMinor(5, 'keep a command past its connection');
    return attachExec(this.channel, this.allocId(), pid, opts);
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

  /** Does the agent speak at least protocol 1.minor? */
  speaks(minor: number): boolean {
    return this.protocolMinor >= minor;
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
    let timer: Deadline | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = deadline(timeoutMs, () => {
        this.socket.destroy();
        reject(
          new SnaplabError(
            'TIMEOUT',
            `the agent did not answer IDENTITY within ${timeoutMs} ms`,
            "see the machine's console (`snaplab logs`)",
          ),
        );
      });
    });
    try {
      await Promise.race([this.call(MsgType.IDENTITY, encodeIdentity(identity), MsgType.OK), late]);
    } finally {
      timer?.clear();
    }
  }

  /** The protocol minor the agent answered with (what it can do). */
  get minor(): number {
    return this.protocolMinor;
  }

  /** The connection ended (closed, failed, or a new session on a stream agent): every call now fails. */
  get closed(): boolean {
    return this.closedError !== null;
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
          this.held();
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
      this.held();
      try {
        this.send(type, id, payload);
      } catch (e) {
        this.pending.delete(id);
        this.held();
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
        this.held();
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
