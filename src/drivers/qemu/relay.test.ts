import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  decodeError,
  encodeFrame,
  encodeHello,
  encodeU32,
  FrameDecoder,
  MAX_PAYLOAD,
  MsgType,
  type Frame,
} from '../../agent/protocol.js';
import { vmFiles } from './launch.js';
import { holdRelay, releaseRelay, startRelay } from './relay.js';

// The relay (native/relay.c) against a scripted agent on a Unix socket standing in for QEMU's
// chardev: real process, real sockets, the protocol as the agent speaks it.
const dir = mkdtempSync(join(tmpdir(), 'snaplab-relay-'));
const files = vmFiles(dir);
const HELLO = encodeHello({ major: 1, minor: 0, pid: 1, agentVersion: 'fake' });

/** Frames the fake agent received after the relay's RESET, and a way to answer them. */
let agentSeen: Frame[] = [];
let resets = 0;
let agentSock: Socket | undefined;
let server: Server;

/** Wait until `pick` finds something (polling: the frames arrive asynchronously). */
async function until<T>(pick: () => T | undefined, what: string, ms = 5000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = pick();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

class Client {
  readonly frames: Frame[] = [];
  private readonly dec = new FrameDecoder();
  constructor(readonly sock: Socket) {
    sock.on('data', (b: Buffer) => this.frames.push(...this.dec.push(b)));
  }
  static async open(): Promise<Client> {
    const s = createConnection(files.relay);
    await new Promise((r, j) => s.once('connect', r).once('error', j));
    return new Client(s);
  }
  send(type: number, id: number, payload?: Buffer): void {
    this.sock.write(encodeFrame(type, id, payload));
  }
  next(type: number, id: number): Promise<Frame> {
    return until(() => this.frames.find((f) => f.type === type && f.id === id), `type 0x${type.toString(16)} id ${id}`);
  }
}

const seen = (type: number, pred: (f: Frame) => boolean = () => true): Frame | undefined =>
  agentSeen.find((f) => f.type === type && pred(f));
const answer = (type: number, id: number, payload?: Buffer): void =>
  void agentSock!.write(encodeFrame(type, id, payload));

beforeAll(async () => {
  server = createServer((s) => {
    agentSock = s;
    const dec = new FrameDecoder();
    s.on('data', (b: Buffer) => {
      for (const f of dec.push(b)) {
        if (f.type === MsgType.RESET) {
          resets++;
          s.write(encodeFrame(MsgType.HELLO, f.id, HELLO));
        } else if (f.type === MsgType.PING && f.payload.toString() !== 'hold')
          s.write(encodeFrame(MsgType.PONG, f.id, f.payload));
        else agentSeen.push(f);
      }
    });
  });
  await new Promise<void>((r) => server.listen(files.chardev, r));
  await startRelay(dir, process.pid, [], 5000);
});

afterAll(async () => {
  agentSock?.destroy(); // the relay exits when its VM's connection ends
  await new Promise((r) => server.close(r));
  rmSync(dir, { recursive: true, force: true });
});

describe('the VM relay', () => {
  it('holds what is bound for the VM while it is paused, and lets it go on resume', async () => {
    const c = await Client.open();
    await c.next(MsgType.HELLO, 0);
    // a release and a hold in quick succession end held (the hold is a state, not a signal pair)
    await holdRelay(dir);
    await releaseRelay(dir);
    await holdRelay(dir);
    expect(existsSync(`${files.relay}.held`)).toBe(true); // nothing was in flight: held at once
    agentSeen = [];
    c.send(MsgType.PING, 21, Buffer.from('hold')); // 'hold': the fake agent records it, does not answer
    await new Promise((r) => setTimeout(r, 100));
    expect(seen(MsgType.PING)).toBeUndefined();
    await releaseRelay(dir);
    await until(() => seen(MsgType.PING, (f) => f.payload.toString() === 'hold'), 'the held PING at the agent');
    expect(existsSync(`${files.relay}.held`)).toBe(false);
    answer(MsgType.PONG, seen(MsgType.PING)!.id, Buffer.from('hold'));
    await c.next(MsgType.PONG, 21);
    c.sock.destroy();
  });

  it('greets clients, answers their RESET itself, and keeps their requests apart', async () => {
    const a = await Client.open();
    const b = await Client.open();
    expect((await a.next(MsgType.HELLO, 0)).payload.equals(HELLO)).toBe(true);
    a.send(MsgType.RESET, 99);
    expect((await a.next(MsgType.HELLO, 99)).payload.equals(HELLO)).toBe(true);
    expect(seen(MsgType.RESET)).toBeUndefined(); // the guest's session is not reset by a client
    // the same request id from two clients: each gets its own answer back under its own id
    a.send(MsgType.PING, 1, Buffer.from('from a'));
    b.send(MsgType.PING, 1, Buffer.from('from b'));
    expect((await a.next(MsgType.PONG, 1)).payload.toString()).toBe('from a');
    expect((await b.next(MsgType.PONG, 1)).payload.toString()).toBe('from b');
    a.sock.destroy();
    b.sock.destroy();
  });

  it('routes an exec until its EXIT: STDIN and SIGNAL follow it, an ERROR after STARTED does not end it', async () => {
    agentSeen = [];
    const c = await Client.open();
    c.send(MsgType.EXEC, 7, Buffer.from('argv'));
    const exec = await until(() => seen(MsgType.EXEC), 'the EXEC at the agent');
    expect(exec.id).not.toBe(0);
    answer(MsgType.STARTED, exec.id, encodeU32(1234));
    await c.next(MsgType.STARTED, 7);
    answer(MsgType.ERROR, exec.id, Buffer.concat([encodeU32(22), Buffer.from('bad SIGNAL payload')])); // as for a bad signal number
    await c.next(MsgType.ERROR, 7);
    c.send(MsgType.STDIN, 7, Buffer.from('input'));
    c.send(MsgType.SIGNAL, 7, encodeU32(15));
    expect((await until(() => seen(MsgType.STDIN), 'STDIN at the agent')).id).toBe(exec.id);
    expect((await until(() => seen(MsgType.SIGNAL), 'SIGNAL at the agent')).id).toBe(exec.id);
    answer(MsgType.EXIT, exec.id, Buffer.alloc(48));
    await c.next(MsgType.EXIT, 7);
    // finished: a later SIGNAL for it goes nowhere
    agentSeen = [];
    c.send(MsgType.SIGNAL, 7, encodeU32(9));
    c.send(MsgType.PING, 8, Buffer.from('after'));
    await c.next(MsgType.PONG, 8);
    expect(seen(MsgType.SIGNAL)).toBeUndefined();
    c.sock.destroy();
  });

  it('kills the execs of a client that goes away', async () => {
    agentSeen = [];
    const c = await Client.open();
    c.send(MsgType.EXEC, 3, Buffer.from('argv'));
    const exec = await until(() => seen(MsgType.EXEC), 'the EXEC at the agent');
    answer(MsgType.STARTED, exec.id, encodeU32(99));
    await c.next(MsgType.STARTED, 3);
    c.sock.destroy();
    const kill = await until(() => seen(MsgType.SIGNAL), 'SIGKILL at the agent');
    expect([kill.id, kill.payload.readUInt32LE(0)]).toEqual([exec.id, 9]);
  });

  it('answers a frame over the limit with EMSGSIZE and keeps the connection', async () => {
    const c = await Client.open();
    const head = Buffer.alloc(12);
    head.writeUInt32LE(MAX_PAYLOAD + 1, 0);
    head.writeUInt16LE(MsgType.FILE_PUT, 4);
    head.writeUInt32LE(5, 8);
    c.sock.write(head);
    c.sock.write(Buffer.alloc(MAX_PAYLOAD + 1));
    const err = await c.next(MsgType.ERROR, 5);
    expect(decodeError(err.payload).errno).toBe(90); // EMSGSIZE
    c.send(MsgType.PING, 6, Buffer.from('still here'));
    expect((await c.next(MsgType.PONG, 6)).payload.toString()).toBe('still here');
    c.sock.destroy();
  });

  it('fails what was in flight when the agent starts a new session, and stays up', async () => {
    const c = await Client.open();
    c.send(MsgType.PING, 11, Buffer.from('hold')); // the fake agent does not answer this one
    await until(() => seen(MsgType.PING, (f) => f.payload.toString() === 'hold'), 'the held PING at the agent');
    const before = resets;
    answer(MsgType.HELLO, 0, HELLO);
    const err = await c.next(MsgType.ERROR, 11);
    await until(() => (resets > before ? true : undefined), 'the relay to RESET the new session'); // so that requests on their way run in a session that ends them
    expect(decodeError(err.payload).errno).toBe(104); // ECONNRESET
    expect(c.frames.filter((f) => f.type === MsgType.HELLO && f.id === 0)).toHaveLength(1); // only the greeting
    c.send(MsgType.PING, 12, Buffer.from('next'));
    expect((await c.next(MsgType.PONG, 12)).payload.toString()).toBe('next');
    c.sock.destroy();
  });
});
