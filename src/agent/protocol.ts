/**
 * The snaplab agent protocol: frame layout, message types and payload codecs.
 * Transport-free on purpose (a Unix socket, or a VM's virtio-serial stream).
 * The normative description is docs/agent-protocol.md; native/frame.h is the C side.
 */
import { SnaplabError } from '../errors.js';

export const PROTOCOL_MAJOR = 1;
export const PROTOCOL_MINOR = 5;
export const HEADER_SIZE = 12;
export const MAX_PAYLOAD = 64 * 1024 * 1024;

export const MsgType = {
  // requests, host -> agent
  PING: 0x01,
  EXEC: 0x02,
  STDIN: 0x03,
  SIGNAL: 0x04,
  FILE_PUT: 0x05,
  FILE_GET: 0x06,
  SET_CLOCK: 0x07,
  STATUS: 0x08,
  /** Ends the session (the agent kills its execs) and is answered by HELLO with the same id. */
  RESET: 0x09,
  RESIZE: 0x0a,
  /** 1.2: u32 1 hold / 0 release: the agent stops (or resumes) reading this exec's output (no answer) */
  HOLD_OUTPUT: 0x0b,
  /** 1.3: a restored machine's own host name, machine id and entropy, set by the agent itself */
  IDENTITY: 0x0c,
  /** 1.5: the kept execs that still run (DATA: see decodeKept) */
  LIST_KEPT: 0x0d,
  /** 1.5: u32 pid: a kept exec no connection holds becomes this request's (STARTED, output, EXIT) */
  ATTACH: 0x0e,
  /** 1.6: let this kept exec of the connection go, as the connection's end would (no answer when done) */
  DETACH: 0x0f,
  // responses, agent -> host
  HELLO: 0x80,
  PONG: 0x81,
  STARTED: 0x82,
  STDOUT: 0x83,
  STDERR: 0x84,
  EXIT: 0x85,
  DATA: 0x86,
  OK: 0x87,
  ERROR: 0x88,
  STDIN_ACK: 0x89,
} as const;
export type MsgType = (typeof MsgType)[keyof typeof MsgType];

export const ExecField = { ARGV: 1, ENV: 2, CWD: 3, USER: 4, TTY: 5, TAG: 6 } as const;
export const EXEC_FLAG_STDIN = 0x1;
/** 1.5: the exec outlives its connection (docs/agent-protocol.md "Kept execs") */
export const EXEC_FLAG_KEEP = 0x2;
/** 1.8: EXIT waits for the end of the command's stdout and stderr (docs/agent-protocol.md "Waiting for output") */
export const EXEC_FLAG_WAIT_OUTPUT = 0x4;
/** the most bytes a kept exec's tag may have */
export const TAG_MAX = 4096;
export const ExitFlag = { TIMED_OUT: 0x1, NOT_FOUND: 0x2, NOT_EXECUTABLE: 0x4 } as const;

export interface Frame {
  type: number;
  flags: number;
  id: number;
  payload: Buffer;
}

/** One frame as a single buffer (one write on the wire). */
export function encodeFrame(type: number, id: number, payload: Buffer = EMPTY): Buffer {
  if (payload.length > MAX_PAYLOAD) {
    throw new SnaplabError(
      'AGENT_PROTOCOL',
      `payload of ${payload.length} bytes is over the agent's ${MAX_PAYLOAD} byte frame limit`,
      'split the data (files over 64 MiB are not supported by put/get)',
    );
  }
  const b = Buffer.allocUnsafe(HEADER_SIZE + payload.length);
  b.writeUInt32LE(payload.length, 0);
  b.writeUInt16LE(type, 4);
  b.writeUInt16LE(0, 6);
  b.writeUInt32LE(id >>> 0, 8);
  payload.copy(b, HEADER_SIZE);
  return b;
}

const EMPTY = Buffer.alloc(0);

/**
 * Incremental decoder: feed it chunks as they arrive (split or coalesced), get whole frames.
 * Payloads are zero-copy views when a frame sits inside one chunk.
 */
