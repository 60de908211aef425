/**
 * The agent serving one byte stream (`serve --stream-fd 3`), as it serves a VM's virtio-serial
 * port. fd 3 is a socketpair end (Node's 'pipe' stdio); the test holds the other end, either
 * speaking raw frames or behind a small Unix-socket relay that stands in for QEMU's chardev
 * socket (a host connection can come and go without the agent seeing it, as after a restore).
 * Needs native/build/snaplab-agent (make -C native).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync, readlinkSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer, type Socket, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { agentBinaryPath } from './binary.js';
import { AgentClient } from './client.js';
import { decodeHello, decodeStarted, encodeExec, encodeFrame, FrameDecoder, MsgType, type Frame } from './protocol.js';

const ENV = ['PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin', 'LANG=C'];

interface StreamAgent {
  proc: ChildProcess;
  pid: number;
  /** the host's end of the socketpair */
  host: Socket;
  stderr: () => string;
  exited: Promise<number | null>;
}

const cleanups: (() => Promise<void> | void)[] = [];

afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function startStreamAgent(): StreamAgent {
  const proc = spawn(agentBinaryPath(), ['serve', '--stream-fd', '3'], { stdio: ['ignore', 'ignore', 'pipe', 'pipe'] });
  let err = '';
  proc.stderr!.on('data', (b: Buffer) => (err += b.toString()));
  const exited = new Promise<number | null>((res) => proc.once('exit', (code) => res(code)));
  const host = proc.stdio[3] as Socket;
  host.on('error', () => {});
  cleanups.push(async () => {
    host.destroy();
    if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
    await exited;
  });
  return { proc, pid: proc.pid!, host, stderr: () => err, exited };
}

/** Raw frames from the host end, awaited one predicate at a time. */
class FrameReader {
  private readonly decoder = new FrameDecoder();
  private readonly frames: Frame[] = [];
  private waiter: (() => void) | null = null;

  constructor(sock: Socket) {
    sock.on('data', (c: Buffer) => {
      this.frames.push(...this.decoder.push(c));
      this.waiter?.();
    });
  }

  async next(pred: (f: Frame) => boolean, ms = 5000): Promise<Frame> {
    const end = Date.now() + ms;
    for (;;) {
      const i = this.frames.findIndex(pred);
      if (i >= 0) return this.frames.splice(i, 1)[0]!;
      const left = end - Date.now();
      if (left <= 0)
        throw new Error(
          `no matching frame within ${ms} ms; have ${JSON.stringify(this.frames.map((f) => [f.type, f.id]))}`,
        );
      await new Promise<void>((res) => {
        const t = setTimeout(res, left);
        this.waiter = () => {
          clearTimeout(t);
          res();
        };
      });
      this.waiter = null;
    }
  }

  /** Frames received so far and not taken. */
  get queued(): Frame[] {
    return this.frames;
  }
}

const isType = (type: number, id?: number) => (f: Frame) => f.type === type && (id === undefined || f.id === id);

async function waitGone(pid: number, ms = 3000): Promise<boolean> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (!existsSync(`/proc/${pid}`)) return true;
    await new Promise((r) => setTimeout(r, 20));
  }
  return !existsSync(`/proc/${pid}`);
}

/** utime + stime of a process, in clock ticks. */
function cpuTicks(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // fields[0] is field 3 (state): utime is field 14, stime field 15
  return Number(fields[11]) + Number(fields[12]);
}

/**
 * A stand-in for QEMU's `-chardev socket,server=on`: one Unix socket whose current client is
 * spliced onto the agent's stream. A client going away is not seen by the agent (as after a VM
 * restore); output without a client is dropped. `inject` writes to the current client as if the
 * agent had sent it.
 */
