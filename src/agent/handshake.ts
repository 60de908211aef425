/**
 * Opening a connection to an agent: connect, (on a long-lived stream) resynchronise on the answer
 * to our RESET, and check its HELLO.
 */
import { randomInt } from 'node:crypto';
import { createConnection, type Socket } from 'node:net';
import { SnaplabError } from '../errors.js';
import { deadline } from '../timing/deadline.js';
import { aborted } from './agent-errors.js';
import {
  decodeError,
  decodeHello,
  encodeFrame,
  FrameDecoder,
  HEADER_SIZE,
  MsgType,
  PROTOCOL_MAJOR,
  type Frame,
  type Hello,
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

/** A connection whose agent said HELLO: what the client takes over. */
export interface Greeted {
  socket: Socket;
  decoder: FrameDecoder;
  hello: Hello;
  /** the first request id the session may use (after our RESET's, with reset) */
  firstId: number;
  /** frames that came in the same read as the HELLO */
  rest: Frame[];
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

/**
 * With reset: skips everything up to the answer to our RESET (the decoder starts there). Returns
 * the bytes from that answer on, once found; undefined while it is still to come.
 */
function resync(resetId: number): (chunk: Buffer) => Buffer | undefined {
  let pre: Buffer = Buffer.alloc(0);
  let synced = false;
  return (chunk) => {
    if (synced) return chunk;
    pre = pre.length ? Buffer.concat([pre, chunk]) : chunk;
    const { at, keep } = findResetAnswer(pre, resetId);
    if (at < 0) {
      pre = pre.subarray(pre.length - keep);
      return undefined;
    }
    synced = true;
    const from = pre.subarray(at);
    pre = Buffer.alloc(0);
    return from;
  };
}

/** The agent's first frame as a HELLO this snaplab can talk to; throws AGENT_PROTOCOL otherwise. */
function checkHello(first: Frame, socketPath: string, reset: boolean): Hello {
  if (reset && first.type === MsgType.ERROR) {
    throw new SnaplabError(
      'AGENT_PROTOCOL',
      `agent at ${socketPath} refused RESET: ${decodeError(first.payload).message}`,
      'rebuild the agent with this snaplab (make -C native)',
    );
  }
  if (first.type !== MsgType.HELLO) {
    throw new SnaplabError('AGENT_PROTOCOL', `agent's first frame is type 0x${first.type.toString(16)}, not HELLO`);
  }
  const hello = decodeHello(first.payload);
  if (hello.major !== PROTOCOL_MAJOR) {
    throw new SnaplabError(
      'AGENT_PROTOCOL',
      `agent speaks protocol ${hello.major}.${hello.minor}, this snaplab speaks ${PROTOCOL_MAJOR}.x`,
      'rebuild the agent with this snaplab (make -C native) and recreate the sandbox',
    );
  }
  return hello;
}

/**
 * Connects, waits for HELLO and refuses an agent whose protocol major version differs. `open`
 * takes the connection over in the same tick as its HELLO, so that no frame after it is missed.
 */
export function greet<T>(socketPath: string, opts: ConnectOptions, open: (g: Greeted) => T): Promise<T> {
  return new Promise((resolve, reject) => {
    if (opts.signal?.aborted) {
      reject(aborted('connecting to the agent'));
      return;
    }
    const sock = createConnection({ path: socketPath });
    const decoder = new FrameDecoder();
    // With reset: a random id, so that the answer to an earlier host's RESET cannot pass for ours.
    const resetId = opts.reset ? randomInt(1, 0xffffffff) : 0;
    const skip = opts.reset ? resync(resetId) : (chunk: Buffer) => chunk;
    let done = false;
    const cleanup = (): void => {
      done = true;
      timer.clear();
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
      const from = skip(chunk);
      if (from === undefined) return;
      let frames: Frame[];
      let hello: Hello | undefined;
      try {
        frames = decoder.push(from);
        hello = frames[0] && checkHello(frames[0], socketPath, opts.reset === true);
      } catch (e) {
        fail(e as SnaplabError);
        return;
      }
      if (!hello) return;
      cleanup();
      const firstId = opts.reset ? (resetId >= 0xffffffff ? 1 : resetId + 1) : 1;
      resolve(open({ socket: sock, decoder, hello, firstId, rest: frames.slice(1) }));
    };
    // a HELLO that arrived while this process was too busy to read it is not a timeout (timing/deadline.ts)
    const timer = deadline(opts.timeoutMs, () =>
      fail(
        new SnaplabError(
          'TIMEOUT',
          `agent at ${socketPath} did not answer${opts.reset ? ' RESET' : ''} within ${opts.timeoutMs} ms`,
        ),
      ),
    );
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    sock.on('connect', onConnect);
    sock.on('data', onData);
    sock.on('error', onError);
    sock.on('close', onClose);
  });
}