export class FrameDecoder {
  private chunks: Buffer[] = [];
  private buffered = 0;

  push(chunk: Buffer): Frame[] {
    const frames: Frame[] = [];
    if (chunk.length > 0) {
      this.chunks.push(chunk);
      this.buffered += chunk.length;
    }
    while (this.buffered >= HEADER_SIZE) {
      const head = this.peek(HEADER_SIZE);
      const len = head.readUInt32LE(0);
      if (len > MAX_PAYLOAD) {
        throw new SnaplabError('AGENT_PROTOCOL', `agent sent a frame of ${len} bytes, over the ${MAX_PAYLOAD} limit`);
      }
      if (this.buffered < HEADER_SIZE + len) break;
      const whole = this.take(HEADER_SIZE + len);
      frames.push({
        type: whole.readUInt16LE(4),
        flags: whole.readUInt16LE(6),
        id: whole.readUInt32LE(8),
        payload: whole.subarray(HEADER_SIZE),
      });
    }
    return frames;
  }

  /** Bytes held back waiting for the rest of a frame. */
  get pending(): number {
    return this.buffered;
  }

  private peek(n: number): Buffer {
    const first = this.chunks[0]!;
    if (first.length >= n) return first;
    const joined = Buffer.concat(this.chunks);
    this.chunks = [joined];
    return joined;
  }

  private take(n: number): Buffer {
    let first = this.chunks[0]!;
    if (first.length < n) {
      // Join only as many chunks as the frame needs: a big frame is concatenated once.
      let have = 0;
      let count = 0;
      while (have < n) have += this.chunks[count++]!.length;
      first = Buffer.concat(this.chunks.slice(0, count), have);
      this.chunks.splice(0, count, first);
    }
    this.buffered -= n;
    if (first.length === n) {
      this.chunks.shift();
      return first;
    }
    this.chunks[0] = first.subarray(n);
    return first.subarray(0, n);
  }
}

// ---- payloads ----

export interface Hello {
  major: number;
  minor: number;
  pid: number;
  agentVersion: string;
}

export function decodeHello(p: Buffer): Hello {
  need(p, 8, 'HELLO');
  return {
    major: p.readUInt16LE(0),
    minor: p.readUInt16LE(2),
    pid: p.readUInt32LE(4),
    agentVersion: p.toString('utf8', 8),
  };
}

export function encodeHello(h: Hello): Buffer {
  const v = Buffer.from(h.agentVersion, 'utf8');
  const b = Buffer.alloc(8 + v.length);
  b.writeUInt16LE(h.major, 0);
  b.writeUInt16LE(h.minor, 2);
  b.writeUInt32LE(h.pid, 4);
  v.copy(b, 8);
  return b;
}

export interface ExecPayload {
  argv: string[];
  env: string[];
  cwd?: string | undefined;
  /** "UID:GID[:G1,G2,...]": run as this user of the namespace (else as its root) */
  user?: string | undefined;
  timeoutMs?: number | undefined;
  stdin?: boolean | undefined;
  /** 1.2: run on a pseudo-terminal of this size (stdout carries the terminal's output, no stderr) */
  tty?: WindowSize | undefined;
  /** 1.5: the command outlives its connection; `tag` (at most TAG_MAX bytes) is given back by LIST_KEPT */
  keep?: { tag: string } | undefined;
  /** 1.8: the result waits for the end of its output (an older agent ignores the flag) */
  waitOutput?: boolean | undefined;
}

export interface WindowSize {
  cols: number;
  rows: number;
}

/** Clamps a terminal size to what the agent takes (1..65535 each). */
export function windowSize(cols: number | undefined, rows: number | undefined): WindowSize {
  const clamp = (n: number | undefined, d: number): number =>
    n && Number.isFinite(n) && n > 0 ? Math.min(65535, Math.floor(n)) : d;
  return { cols: clamp(cols, 80), rows: clamp(rows, 24) };
}

