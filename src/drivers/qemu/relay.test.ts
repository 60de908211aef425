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
  EXEC_FLAG_KEEP,
  FrameDecoder,
  MAX_PAYLOAD,
  MsgType,
  type Frame,
} from '../../agent/protocol.js';
import { AgentClient } from '../../agent/client.js';
import { vmFiles } from './launch.js';
import { holdRelay, releaseRelay, startRelay } from './relay.js';

// The relay (native/relay.c) against a scripted agent on a Unix socket standing in for QEMU's
// chardev: real process, real sockets, the protocol as the agent speaks it.
const HELLO = encodeHello({ major: 1, minor: 0, pid: 1, agentVersion: 'fake' });

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
  static async open(path: string): Promise<Client> {
    const s = createConnection(path);
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

/** A VM as the relay sees it: a fake agent greeting with `hello` on the chardev, and its relay. */
class FakeVm {
  readonly dir = mkdtempSync(join(tmpdir(), 'snaplab-relay-'));
  readonly files = vmFiles(this.dir);
  /** frames the fake agent received after the relay's RESET (PINGs it answered and RESETs aside) */
  agentSeen: Frame[] = [];
  resets = 0;
  agentSock: Socket | undefined;
  private server!: Server;

  constructor(readonly hello: Buffer) {}

  async start(): Promise<this> {
    this.server = createServer((s) => {
      this.agentSock = s;
      const dec = new FrameDecoder();
      s.on('data', (b: Buffer) => {
        for (const f of dec.push(b)) {
          if (f.type === MsgType.RESET) {
            this.resets++;
            s.write(encodeFrame(MsgType.HELLO, f.id, this.hello));
          } else if (f.type === MsgType.PING && f.payload.toString() !== 'hold')
            s.write(encodeFrame(MsgType.PONG, f.id, f.payload));
          else this.agentSeen.push(f);
        }
      });
    });
    await new Promise<void>((r) => this.server.listen(this.files.chardev, r));
    await startRelay(this.dir, process.pid, [], 5000);
    return this;
  }

  seen(type: number, pred: (f: Frame) => boolean = () => true): Frame | undefined {
    return this.agentSeen.find((f) => f.type === type && pred(f));
  }

  answer(type: number, id: number, payload?: Buffer): void {
    void this.agentSock!.write(encodeFrame(type, id, payload));
  }

  client(): Promise<Client> {
    return Client.open(this.files.relay);
  }

  async stop(): Promise<void> {
    this.agentSock?.destroy(); // the relay exits when its VM's connection ends
    await new Promise((r) => this.server.close(r));
    rmSync(this.dir, { recursive: true, force: true });
  }
}

const vm = new FakeVm(HELLO);
const files = vm.files;
const seen = vm.seen.bind(vm);
const answer = vm.answer.bind(vm);
const open = (): Promise<Client> => vm.client();

beforeAll(async () => {
  await vm.start();
});

afterAll(async () => {
  await vm.stop();
});

describe('the VM relay', () => {
  it('holds what is bound for the VM while it is paused, and lets it go on resume', async () => {
    const c = await open();
    await c.next(MsgType.HELLO, 0);
    // a release and a hold in quick succession end held (the hold is a state, not a signal pair)
    await holdRelay(vm.dir);
    await releaseRelay(vm.dir);
    await holdRelay(vm.dir);
    expect(existsSync(`${files.relay}.held`)).toBe(true); // nothing was in flight: held at once
    vm.agentSeen = [];
    c.send(MsgType.PING, 21, Buffer.from('hold')); // 'hold': the fake agent records it, does not answer
    await new Promise((r) => setTimeout(r, 100));
    expect(seen(MsgType.PING)).toBeUndefined();
    await releaseRelay(vm.dir);
    await until(() => seen(MsgType.PING, (f) => f.payload.toString() === 'hold'), 'the held PING at the agent');
    expect(existsSync(`${files.relay}.held`)).toBe(false);
    answer(MsgType.PONG, seen(MsgType.PING)!.id, Buffer.from('hold'));
    await c.next(MsgType.PONG, 21);
    c.sock.destroy();
  });

  it('greets clients, answers their RESET itself, and keeps their requests apart', async () => {
    const a = await open();
    const b = await open();
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
    vm.agentSeen = [];
    const c = await open();
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
    vm.agentSeen = [];
    c.send(MsgType.SIGNAL, 7, encodeU32(9));
    c.send(MsgType.PING, 8, Buffer.from('after'));
    await c.next(MsgType.PONG, 8);
    expect(seen(MsgType.SIGNAL)).toBeUndefined();
    c.sock.destroy();
  });

  it('kills the execs of a client that goes away', async () => {
    vm.agentSeen = [];
    const c = await open();
    c.send(MsgType.EXEC, 3, Buffer.from('argv'));
    const exec = await until(() => seen(MsgType.EXEC), 'the EXEC at the agent');
    answer(MsgType.STARTED, exec.id, encodeU32(99));
    await c.next(MsgType.STARTED, 3);
    c.sock.destroy();
    const kill = await until(() => seen(MsgType.SIGNAL), 'SIGKILL at the agent');
    expect([kill.id, kill.payload.readUInt32LE(0)]).toEqual([exec.id, 9]);
  });

  it('answers a frame over the limit with EMSGSIZE and keeps the connection', async () => {
    const c = await open();
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
    const c = await open();
    c.send(MsgType.PING, 11, Buffer.from('hold')); // the fake agent does not answer this one
    await until(() => seen(MsgType.PING, (f) => f.payload.toString() === 'hold'), 'the held PING at the agent');
    const before = vm.resets;
    answer(MsgType.HELLO, 0, HELLO);
    const err = await c.next(MsgType.ERROR, 11);
    await until(() => (vm.resets > before ? true : undefined), 'the relay to RESET the new session'); // so that requests on their way run in a session that ends them
    expect(decodeError(err.payload).errno).toBe(104); // ECONNRESET
    expect(c.frames.filter((f) => f.type === MsgType.HELLO && f.id === 0)).toHaveLength(1); // only the greeting
    c.send(MsgType.PING, 12, Buffer.from('next'));
    expect((await c.next(MsgType.PONG, 12)).payload.toString()).toBe('next');
    c.sock.destroy();
  });
});

/** An EXEC's payload as the relay reads it: u32 timeout, u32 flags (bit 1 keep), then fields. */
const execPayload = (keep: boolean): Buffer => {
  const b = Buffer.alloc(8);
  b.writeUInt32LE(keep ? EXEC_FLAG_KEEP : 0, 4);
  return Buffer.concat([b, Buffer.from('argv')]);
};
const minorOf = (hello: Frame): number => hello.payload.readUInt16LE(2);
const errnoOf = (f: Frame): number => decodeError(f.payload).errno;

describe('kept execs through the relay', () => {
  const v16 = new FakeVm(encodeHello({ major: 1, minor: 6, pid: 1, agentVersion: 'fake' }));
  const v15 = new FakeVm(encodeHello({ major: 1, minor: 5, pid: 1, agentVersion: 'fake' }));
  beforeAll(async () => {
    await Promise.all([v16.start(), v15.start()]);
  });
  afterAll(async () => {
    await Promise.all([v16.stop(), v15.stop()]);
  });

  /** A client's EXEC (kept or not) started by the fake agent: the relay's id for it. */
  async function started(c: Client, at: FakeVm, id: number, keep: boolean, pid: number): Promise<number> {
    const execs = (): Frame[] => at.agentSeen.filter((f) => f.type === MsgType.EXEC);
    const before = execs().length;
    c.send(MsgType.EXEC, id, execPayload(keep));
    const exec = await until(() => execs()[before], 'the EXEC at the agent');
    at.answer(MsgType.STARTED, exec.id, encodeU32(pid));
    await c.next(MsgType.STARTED, id);
    return exec.id;
  }

  it('lets a kept exec go when its client leaves (DETACH), kills the rest, and routes an ATTACH as an exec', async () => {
    const a = await v16.client();
    expect(minorOf(await a.next(MsgType.HELLO, 0))).toBe(6); // it can keep: its clients may ask
    const kept = await started(a, v16, 1, true, 100);
    const plain = await started(a, v16, 2, false, 101);
    a.sock.destroy();
    const detach = await until(() => v16.seen(MsgType.DETACH), 'DETACH at the agent');
    expect(detach.id).toBe(kept);
    expect(detach.payload.length).toBe(0);
    const kill = await until(() => v16.seen(MsgType.SIGNAL), 'SIGKILL at the agent');
    expect([kill.id, kill.payload.readUInt32LE(0)]).toEqual([plain, 9]);
    expect(v16.agentSeen.filter((f) => f.type === MsgType.SIGNAL && f.id === kept)).toHaveLength(0);

    // another client takes it on: the ATTACH is an exec of its, to its EXIT
    const b = await v16.client();
    b.send(MsgType.ATTACH, 5, encodeU32(100));
    const attach = await until(() => v16.seen(MsgType.ATTACH), 'the ATTACH at the agent');
    expect(attach.payload.readUInt32LE(0)).toBe(100);
    v16.answer(MsgType.STARTED, attach.id, Buffer.alloc(16));
    await b.next(MsgType.STARTED, 5);
    b.send(MsgType.ATTACH, 5, encodeU32(100)); // its id runs: refused, as the agent would
    expect(errnoOf(await b.next(MsgType.ERROR, 5))).toBe(16); // EBUSY
    v16.answer(MsgType.STDOUT, attach.id, Buffer.from('out'));
    expect((await b.next(MsgType.STDOUT, 5)).payload.toString()).toBe('out');
    b.send(MsgType.STDIN, 5, Buffer.from('in'));
    expect((await until(() => v16.seen(MsgType.STDIN), 'STDIN at the agent')).id).toBe(attach.id);
    // one it lets go of in so many words: forwarded, and its route ends with the agent's answer
    b.send(MsgType.DETACH, 5);
    await until(() => v16.seen(MsgType.DETACH, (f) => f.id === attach.id), 'the second DETACH at the agent');
    // one more while it is on its way: let go already, as the agent would say (not sent on)
    const errors5 = (): number[] => b.frames.filter((f) => f.type === MsgType.ERROR && f.id === 5).map(errnoOf);
    b.send(MsgType.DETACH, 5);
    expect(await until(() => (errors5().length === 2 ? errors5() : undefined), 'its ESRCH')).toEqual([16, 3]);
    // an ERROR that answers its earlier STDIN is not the DETACH's answer: the route goes on to the OK
    v16.answer(MsgType.ERROR, attach.id, Buffer.concat([encodeU32(105), Buffer.from('no buffer space')]));
    v16.answer(MsgType.STDOUT, attach.id, Buffer.from('before the answer'));
    v16.answer(MsgType.OK, attach.id);
    await b.next(MsgType.OK, 5);
    expect(errors5()).toEqual([16, 3, 105]); // EBUSY (the ATTACH again, above), ESRCH, ENOBUFS
    v16.answer(MsgType.STDOUT, attach.id, Buffer.from('late'));
    b.send(MsgType.PING, 6, Buffer.from('after'));
    await b.next(MsgType.PONG, 6);
    expect(b.frames.filter((f) => f.type === MsgType.STDOUT).map((f) => f.payload.toString())).toEqual([
      'out',
      'before the answer',
    ]);

    // a DETACH the relay refuses itself: an exec that is not kept, and an id that runs nothing
    const plain2 = await started(b, v16, 7, false, 102);
    b.send(MsgType.DETACH, 7);
    expect(errnoOf(await b.next(MsgType.ERROR, 7))).toBe(22); // EINVAL: it would be killed, not kept
    b.send(MsgType.DETACH, 8);
    expect(errnoOf(await b.next(MsgType.ERROR, 8))).toBe(3); // ESRCH
    b.send(MsgType.DETACH, 9, Buffer.from('x'));
    expect(errnoOf(await b.next(MsgType.ERROR, 9))).toBe(22); // a payload: EINVAL, as the agent says first
    expect(v16.agentSeen.filter((f) => f.type === MsgType.DETACH)).toHaveLength(2);
    // an EXEC whose id a pending request of another kind has is no running exec's: it runs
    v16.agentSeen = [];
    b.send(MsgType.PING, 11, Buffer.from('hold')); // the fake agent holds this one unanswered
    await until(() => v16.seen(MsgType.PING), 'the held PING at the agent');
    await started(b, v16, 11, false, 103);
    v16.answer(MsgType.EXIT, plain2, Buffer.alloc(48));
    await b.next(MsgType.EXIT, 7);
    b.sock.destroy();
  });

  it("a kept exec whose agent ended its own session fails at its client as a connection lost (it runs on there), as does a client's RESET let it go", async () => {
    // the agent side of a new session: a 1.6 agent killed its execs and let its kept ones go
    const c = await AgentClient.connect(v16.files.relay, { timeoutMs: 5000 });
    const execs = (): Frame[] => v16.agentSeen.filter((f) => f.type === MsgType.EXEC);
    const before = execs().length;
    const h = c.exec({ argv: ['sleep', '60'], env: [], keep: { tag: 't' } });
    const exec = await until(() => execs()[before], 'the EXEC at the agent');
    v16.answer(MsgType.STARTED, exec.id, encodeU32(300));
    expect(await h.pid).toBe(300);
    const signals = v16.agentSeen.filter((f) => f.type === MsgType.SIGNAL).length;
    v16.answer(MsgType.HELLO, 0, v16.hello);
    // read as the daemon reads a broken connection (AGENT_UNREACHABLE: lost, looked for again), not as an exec that failed
    await expect(h.result).rejects.toMatchObject({ code: 'AGENT_UNREACHABLE', message: /new session/ });
    expect(v16.agentSeen.filter((f) => f.type === MsgType.SIGNAL)).toHaveLength(signals);
    await c.close();

    // a client's RESET ends its session as its leaving does: its kept exec let go, the client stays
    const r = await v16.client();
    await r.next(MsgType.HELLO, 0);
    const id = await started(r, v16, 1, true, 301);
    r.send(MsgType.RESET, 2);
    await r.next(MsgType.HELLO, 2);
    expect(
      (await until(() => v16.seen(MsgType.DETACH, (f) => f.id === id), 'DETACH after the RESET')).payload,
    ).toHaveLength(0);
    r.sock.destroy();
  });

  it("a client's HOLD_OUTPUT holds its one exec at the agent; the relay's own hold of the client does not undo it", async () => {
    const c = await v16.client();
    await c.next(MsgType.HELLO, 0);
    const held = await started(c, v16, 1, false, 401);
    const other = await started(c, v16, 2, false, 402);
    const holds = (): Frame[] => v16.agentSeen.filter((f) => f.type === MsgType.HOLD_OUTPUT);
    c.send(MsgType.HOLD_OUTPUT, 1, encodeU32(1));
    c.send(MsgType.HOLD_OUTPUT, 1, encodeU32(1)); // held already: not sent again
    c.send(MsgType.HOLD_OUTPUT, 9, encodeU32(1)); // no exec of this client: nowhere
    c.send(MsgType.HOLD_OUTPUT, 2, Buffer.from('x'));
    expect(errnoOf(await c.next(MsgType.ERROR, 2))).toBe(22); // EINVAL, as the agent answers it
    c.send(MsgType.HOLD_OUTPUT, 1, encodeU32(0));
    c.send(MsgType.PING, 3, Buffer.from('after'));
    await c.next(MsgType.PONG, 3);
    expect(holds().map((f) => [f.id, f.payload.readUInt32LE(0)])).toEqual([
      [held, 1],
      [held, 0],
    ]);
    // held by its client while the relay holds the client (over 16 MiB unread) and lets it go:
    // the exec stays held, the other is held and released with the client
    c.send(MsgType.HOLD_OUTPUT, 1, encodeU32(1));
    await until(() => (holds().length === 3 ? true : undefined), 'the hold at the agent');
    c.sock.pause();
    const chunk = Buffer.alloc(1 << 20, 7);
    for (let i = 0; i < 24; i++) v16.answer(MsgType.STDOUT, other, chunk);
    await until(
      () => (holds().some((f) => f.id === other && f.payload.readUInt32LE(0) === 1) ? true : undefined),
      "the relay's hold of the client",
    );
    expect(holds().filter((f) => f.id === held)).toHaveLength(3); // not sent again by the relay
    c.sock.resume();
    await until(
      () => (holds().some((f) => f.id === other && f.payload.readUInt32LE(0) === 0) ? true : undefined),
      "the relay's release",
    );
    expect(
      holds()
        .filter((f) => f.id === held)
        .map((f) => f.payload.readUInt32LE(0)),
    ).toEqual([1, 0, 1]);
    v16.answer(MsgType.EXIT, held, Buffer.alloc(48));
    v16.answer(MsgType.EXIT, other, Buffer.alloc(48));
    await c.next(MsgType.EXIT, 2);
    c.sock.destroy();
  });

  it('an agent before 1.6 cannot let one exec go: its clients are told 1.4, and a kept exec dies with its client', async () => {
    const c = await v15.client();
    expect(minorOf(await c.next(MsgType.HELLO, 0))).toBe(4);
    const id = await started(c, v15, 1, true, 200);
    c.sock.destroy();
    const kill = await until(() => v15.seen(MsgType.SIGNAL), 'SIGKILL at the agent');
    expect([kill.id, kill.payload.readUInt32LE(0)]).toEqual([id, 9]);
    expect(v15.seen(MsgType.DETACH)).toBeUndefined();
  });
});