async function startRelay(
  host: Socket,
): Promise<{ path: string; inject(b: Buffer): void; onNextClient(b: Buffer): void; clients: () => number }> {
  const dir = await mkdtemp(join(tmpdir(), 'snaplab-test-stream-'));
  const path = join(dir, 'chardev.sock');
  let current: Socket | null = null;
  let count = 0;
  let greeting: Buffer | null = null;
  host.on('data', (d: Buffer) => current?.write(d));
  const server: Server = createServer((conn) => {
    count++;
    current?.destroy();
    current = conn;
    if (greeting) conn.write(greeting);
    greeting = null;
    conn.on('data', (d: Buffer) => host.write(d));
    conn.on('error', () => {});
    conn.on('close', () => {
      if (current === conn) current = null;
    });
  });
  await new Promise<void>((res) => server.listen(path, res));
  cleanups.push(async () => {
    current?.destroy();
    await new Promise<void>((res) => server.close(() => res()));
    await rm(dir, { recursive: true, force: true });
  });
  return { path, inject: (b) => current?.write(b), onNextClient: (b) => (greeting = b), clients: () => count };
}

describe('agent serving a stream (--stream-fd)', () => {
  it('is a socketpair end; says HELLO at start; PING, EXEC work', async () => {
    const a = startStreamAgent();
    expect(readlinkSync(`/proc/${a.pid}/fd/3`)).toMatch(/^socket:/);
    const r = new FrameReader(a.host);
    const hello = await r.next(isType(MsgType.HELLO));
    expect(hello.id).toBe(0);
    const h = decodeHello(hello.payload);
    expect(h.major).toBe(1);
    expect(h.pid).toBe(a.pid);

    a.host.write(encodeFrame(MsgType.PING, 7, Buffer.from('abc')));
    const pong = await r.next(isType(MsgType.PONG, 7));
    expect(pong.payload.toString()).toBe('abc');

    a.host.write(encodeFrame(MsgType.EXEC, 8, encodeExec({ argv: ['echo', 'over the stream'], env: ENV })));
    await r.next(isType(MsgType.STARTED, 8));
    expect((await r.next(isType(MsgType.STDOUT, 8))).payload.toString()).toBe('over the stream\n');
    const exit = await r.next(isType(MsgType.EXIT, 8));
    expect(exit.payload.readInt32LE(0)).toBe(0);
  });

  it('RESET answers HELLO with its id and kills the execs of the old session', async () => {
    const a = startStreamAgent();
    const r = new FrameReader(a.host);
    await r.next(isType(MsgType.HELLO, 0));
    a.host.write(encodeFrame(MsgType.EXEC, 5, encodeExec({ argv: ['sleep', '30'], env: ENV })));
    const pid = decodeStarted((await r.next(isType(MsgType.STARTED, 5))).payload);
    expect(existsSync(`/proc/${pid}`)).toBe(true);

    // RESET and a request of the new session in one write: the request must survive the reset.
    a.host.write(Buffer.concat([encodeFrame(MsgType.RESET, 6), encodeFrame(MsgType.PING, 5, Buffer.from('new'))]));
    const hello = await r.next(isType(MsgType.HELLO, 6));
    expect(decodeHello(hello.payload).pid).toBe(a.pid);
    expect(await waitGone(pid)).toBe(true);
    // id 5 now names the new session's PING, not the killed exec: no EXIT for it, ever.
    expect((await r.next(isType(MsgType.PONG, 5))).payload.toString()).toBe('new');
    await new Promise((res) => setTimeout(res, 200));
    expect(r.queued.filter((f) => f.id === 5)).toEqual([]);
  });

  it('client with { reset: true }: new session per connection, skips leftovers and unknown ids', async () => {
    const a = startStreamAgent();
    const relay = await startRelay(a.host);
    // The agent's start-up HELLO went nowhere (no client yet), as on a VM nobody watches.
    const c1 = await AgentClient.connect(relay.path, { timeoutMs: 5000, reset: true });
    expect(c1.agentPid).toBe(a.pid);
    expect(await c1.ping()).toBeGreaterThan(0);
    const h1 = c1.exec({ argv: ['sleep', '30'], env: ENV });
    const sleeper = await h1.pid;
    expect(existsSync(`/proc/${sleeper}`)).toBe(true);
    await c1.close();
    await expect(h1.result).rejects.toMatchObject({ code: 'AGENT_UNREACHABLE' });
    // The agent did not see that host go: the sleeper lives on until the next RESET.
    await new Promise((res) => setTimeout(res, 100));
    expect(existsSync(`/proc/${sleeper}`)).toBe(true);

    // Leftovers of the old session reach the next client first: a torn frame tail, whole
    // frames for ids it never used, an unsolicited HELLO. None of it may derail it.
    relay.onNextClient(
      Buffer.concat([
        Buffer.from('tail of a torn frame'),
        encodeFrame(MsgType.STDOUT, 4242, Buffer.from('old output')),
        encodeFrame(MsgType.HELLO, 0, Buffer.alloc(8)),
        encodeFrame(MsgType.EXIT, 1, Buffer.alloc(48)),
      ]),
    );
    const c2 = await AgentClient.connect(relay.path, { timeoutMs: 5000, reset: true });
    expect(await waitGone(sleeper)).toBe(true);

    // After the session start: frames for unknown ids are ignored.
    relay.inject(encodeFrame(MsgType.EXIT, 0x7fff0001, Buffer.alloc(48)));
    relay.inject(encodeFrame(MsgType.DATA, 12345, Buffer.from('stray')));
    const res = await c2.exec({ argv: ['sh', '-c', 'echo $((6*7))'], env: ENV }).result;
    expect(res.exitCode).toBe(0);
    expect(res.stdout.toString()).toBe('42\n');
    expect(await c2.getFile('/proc/self/comm')).toEqual(Buffer.from('snaplab-agent\n'));
    await c2.close();
    expect(relay.clients()).toBe(2);
  });

  it('client: an unsolicited HELLO after the session start ends it loudly (no hang)', async () => {
    const a = startStreamAgent();
    const relay = await startRelay(a.host);
    const c = await AgentClient.connect(relay.path, { timeoutMs: 5000, reset: true });
    const h = c.exec({ argv: ['sleep', '30'], env: ENV });
    const pid = await h.pid;
    relay.inject(encodeFrame(MsgType.HELLO, 0, Buffer.alloc(8))); // as after an unseen hang-up
    await expect(h.result).rejects.toMatchObject({ code: 'AGENT_UNREACHABLE' });
    await expect(c.ping()).rejects.toMatchObject({ code: 'AGENT_UNREACHABLE' });
    // The relay hides that host going away; the next RESET ends the sleeper.
    const c2 = await AgentClient.connect(relay.path, { timeoutMs: 5000, reset: true });
    expect(await waitGone(pid)).toBe(true);
    await c2.close();
  });

  it('host side closes: the session ends, the agent stays alive and idle, and exits on SIGTERM', async () => {
    const a = startStreamAgent();
    const r = new FrameReader(a.host);
    await r.next(isType(MsgType.HELLO, 0));
    a.host.write(encodeFrame(MsgType.EXEC, 1, encodeExec({ argv: ['sleep', '30'], env: ENV })));
    const pid = decodeStarted((await r.next(isType(MsgType.STARTED, 1))).payload);

    a.host.destroy(); // the peer is gone for good: EOF and hang-up on the agent's end
    expect(await waitGone(pid)).toBe(true);
    await new Promise((res) => setTimeout(res, 200));
    const before = cpuTicks(a.pid);
    await new Promise((res) => setTimeout(res, 1000));
    const after = cpuTicks(a.pid);
    expect(a.proc.exitCode).toBeNull();
    expect(after - before).toBeLessThanOrEqual(3);

    a.proc.kill('SIGTERM');
    expect(await a.exited).toBe(0);
    expect(a.stderr()).toBe('');
  });

  it('flags: exactly one transport; --stream PATH must open', async () => {
    const run = (args: string[]) =>
      new Promise<{ code: number | null; err: string }>((res) => {
        const p = spawn(agentBinaryPath(), args, { stdio: ['ignore', 'ignore', 'pipe'] });
        let err = '';
        p.stderr!.on('data', (b: Buffer) => (err += b.toString()));
        p.once('exit', (code) => res({ code, err }));
      });
    expect((await run(['serve', '--stream-fd', '3', '--stream', '/dev/null'])).code).toBe(2);
    expect((await run(['serve', '--socket', '/tmp/x.sock', '--stream-fd', '3'])).code).toBe(2);
    const missing = await run(['serve', '--stream', '/nonexistent/vport0p1']);
    expect(missing.code).toBe(1);
    expect(missing.err).toContain('/nonexistent/vport0p1: No such file or directory');
  });
});