export function encodeResize(size: WindowSize): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt16LE(size.cols, 0);
  b.writeUInt16LE(size.rows, 2);
  return b;
}

export function encodeExec(req: ExecPayload): Buffer {
  const fields: [number, Buffer][] = [];
  for (const a of req.argv) fields.push([ExecField.ARGV, Buffer.from(a, 'utf8')]);
  for (const e of req.env) fields.push([ExecField.ENV, Buffer.from(e, 'utf8')]);
  if (req.cwd !== undefined) fields.push([ExecField.CWD, Buffer.from(req.cwd, 'utf8')]);
  if (req.user !== undefined) fields.push([ExecField.USER, Buffer.from(req.user, 'utf8')]);
  if (req.tty !== undefined) fields.push([ExecField.TTY, Buffer.from(`${req.tty.cols}x${req.tty.rows}`, 'utf8')]);
  if (req.keep !== undefined) fields.push([ExecField.TAG, Buffer.from(req.keep.tag, 'utf8')]);
  let size = 8;
  for (const [, v] of fields) size += 5 + v.length;
  const b = Buffer.allocUnsafe(size);
  const timeout = req.timeoutMs === undefined ? 0 : Math.max(1, Math.min(0xffffffff, Math.ceil(req.timeoutMs)));
  b.writeUInt32LE(timeout, 0);
  b.writeUInt32LE(
    (req.stdin ? EXEC_FLAG_STDIN : 0) | (req.keep ? EXEC_FLAG_KEEP : 0) | (req.waitOutput ? EXEC_FLAG_WAIT_OUTPUT : 0),
    4,
  );
  let off = 8;
  for (const [tag, v] of fields) {
    b.writeUInt8(tag, off);
    b.writeUInt32LE(v.length, off + 1);
    v.copy(b, off + 5);
    off += 5 + v.length;
  }
  return b;
}

export function decodeExec(p: Buffer): ExecPayload & { timeoutMs: number; stdin: boolean; waitOutput: boolean } {
  need(p, 8, 'EXEC');
  const out = {
    argv: [] as string[],
    env: [] as string[],
    cwd: undefined as string | undefined,
    user: undefined as string | undefined,
    tty: undefined as WindowSize | undefined,
    timeoutMs: p.readUInt32LE(0),
    stdin: (p.readUInt32LE(4) & EXEC_FLAG_STDIN) !== 0,
    waitOutput: (p.readUInt32LE(4) & EXEC_FLAG_WAIT_OUTPUT) !== 0,
  };
  let off = 8;
  while (off < p.length) {
    need(p, off + 5, 'EXEC field');
    const tag = p.readUInt8(off);
    const len = p.readUInt32LE(off + 1);
    need(p, off + 5 + len, 'EXEC field');
    const v = p.toString('utf8', off + 5, off + 5 + len);
    if (tag === ExecField.ARGV) out.argv.push(v);
    else if (tag === ExecField.ENV) out.env.push(v);
    else if (tag === ExecField.CWD) out.cwd = v;
    else if (tag === ExecField.USER) out.user = v;
    else if (tag === ExecField.TTY) {
      const [c, r] = v.split('x').map(Number);
      out.tty = { cols: c ?? 0, rows: r ?? 0 };
    }
    off += 5 + len;
  }
  return out;
}

export interface ExitPayload {
  /** -1 when the command was killed by a signal */
  code: number;
  /** 0 when it exited normally */
  signal: number;
  flags: number;
  execErrno: number;
  userUs: number;
  sysUs: number;
  maxRssKb: number;
  wallUs: number;
}

export const EXIT_PAYLOAD_SIZE = 48;

export function decodeExit(p: Buffer): ExitPayload {
  need(p, EXIT_PAYLOAD_SIZE, 'EXIT');
  return {
    code: p.readInt32LE(0),
    signal: p.readInt32LE(4),
    flags: p.readUInt32LE(8),
    execErrno: p.readInt32LE(12),
    userUs: Number(p.readBigUInt64LE(16)),
    sysUs: Number(p.readBigUInt64LE(24)),
    maxRssKb: Number(p.readBigUInt64LE(32)),
    wallUs: Number(p.readBigUInt64LE(40)),
  };
}

