/**
 * The real agent binary, as a host process and as PID 1 under bwrap, driven by AgentClient.
 * Needs native/build/snaplab-agent (make -C native), root, bwrap and busybox.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { isSnaplabError } from '../errors.js';
import { agentBinaryPath } from './binary.js';
import { AgentClient, type ExecRequest } from './client.js';
import {
  decodeError,
  decodeKept,
  decodeStarted,
  encodeExec,
  encodeFrame,
  encodeHello,
  encodeU32,
  type Frame,
  FrameDecoder,
  HEADER_SIZE,
  type KeptExec,
  MAX_PAYLOAD,
  MsgType,
} from './protocol.js';

const ENV = ['PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin', 'LANG=C'];
// Docker's default capability set: without CAP_SYS_TIME, SET_CLOCK must fail rather than move the host clock.
const DOCKER_CAPS =
  'CAP_CHOWN,CAP_DAC_OVERRIDE,CAP_FOWNER,CAP_FSETID,CAP_KILL,CAP_SETGID,CAP_SETUID,CAP_SETPCAP,CAP_NET_BIND_SERVICE,CAP_NET_RAW,CAP_SYS_CHROOT,CAP_MKNOD,CAP_AUDIT_WRITE,CAP_SETFCAP';

interface RunningAgent {
  dir: string;
  socketPath: string;
  proc: ChildProcess;
  stderr: () => string;
  stop(): Promise<number | null>;
}

async function startAgent(opts: { bwrap?: boolean; caps?: string } = {}): Promise<RunningAgent> {
  const dir = await mkdtemp(join(tmpdir(), 'snaplab-test-agent-'));
  const socketPath = join(dir, 'agent.sock');
  const args = ['serve', '--socket', socketPath, '--ready-fd', '3'];
  if (opts.caps) args.push('--caps', opts.caps);
  const bin = agentBinaryPath();
  const [cmd, argv] = opts.bwrap
    ? [
        'bwrap',
        [
          '--unshare-pid',
          '--as-pid-1',
          '--die-with-parent',
          '--bind',
          '/',
          '/',
          '--dev',
          '/dev',
          '--proc',
          '/proc',
          bin,
          ...args,
        ],
      ]
    : [bin, args];
  const proc = spawn(cmd, argv as string[], { stdio: ['ignore', 'ignore', 'pipe', 'pipe'] });
  let err = '';
  proc.stderr!.on('data', (b: Buffer) => (err += b.toString()));
  const exited = new Promise<number | null>((res) => proc.once('exit', (code) => res(code)));
  await new Promise<void>((resolve, reject) => {
    const ready = proc.stdio[3] as NodeJS.ReadableStream;
    ready.once('data', () => resolve());
    void exited.then((c) => reject(new Error(`agent exited (${c}) before ready: ${err}`)));
  });
  return {
    dir,
    socketPath,
    proc,
    stderr: () => err,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM');
      const t = setTimeout(() => proc.kill('SIGKILL'), 3000);
      const code = await exited;
      clearTimeout(t);
      await rm(dir, { recursive: true, force: true });
      return code;
    },
  };
}

const alive = (pid: number): boolean => {
  try {
    // A zombie still has /proc/PID; count it as gone only when reaped.
    return existsSync(`/proc/${pid}`);
  } catch {
    return false;
  }
};

async function waitGone(pid: number, ms = 2000): Promise<boolean> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (!alive(pid)) return true;
    await new Promise((r) => setTimeout(r, 20));
  }
  return !alive(pid);
}

/** A client of a fake agent that says protocol 1.`minor` and nothing more, for `fn`. */
async function withOldAgent(minor: number, fn: (old: AgentClient) => void | Promise<void>): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'snaplab-test-old-agent-'));
  const path = join(dir, 'old.sock');
  const server = createServer((c) =>
    c.write(encodeFrame(MsgType.HELLO, 0, encodeHello({ major: 1, minor, pid: 1, agentVersion: '0.0.9' }))),
  );
  await new Promise<void>((res) => server.listen(path, res));
  try {
    const old = await AgentClient.connect(path, { timeoutMs: 2000 });
    await fn(old);
    await old.close();
  } finally {
    server.close();
    await rm(dir, { recursive: true, force: true });
  }
}