export function encodeU32(v: number): Buffer {
  const b = Buffer.allocUnsafe(4);
  b.writeUInt32LE(v >>> 0, 0);
  return b;
}

export function decodeStarted(p: Buffer): number {
  need(p, 4, 'STARTED');
  return p.readUInt32LE(0);
}

/** A kept exec as LIST_KEPT gives it (1.5). */
export interface KeptExec {
  /** its pid as the machine sees it */
  pid: number;
  /** a connection holds it now (an ATTACH of it is refused) */
  held: boolean;
  tty: boolean;
  stdin: boolean;
  /** how long it has run, ms */
  ageMs: number;
  /** what the host gave it at its start (anything the machine's root could have changed since) */
  tag: string;
}

export function decodeKept(p: Buffer): KeptExec[] {
  const out: KeptExec[] = [];
  let off = 0;
  while (off < p.length) {
    need(p, off + 20, 'LIST_KEPT entry');
    const len = p.readUInt32LE(off + 16);
    need(p, off + 20 + len, 'LIST_KEPT tag');
    const flags = p.readUInt32LE(off + 4);
    out.push({
      pid: p.readUInt32LE(off),
      held: (flags & 1) !== 0,
      tty: (flags & 2) !== 0,
      stdin: (flags & 4) !== 0,
      ageMs: Number(p.readBigUInt64LE(off + 8) / 1000n),
      tag: p.toString('utf8', off + 20, off + 20 + len),
    });
    off += 20 + len;
  }
  return out;
}

export function encodeFilePut(path: string, data: Buffer, mode: number): Buffer {
  const pb = Buffer.from(path, 'utf8');
  const b = Buffer.allocUnsafe(8 + pb.length + data.length);
  b.writeUInt32LE(mode >>> 0, 0);
  b.writeUInt32LE(pb.length, 4);
  pb.copy(b, 8);
  data.copy(b, 8 + pb.length);
  return b;
}

export function encodeSetClock(ns: bigint): Buffer {
  const b = Buffer.allocUnsafe(8);
  b.writeBigInt64LE(ns, 0);
  return b;
}

export interface Identity {
  hostname: string;
  /** 32 lowercase hex digits */
  machineId: string;
  /** credited to the guest's random pool, its generator then reseeded from it; at most 4 KiB */
  entropy: Buffer;
  /** a system machine: its name goes into /etc/hostname and /etc/hosts too */
  system: boolean;
}

export function encodeIdentity(i: Identity): Buffer {
  const name = Buffer.from(i.hostname, 'utf8');
  if (name.length < 1 || name.length > 64 || !/^[A-Za-z0-9._-]+$/.test(i.hostname))
    throw new SnaplabError(
      'BAD_NAME',
      `invalid host name ${JSON.stringify(i.hostname)}`,
      'use 1-64 letters, digits, ".", "_" or "-"',
    );
  if (!/^[0-9a-f]{32}$/.test(i.machineId))
    throw new SnaplabError('INTERNAL', `invalid machine id ${JSON.stringify(i.machineId)}`);
  if (i.entropy.length > 4096) throw new SnaplabError('INTERNAL', `${i.entropy.length} bytes of entropy: at most 4096`);
  return Buffer.concat([
    Buffer.from([i.system ? 1 : 0, name.length]),
    name,
    Buffer.from(i.machineId, 'latin1'),
    i.entropy,
  ]);
}

export interface ErrorPayload {
  errno: number;
  message: string;
}

export function decodeError(p: Buffer): ErrorPayload {
  need(p, 4, 'ERROR');
  return { errno: p.readInt32LE(0), message: p.toString('utf8', 4) };
}

function need(p: Buffer, n: number, what: string): void {
  if (p.length < n) {
    throw new SnaplabError('AGENT_PROTOCOL', `${what} payload too short (${p.length} bytes, need ${n})`);
  }
}