describe('agent on the host', () => {
  let agent: RunningAgent;
  let client: AgentClient;
  const run = (argv: string[], extra: Partial<ExecRequest> = {}) => client.exec({ argv, env: ENV, ...extra }).result;

  beforeAll(async () => {
    agent = await startAgent();
    client = await AgentClient.connect(agent.socketPath, { timeoutMs: 5000 });
  });
  afterAll(async () => {
    await client?.close();
    expect(await agent?.stop()).toBe(0); // SIGTERM: kill children, exit 0
  });

  it('says HELLO and answers ping', async () => {
    expect(client.protocolVersion).toBe('1.8');
    expect(client.agentVersion).toMatch(/^\d+\.\d+\.\d+/);
    expect(client.agentPid).toBe(agent.proc.pid);
    expect(await client.ping()).toBeGreaterThanOrEqual(0);
  });

  it('runs true, false and reports exit codes and usage', async () => {
    const t = await run(['/bin/true']);
    expect(t).toMatchObject({ exitCode: 0, signal: null, timedOut: false, notFound: false });
    expect(t.usage.wallMs).toBeGreaterThan(0);
    expect(t.usage.maxRssKb).toBeGreaterThan(0);
    expect((await run(['false'])).exitCode).toBe(1);
    expect((await run(['sh', '-c', 'exit 42'])).exitCode).toBe(42);
  });

  it('streams stdout and stderr in order, before the exit', async () => {
    const events: string[] = [];
    const t0 = Date.now();
    let firstAt = 0;
    const h = client.exec(
      { argv: ['sh', '-c', 'echo a; sleep 0.1; echo b >&2; sleep 0.1; echo c; sleep 0.3; echo d >&2'], env: ENV },
      {
        onStdout: (b) => {
          firstAt ||= Date.now() - t0;
          events.push(`out:${b.toString().trim()}`);
        },
        onStderr: (b) => events.push(`err:${b.toString().trim()}`),
      },
    );
    const r = await h.result;
    expect(events).toEqual(['out:a', 'err:b', 'out:c', 'err:d']);
    expect(firstAt).toBeLessThan(r.usage.wallMs - 300); // arrived while the command still ran
    expect(r.stdout.length).toBe(0); // callbacks given: nothing collected
    const big = await run(['sh', '-c', 'seq 1 200000; echo tail >&2']);
    expect(big.stdout.toString()).toBe(Array.from({ length: 200000 }, (_, i) => `${i + 1}\n`).join(''));
    expect(big.stderr.toString()).toBe('tail\n');
  });

  it('reports 127 for a missing command and 126 for a non-executable file', async () => {
    const r = await run(['no-such-command-snaplab']);
    expect(r).toMatchObject({ exitCode: 127, notFound: true });
    expect(r.stderr.toString()).toBe('snaplab: no-such-command-snaplab: command not found\n');
    expect((await run(['/nonexistent/x'])).exitCode).toBe(127);
    const f = join(agent.dir, 'not-exec.sh');
    await writeFile(f, '#!/bin/sh\necho hi\n');
    await chmod(f, 0o644);
    const n = await run([f]);
    expect(n).toMatchObject({ exitCode: 126, notFound: false });
    expect(n.stderr.toString()).toMatch(/Permission denied/);
  });

  it('kills the whole process group on timeout: 124, nothing left', async () => {
    let gpid = 0;
    const h = client.exec(
      { argv: ['sh', '-c', 'sleep 30 & echo $!; wait'], env: ENV, timeoutMs: 300 },
      { onStdout: (b) => (gpid = Number(b.toString().trim())) },
    );
    const pid = await h.pid;
    const r = await h.result;
    expect(r).toMatchObject({ exitCode: 124, timedOut: true, signal: 9 });
    expect(r.usage.wallMs).toBeGreaterThanOrEqual(290);
    expect(r.usage.wallMs).toBeLessThan(2000);
    expect(gpid).toBeGreaterThan(0);
    expect(await waitGone(pid)).toBe(true);
    expect(await waitGone(gpid)).toBe(true);
  });

  it('delivers a signal: 128+N', async () => {
    const h = client.exec({ argv: ['sleep', '30'], env: ENV });
    await h.pid;
    h.kill(15);
    expect(await h.result).toMatchObject({ exitCode: 143, signal: 15, timedOut: false });
  });

  it('forwards stdin, including EOF and large input', async () => {
    const h = client.exec({ argv: ['cat'], env: ENV, stdin: true });
    h.write('hello ');
    h.write(Buffer.from('world'));
    h.end();
    expect((await h.result).stdout.toString()).toBe('hello world');
    const w = client.exec({ argv: ['wc', '-c'], env: ENV, stdin: true });
    w.write(Buffer.alloc(5 * 1024 * 1024, 1));
    w.end();
    expect((await w.result).stdout.toString().trim()).toBe(String(5 * 1024 * 1024));
    expect((await run(['cat'])).stdout.length).toBe(0); // no stdin: /dev/null
  });

  it('holds back a fast sender per exec (STDIN_ACK credits): the connection is still read meanwhile', async () => {
    // 64 MiB to a command that reads nothing for 2 s: without flow control the agent would queue
    // all of it; with it, the client waits for credit and the agent's peak stays small
    const h = client.exec({ argv: ['sh', '-c', 'sleep 2; cat >/dev/null; echo done'], env: ENV, stdin: true });
    const chunk = Buffer.alloc(1024 * 1024, 7);
    let waited = 0;
    const feeding = (async () => {
      for (let i = 0; i < 64; i++) {
        if (!h.write(chunk)) {
          waited++;
          await h.drained();
        }
      }
      h.end();
    })();
    await new Promise((r) => setTimeout(r, 300));
    // while that command holds its input back, the connection serves everything else at once
    const t0 = performance.now();
    await client.ping();
    const stuck = client.exec({ argv: ['sleep', '3600'], env: ENV, stdin: true });
    for (let i = 0; i < 8; i++) stuck.write(chunk); // far past its window: it reads nothing
    stuck.kill(9);
    expect((await stuck.result).signal).toBe(9);
    expect(performance.now() - t0).toBeLessThan(1500);
    await feeding;
    expect((await h.result).stdout.toString()).toBe('done\n');
    expect(waited).toBeGreaterThan(0);
    const hwm = Number(/VmHWM:\s+(\d+) kB/.exec(await readFile(`/proc/${agent.proc.pid}/status`, 'utf8'))![1]);
    expect(hwm).toBeLessThan(40 * 1024); // KiB; the whole input would be 64 MiB
  });

  it('one big write waits on the host, not in the agent; a command that closes its stdin costs nothing', async () => {
    const big = client.exec({ argv: ['sh', '-c', 'sleep 1; wc -c'], env: ENV, stdin: true });
    expect(big.write(Buffer.alloc(100 * 1024 * 1024, 1))).toBe(false); // far past the window: queued here
    big.end();
    expect((await big.result).stdout.toString().trim()).toBe(String(100 * 1024 * 1024));
    const ticks = async (): Promise<number> => {
      const f = (await readFile(`/proc/${agent.proc.pid}/stat`, 'utf8')).split(')')[1]!.trim().split(' ');
      return Number(f[11]) + Number(f[12]);
    };
    const closer = client.exec({ argv: ['sh', '-c', 'exec 0<&-; sleep 1'], env: ENV, stdin: true });
    const before = await ticks();
    const r = await closer.result;
    expect(r.exitCode).toBe(0);
    expect((await ticks()) - before).toBeLessThan(20); // a second of 10 ms ticks: idle
    closer.write('late'); // to a finished exec: nothing, and no error
  });

  it('runs a command on a terminal: a tty of its own, its size, SIGWINCH on resize, ^C', async () => {
    const t = await client.exec({
      argv: ['sh', '-c', 'tty; stty size; [ -t 0 ] && [ -t 2 ] && echo both-tty; echo err >&2'],
      env: ENV,
      tty: { cols: 90, rows: 33 },
    }).result;
    expect(t.exitCode).toBe(0);
    expect(t.stdout.toString()).toMatch(/^\/dev\/pts\/\d+\r\n33 90\r\nboth-tty\r\nerr\r\n$/); // stderr too, ONLCR on
    expect(t.stderr.length).toBe(0);

    let out = '';
    const w = client.exec(
      {
        argv: ['sh', '-c', 'trap "stty size" WINCH; echo ready; while :; do sleep 0.05; done'],
        env: ENV,
        tty: { cols: 80, rows: 24 },
        stdin: true,
      },
      { onStdout: (b) => (out += b.toString()) },
    );
    await vi.waitFor(() => expect(out).toContain('ready'), { timeout: 5000 });
    w.resize({ cols: 120, rows: 50 });
    await vi.waitFor(() => expect(out).toContain('50 120'), { timeout: 5000 });
    w.write('\x03'); // ^C through the terminal's line discipline: SIGINT to its foreground group
    const r = await w.result;
    expect(r.signal).toBe(2);
    expect(r.exitCode).toBe(130);

    // end of input on a terminal closes only the agent's input side: it must not spin on it
    const cpu = async (): Promise<number> => {
      const f = (await readFile(`/proc/${agent.proc.pid}/stat`, 'utf8')).split(')')[1]!.trim().split(' ');
      return Number(f[11]) + Number(f[12]); // utime + stime, in clock ticks
    };
    const quiet = client.exec({ argv: ['sleep', '1'], env: ENV, tty: { cols: 80, rows: 24 }, stdin: true });
    quiet.write(Buffer.alloc(64 * 1024, 0x61));
    quiet.end();
    const before = await cpu();
    await quiet.result;
    expect((await cpu()) - before).toBeLessThan(20); // ticks of 10 ms over that second: idle, not 100
  });

  it('refuses a terminal to an agent older than protocol 1.2, clearly', async () => {
    await withOldAgent(1, (old) => {
      let e: unknown;
      try {
        old.exec({ argv: ['sh'], env: ENV, tty: { cols: 80, rows: 24 } });
      } catch (x) {
        e = x;
      }
      expect(e).toMatchObject({
        code: 'AGENT_PROTOCOL',
        message: expect.stringMatching(/protocol 1\.1.*terminal \(1\.2 can\)/),
      });
    });
  });

  it('passes env exactly and honours cwd', async () => {
    const e = await client.exec({ argv: ['/usr/bin/env'], env: ['A=1', 'B=two words', 'PATH=/bin'] }).result;
    expect(e.stdout.toString()).toBe('A=1\nB=two words\nPATH=/bin\n');
    const c = await run(['pwd'], { cwd: agent.dir });
    expect(c.stdout.toString()).toBe(`${agent.dir}\n`);
    // PATH comes from the command's env, not the agent's
    expect((await client.exec({ argv: ['true'], env: ['PATH=/nowhere'] }).result).exitCode).toBe(127);
    const bad = run(['true'], { cwd: '/no/such/dir' });
    await expect(bad).rejects.toMatchObject({
      code: 'BAD_INPUT',
      message: expect.stringMatching(/^cwd \/no\/such\/dir: .*ENOENT/),
    });
  });

  it('does not wait for a background grandchild holding the pipe', async () => {
    const t0 = performance.now();
    const r = await run(['sh', '-c', 'sleep 3 & echo done']);
    expect(r.stdout.toString()).toBe('done\n');
    expect(performance.now() - t0).toBeLessThan(1500);
  });

  it('with waitOutput (1.8), waits for what the command left holding its output, and stops waiting on a kill or a timeout', async () => {
    // what a background child writes after its shell has exited, on both streams, comes before the end
    const late = await run(['sh', '-c', '(sleep 0.3; echo late; echo also >&2) & echo early; exit 3'], {
      waitOutput: true,
    });
    expect([late.exitCode, late.stdout.toString(), late.stderr.toString()]).toEqual([3, 'early\nlate\n', 'also\n']);
    // one that holds it in a session of its own (out of the group's reach): a SIGKILL, or a timeout, ends the wait
    const held: number[] = [];
    try {
      for (const how of ['kill', 'timeout'] as const) {
        let out = '';
        const h = client.exec(
          {
            argv: ['sh', '-c', 'setsid sleep 30 & echo $!'],
            env: ENV,
            waitOutput: true,
            timeoutMs: how === 'timeout' ? 800 : undefined,
          },
          { onStdout: (b) => (out += b.toString()) },
        );
        await vi.waitFor(() => expect(out).toMatch(/^\d+\n$/), { timeout: 5000 });
        held.push(Number(out));
        const t0 = performance.now();
        if (how === 'kill') {
          // its shell is gone, its output still held: the end has not come
          await new Promise((r) => setTimeout(r, 300));
          let ended = false;
          void h.result.then(() => (ended = true));
          await new Promise((r) => setTimeout(r, 50));
          expect(ended).toBe(false);
          h.kill(9);
        }
        const r = await h.result;
        expect(performance.now() - t0).toBeLessThan(5000);
        // the shell's own status (it exited 0 before the kill); a timeout says so
        expect([r.exitCode, r.timedOut]).toEqual(how === 'kill' ? [0, false] : [124, true]);
      }
    } finally {
      for (const pid of held) if (pid > 0) process.kill(pid, 'SIGKILL');
    }
  });

  it('puts and gets files, 1 MiB binary, creating parents atomically', async () => {
    const data = randomBytes(1024 * 1024);
    const p = join(agent.dir, 'a/b/c/blob.bin');
    await client.putFile(p, data, 0o600);
    expect((await client.getFile(p)).equals(data)).toBe(true);
    expect((await stat(p)).mode & 0o777).toBe(0o600);
    await client.putFile(p, Buffer.from('small'));
    expect((await client.getFile(p)).toString()).toBe('small');
    expect((await stat(p)).mode & 0o777).toBe(0o644);
    expect((await client.getFile('/proc/self/status')).toString()).toMatch(/^Name:\s+snaplab-agent/);
    await expect(client.getFile(join(agent.dir, 'missing'))).rejects.toMatchObject({
      code: 'AGENT_ERROR',
      message: expect.stringMatching(/ENOENT/),
    });
    await expect(client.getFile(agent.dir)).rejects.toMatchObject({
      code: 'AGENT_ERROR',
      message: expect.stringMatching(/EISDIR/),
    });
    await expect(client.putFile(p, Buffer.alloc(MAX_PAYLOAD))).rejects.toMatchObject({ code: 'AGENT_PROTOCOL' });
    expect(await client.ping()).toBeGreaterThanOrEqual(0); // still usable
  });

  it('multiplexes many concurrent execs over one connection', async () => {
    const n = 200;
    const rs = await Promise.all(
      Array.from({ length: n }, (_, i) => run(['sh', '-c', 'echo $0; exit $(($0 % 7))', String(i)])),
    );
    rs.forEach((r, i) => {
      expect(r.stdout.toString()).toBe(`${i}\n`);
      expect(r.exitCode).toBe(i % 7);
    });
  });

  it('applies the seccomp filter: namespaces and mounts are denied', async () => {
    const u = await run(['/bin/busybox', 'unshare', '-n', 'true']);
    expect(u.exitCode).not.toBe(0);
    expect(u.stderr.toString()).toMatch(/Operation not permitted/);
    const ul = await run(['unshare', '-n', 'true']); // util-linux
    expect(ul.exitCode).not.toBe(0);
    expect(ul.stderr.toString()).toMatch(/Operation not permitted/);
    const m = await run(['/bin/busybox', 'mount', '-t', 'tmpfs', 'x', agent.dir]);
    expect(m.stderr.toString()).toMatch(/Operation not permitted|permission denied/i);
    // plain fork/threads still work (clone without CLONE_NEW*)
    expect((await run(['sh', '-c', '(true) && echo ok'])).stdout.toString()).toBe('ok\n');
    const status = (await run(['cat', '/proc/self/status'])).stdout.toString();
    expect(status).toMatch(/NoNewPrivs:\s+1/);
    expect(status).toMatch(/Seccomp:\s+2/);
  });

  it('abort signal kills the exec and rejects with ABORTED', async () => {
    const ac = new AbortController();
    const h = client.exec({ argv: ['sleep', '30'], env: ENV }, { signal: ac.signal });
    const pid = await h.pid;
    ac.abort();
    await expect(h.result).rejects.toMatchObject({ code: 'ABORTED' });
    expect(await waitGone(pid)).toBe(true);
    const pre = client.exec({ argv: ['true'], env: ENV }, { signal: AbortSignal.abort() });
    await expect(pre.result).rejects.toMatchObject({ code: 'ABORTED' });
  });

  it('takes a HELLO that came while this process was too busy to read it: no false timeout', async () => {
    const pending = AgentClient.connect(agent.socketPath, { timeoutMs: 100 });
    // hold the event loop well past the wait, as a daemon's pass over thousands of records or a
    // loaded host does; the agent (another process) answers meanwhile
    const until = Date.now() + 600;
    while (Date.now() < until) {
      /* busy */
    }
    const c = await pending;
    expect(c.protocolVersion).toBe('1.8');
    await c.close();
  });

  it('kills the execs of a connection that closes', async () => {
    const c2 = await AgentClient.connect(agent.socketPath, { timeoutMs: 5000 });
    const h = c2.exec({ argv: ['sleep', '30'], env: ENV });
    const pid = await h.pid;
    await c2.close();
    await expect(h.result).rejects.toMatchObject({ code: 'AGENT_UNREACHABLE' });
    expect(await waitGone(pid)).toBe(true);
  });

  it('keeps a command started with keep past its connection: listed with its tag, taken on by another (1.5)', async () => {
    const c2 = await AgentClient.connect(agent.socketPath, { timeoutMs: 5000 });
    // counts once a second; reads a line of input and echoes it
    const script = 'i=0; while :; do i=$((i+1)); echo tick $i; read -t 1 l && echo got $l; done';
    const h = c2.exec({ argv: ['bash', '-c', script], env: ENV, stdin: true, keep: { tag: '{"id":"t1"}' } });
    const plain = c2.exec({ argv: ['sleep', '30'], env: ENV });
    const pid = await h.pid;
    const plainPid = await plain.pid;
    expect((await c2.kept()).map((k) => [k.pid, k.tag, k.held, k.stdin])).toEqual([[pid, '{"id":"t1"}', true, true]]);
    // held by c2: another connection may not take it
    const c3 = await AgentClient.connect(agent.socketPath, { timeoutMs: 5000 });
    await expect(c3.attach(pid).result).rejects.toMatchObject({ code: 'AGENT_ERROR', message: /EBUSY/ });
    await c2.close();
    await expect(h.result).rejects.toMatchObject({ code: 'AGENT_UNREACHABLE' });
    await expect(plain.result).rejects.toMatchObject({ code: 'AGENT_UNREACHABLE' });
    expect(await waitGone(plainPid)).toBe(true); // the one not kept ends with its connection
    // it runs on, unheld, its output read and dropped meanwhile (~3 lines)
    await new Promise((r) => setTimeout(r, 2500));
    expect(process.kill(pid, 0)).toBe(true);
    expect((await c3.kept()).map((k) => [k.pid, k.held])).toEqual([[pid, false]]);
    let out = '';
    const again = c3.attach(pid, { onStdout: (b) => (out += b.toString()) });
    expect(await again.pid).toBe(pid);
    // what it wrote before, read by c2 or dropped since: `tick 1` … `tick 3` at least
    expect(await again.since).toBeGreaterThanOrEqual('tick 1\ntick 2\ntick 3\n'.length);
    again.write('hello\n');
    await vi.waitFor(() => expect(out).toContain('got hello'), { timeout: 5000 });
    // its output from now on: the counting went on while nobody held it
    const first = Number(/tick (\d+)/.exec(out)?.[1]);
    expect(first).toBeGreaterThanOrEqual(3);
    again.kill(15);
    const r = await again.result;
    expect(r.signal).toBe(15);
    expect(await c3.kept()).toEqual([]);
    await expect(c3.attach(pid).result).rejects.toMatchObject({ message: /ESRCH/ });
    await c3.close();
  });

  it('a kept command whose end of input was on its way when its connection closed still gets it', async () => {
    const c2 = await AgentClient.connect(agent.socketPath, { timeoutMs: 5000 });
    // it reads nothing for a second: the input waits in the agent, the end of input behind it
    const h = c2.exec({
      argv: ['sh', '-c', 'sleep 1; cat >/dev/null'],
      env: ENV,
      stdin: true,
      keep: { tag: '' },
    });
    const pid = await h.pid;
    h.write(Buffer.alloc(200 << 10, 'x'));
    h.end();
    await c2.close();
    await expect(h.result).rejects.toMatchObject({ code: 'AGENT_UNREACHABLE' });
    expect(await waitGone(pid, 5000)).toBe(true);
  });

  it('lets one kept exec go on request (DETACH, 1.6), its connection staying: a relay whose client left', async () => {
    const s = connect(agent.socketPath);
    const dec = new FrameDecoder();
    const frames: Frame[] = [];
    s.on('data', (b: Buffer) => frames.push(...dec.push(b)));
    const next = (type: number, id: number): Promise<Frame> =>
      vi.waitFor(
        () => {
          const f = frames.find((x) => x.type === type && x.id === id);
          if (!f) throw new Error(`no 0x${type.toString(16)} for ${id} yet`);
          return f;
        },
        { timeout: 5000 },
      );
    const kept = async (id: number): Promise<KeptExec[]> => {
      s.write(encodeFrame(MsgType.LIST_KEPT, id));
      return decodeKept((await next(MsgType.DATA, id)).payload);
    };
    try {
      expect((await next(MsgType.HELLO, 0)).payload.readUInt16LE(2)).toBe(8);
      const loop = ['sh', '-c', 'while :; do echo x; sleep 0.1; done'];
      s.write(encodeFrame(MsgType.EXEC, 1, encodeExec({ argv: loop, env: ENV, keep: { tag: 'k' } })));
      s.write(encodeFrame(MsgType.EXEC, 2, encodeExec({ argv: ['sleep', '30'], env: ENV })));
      const pid = decodeStarted((await next(MsgType.STARTED, 1)).payload);
      const plainPid = decodeStarted((await next(MsgType.STARTED, 2)).payload);
      expect((await kept(3)).map((k) => [k.pid, k.held])).toEqual([[pid, true]]);
      s.write(encodeFrame(MsgType.DETACH, 1));
      // let go (OK): no more output under its id, listed as held by no one; the connection goes on
      await next(MsgType.OK, 1);
      expect((await kept(4)).map((k) => [k.pid, k.held])).toEqual([[pid, false]]);
      const outputs = frames.filter((f) => f.id === 1).length;
      await new Promise((r) => setTimeout(r, 400));
      expect(frames.filter((f) => f.id === 1)).toHaveLength(outputs);
      expect(frames.some((f) => f.id === 1 && (f.type === MsgType.ERROR || f.type === MsgType.EXIT))).toBe(false);
      // one not kept is not let go (it would run on with nobody to end it), an id that runs nothing neither
      s.write(encodeFrame(MsgType.DETACH, 2));
      expect(decodeError((await next(MsgType.ERROR, 2)).payload).errno).toBe(22); // EINVAL
      s.write(encodeFrame(MsgType.DETACH, 9));
      expect(decodeError((await next(MsgType.ERROR, 9)).payload).errno).toBe(3); // ESRCH
      s.write(encodeFrame(MsgType.DETACH, 2, Buffer.from('x')));
      expect(decodeError((await next(MsgType.ERROR, 2)).payload).errno).toBe(22); // a payload: EINVAL
      expect(process.kill(plainPid, 0)).toBe(true);
      // taken on again, by this same connection, under a new id
      s.write(encodeFrame(MsgType.ATTACH, 5, encodeU32(pid)));
      expect(decodeStarted((await next(MsgType.STARTED, 5)).payload)).toBe(pid);
      await next(MsgType.STDOUT, 5);
      s.write(encodeFrame(MsgType.SIGNAL, 5, encodeU32(9)));
      s.write(encodeFrame(MsgType.SIGNAL, 2, encodeU32(9)));
      await next(MsgType.EXIT, 5);
      await next(MsgType.EXIT, 2);
    } finally {
      s.destroy();
    }
  });

  it('refuses a tag over 4096 bytes, and keep to an agent older than 1.5 (it would kill the command)', async () => {
    expect(() => client.exec({ argv: ['true'], env: ENV, keep: { tag: 'x'.repeat(4097) } })).toThrow(/4096/);
    await withOldAgent(4, async (old) => {
      const tooOld = { code: 'AGENT_PROTOCOL', message: expect.stringMatching(/protocol 1\.4.*\(1\.5 can\)/) };
      expect(() => old.exec({ argv: ['sh'], env: ENV, keep: { tag: '' } })).toThrow(expect.objectContaining(tooOld));
      await expect(old.kept()).rejects.toMatchObject(tooOld);
    });
  });

  it('answers an oversized raw frame with EMSGSIZE and keeps the connection', async () => {
    const s = connect(agent.socketPath);
    const dec = new FrameDecoder();
    const frames: { type: number; id: number; payload: Buffer }[] = [];
    s.on('data', (b: Buffer) => frames.push(...dec.push(b)));
    const h = Buffer.alloc(HEADER_SIZE);
    h.writeUInt32LE(MAX_PAYLOAD + 10, 0);
    h.writeUInt16LE(MsgType.FILE_PUT, 4);
    h.writeUInt32LE(5, 8);
    s.write(h);
    s.write(Buffer.alloc(MAX_PAYLOAD + 10));
    s.write(encodeFrame(MsgType.PING, 6, Buffer.from('x')));
    s.write(encodeFrame(0x7e, 7));
    const until = Date.now() + 10000;
    while (frames.length < 4 && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    s.destroy();
    expect(frames.map((f) => [f.type, f.id])).toEqual([
      [MsgType.HELLO, 0],
      [MsgType.ERROR, 5],
      [MsgType.PONG, 6],
      [MsgType.ERROR, 7],
    ]);
    expect(decodeError(frames[1]!.payload).message).toMatch(/over the/);
    expect(frames[2]!.payload.toString()).toBe('x');
  });

  it('rejects pending requests with AGENT_UNREACHABLE when the agent dies', async () => {
    const other = await startAgent();
    try {
      const c = await AgentClient.connect(other.socketPath, { timeoutMs: 5000 });
      const h = c.exec({ argv: ['sleep', '30'], env: ENV });
      const pid = await h.pid;
      other.proc.kill('SIGKILL');
      await expect(h.result).rejects.toMatchObject({ code: 'AGENT_UNREACHABLE' });
      await expect(c.ping()).rejects.toMatchObject({ code: 'AGENT_UNREACHABLE' });
      process.kill(pid, 'SIGKILL'); // the agent could not clean up after SIGKILL
    } finally {
      await other.stop();
    }
  });

  it('connect fails clearly when nobody listens', async () => {
    const e = await AgentClient.connect(join(agent.dir, 'nope.sock'), { timeoutMs: 1000 }).catch((x: unknown) => x);
    expect(isSnaplabError(e, 'AGENT_UNREACHABLE')).toBe(true);
  });
});

describe('agent as PID 1 under bwrap', () => {
  let agent: RunningAgent;
  let client: AgentClient;
  const run = (argv: string[]) => client.exec({ argv, env: ENV }).result;

  beforeAll(async () => {
    agent = await startAgent({ bwrap: true, caps: DOCKER_CAPS });
    client = await AgentClient.connect(agent.socketPath, { timeoutMs: 5000 });
  });
  afterAll(async () => {
    await client?.close();
    await agent?.stop();
  });

  it('is PID 1 and parent of its commands', async () => {
    expect(client.agentPid).toBe(1);
    expect((await run(['sh', '-c', 'echo $PPID'])).stdout.toString()).toBe('1\n');
  });

  it('reaps orphans: no zombies left', async () => {
    for (let i = 0; i < 5; i++) expect((await run(['sh', '-c', 'sleep 0.1 & exit 0'])).exitCode).toBe(0);
    await new Promise((r) => setTimeout(r, 500));
    const ps = (await run(['sh', '-c', 'cat /proc/[0-9]*/stat 2>/dev/null'])).stdout.toString();
    const states = ps
      .split('\n')
      .filter(Boolean)
      .map((l) => /\) (\S) /.exec(l)?.[1]);
    expect(states.length).toBeGreaterThan(0);
    expect(states).not.toContain('Z');
  });

  it('a pid that comes round again names one exec: one still waiting for its output (1.8) ends when a new one takes its pid', async () => {
    // (an agent of its own: setting the namespace's next pid takes CAP_SYS_ADMIN, which this one's commands lack)
    const full = await startAgent({ bwrap: true });
    const c = await AgentClient.connect(full.socketPath, { timeoutMs: 5000 });
    try {
      let said = '';
      const a = c.exec(
        { argv: ['sh', '-c', 'setsid sleep 30 & echo $$'], env: ENV, waitOutput: true, keep: { tag: 'a' } },
        { onStdout: (b) => (said += b.toString()) },
      );
      await vi.waitFor(() => expect(said).toMatch(/^\d+\n$/), { timeout: 5000 });
      const pid = Number(said);
      const gone = async (): Promise<boolean> =>
        (
          await c.exec({ argv: ['sh', '-c', `test -e /proc/${pid} || echo gone`], env: ENV }).result
        ).stdout.toString() === 'gone\n';
      await vi.waitFor(async () => expect(await gone()).toBe(true), { timeout: 5000 });
      let ended = false;
      void a.result.then(() => (ended = true));
      expect(ended).toBe(false); // its shell reaped, its output held by the setsid'd sleep
      // the next fork gets its pid again (echo is the shell's own: no fork between)
      const set = await c.exec({ argv: ['sh', '-c', `echo ${pid - 1} > /proc/sys/kernel/ns_last_pid`], env: ENV })
        .result;
      expect(set.exitCode).toBe(0);
      const b = c.exec({ argv: ['sleep', '30'], env: ENV, keep: { tag: 'b' } });
      expect(await b.pid).toBe(pid);
      // at once, not when the sleep's 30 s are up
      const soon = new Promise((r) => setTimeout(() => r('still waiting'), 5000));
      expect(await Promise.race([a.result.then((r) => r.exitCode), soon])).toBe(0);
      expect((await c.kept()).map((k) => [k.pid, k.tag])).toEqual([[pid, 'b']]);
      b.kill(9);
      expect((await b.result).signal).toBe(9);
    } finally {
      await c.close();
      await full.stop();
    }
  });

  it('restricts the capability bounding set and refuses SET_CLOCK without CAP_SYS_TIME', async () => {
    const status = (await run(['cat', '/proc/self/status'])).stdout.toString();
    const bnd = BigInt(`0x${/CapBnd:\s+([0-9a-f]+)/.exec(status)![1]}`);
    expect(bnd & (1n << 21n)).toBe(0n); // CAP_SYS_ADMIN gone
    expect(bnd & (1n << 0n)).toBe(1n); // CAP_CHOWN kept
    const now = BigInt(Date.now()) * 1_000_000n;
    await expect(client.setClock(now)).rejects.toMatchObject({
      code: 'AGENT_ERROR',
      message: expect.stringMatching(/EPERM/),
    });
  });
});
