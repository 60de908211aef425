/**
 * Ports: `snaplab port-forward` and `snaplab proxy` reach a service inside a machine from the
 * host's loopback (curl, 50 at once), and a scenario's `ports:` are held by `port-forward SCENARIO`.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createConnection, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { agentBinaryPath } from '../src/agent/binary.js';
import { SNAPLAB } from './cli-command.js';

let home: string;
const env = (): NodeJS.ProcessEnv => ({ ...process.env, SNAPLAB_HOME: home });

function snaplab(args: string[], input?: string): { code: number; out: string; err: string } {
  const r = spawnSync(SNAPLAB, args, { env: env(), input, encoding: 'utf8', timeout: 120_000 });
  return { code: r.status ?? -1, out: r.stdout, err: r.stderr };
}

/** A free port on 127.0.0.1 (bound and released). */
async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

/** Starts a long-running snaplab command and resolves once it printed a line matching `ready`. */
async function running(
  args: string[],
  ready: RegExp,
): Promise<{ proc: ChildProcess; out: () => string; stop: () => Promise<number | null> }> {
  const proc = spawn(SNAPLAB, args, { env: env(), stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  proc.stdout!.on('data', (b: Buffer) => (out += b.toString()));
  proc.stderr!.on('data', (b: Buffer) => (out += b.toString()));
  const exited = new Promise<number | null>((res) => proc.on('close', (c) => res(c)));
  await new Promise<void>((resolve, reject) => {
    const t = setInterval(() => {
      if (!ready.test(out)) return;
      clearInterval(t);
      resolve();
    }, 20);
    void exited.then((c) => {
      clearInterval(t);
      reject(new Error(`exited ${c} before ready: ${out}`));
    });
  });
  const stop = async () => {
    proc.kill('SIGINT');
    return exited;
  };
  return { proc, out: () => out, stop };
}

const curl = (port: number, extra: string[] = []) =>
  spawnSync('curl', ['-s', '--max-time', '10', ...extra, `http://127.0.0.1:${port}/`], { encoding: 'utf8' });

beforeAll(() => {
  home = mkdtempSync(join(tmpdir(), 'snaplab-test-ports-'));
  expect(snaplab(['create', '--name', 'web']).code).toBe(0);
  expect(
    snaplab([
      'exec',
      'web',
      '--',
      'sh',
      '-c',
      'mkdir -p /www && echo hello from inside > /www/index.html && httpd -p 80 -h /www',
    ]).code,
  ).toBe(0);
});
afterAll(() => {
  snaplab(['down', 'pf']);
  snaplab(['rm', '--all']);
  snaplab(['image', 'rm', '--force', 'busybox']);
  snaplab(['gc']);
  rmSync(home, { recursive: true, force: true });
});

describe('snaplab-agent connect (what each forwarded connection runs inside)', () => {
  it('carries both directions at once: a server that writes while it reads never deadlocks it', async () => {
    const server = createServer((c) =>
      c
        .on('data', (b: Buffer) => {
          c.write(b);
          c.write(b);
        })
        .on('end', () => c.end()),
    );
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as { port: number }).port;
    try {
      const p = spawn(agentBinaryPath(), ['connect', String(port)], { stdio: ['pipe', 'pipe', 'pipe'] });
      let got = 0;
      p.stdout!.on('data', (b: Buffer) => (got += b.length));
      const chunk = Buffer.alloc(1 << 20, 5);
      for (let i = 0; i < 32; i++) if (!p.stdin!.write(chunk)) await new Promise((r) => p.stdin!.once('drain', r));
      p.stdin!.end();
      const code = await new Promise<number | null>((r) => p.on('close', r));
      expect(code).toBe(0);
      expect(got).toBe(64 << 20);
    } finally {
      server.close();
    }
  });
});

describe("snaplab-agent connect --check (a scenario VM's tcp ready check)", () => {
  it('exits 0 when the port accepts, without a byte sent, and 1 with the reason when it does not', async () => {
    let bytes = 0;
    const server = createServer((c) => c.on('data', (b: Buffer) => (bytes += b.length)));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as { port: number }).port;
    try {
      const ok = spawnSync(agentBinaryPath(), ['connect', '--check', '127.0.0.1', String(port)], {
        encoding: 'utf8',
        timeout: 10_000,
      });
      expect([ok.status, ok.stdout, ok.stderr]).toEqual([0, '', '']);
    } finally {
      await new Promise((r) => server.close(r));
    }
    expect(bytes).toBe(0);
    const closed = spawnSync(agentBinaryPath(), ['connect', '--check', String(port)], {
      encoding: 'utf8',
      timeout: 10_000,
    });
    expect(closed.status).toBe(1);
    expect(closed.stderr).toMatch(/refused/i);
  });
});

describe('port-forward', () => {
  it('answers curl on 127.0.0.1 from a server inside the machine, 50 connections at once; a taken port is PORT_IN_USE', async () => {
    const port = await freePort();
    const pf = await running(['port-forward', 'web', `${port}:80`], /Forwarding from/);
    try {
      expect(pf.out()).toBe(`Forwarding from 127.0.0.1:${port} -> web:80\n`);
      expect(curl(port).stdout).toBe('hello from inside\n');
      const codes = await Promise.all(
        Array.from(
          { length: 50 },
          () =>
            new Promise<string>((res) => {
              const c = spawn('curl', [
                '-s',
                '-o',
                '/dev/null',
                '-w',
                '%{http_code}',
                '--max-time',
                '20',
                `http://127.0.0.1:${port}/`,
              ]);
              let o = '';
              c.stdout.on('data', (b: Buffer) => (o += b.toString()));
              c.on('close', () => res(o));
            }),
        ),
      );
      expect(codes.filter((c) => c === '200').length).toBe(50);
      // the local port is taken now
      const again = snaplab(['port-forward', 'web', `${port}:80`]);
      expect(again.code).toBe(2);
      expect(again.err).toMatch(/PORT_IN_USE\]: 127\.0\.0\.1:\d+ is already in use[\s\S]*hint:/);
      // a client that half-closes after its request still gets the whole reply
      const half = await new Promise<string>((resolve, reject) => {
        const c = createConnection({ host: '127.0.0.1', port }, () => c.end('GET / HTTP/1.0\r\n\r\n'));
        let got = '';
        c.on('data', (b: Buffer) => (got += b.toString()));
        c.on('close', () => resolve(got));
        c.on('error', reject);
      });
      expect(half).toMatch(/^HTTP\/1\.[01] 200 OK[\s\S]*hello from inside\n$/);
      expect(curl(port).stdout).toBe('hello from inside\n');
    } finally {
      expect(await pf.stop()).toBe(0);
    }
    expect(curl(port).status).not.toBe(0); // nothing listens any more
    // it listened on loopback only: the forward never bound another address
    expect(snaplab(['port-forward', 'web', 'x:80'])).toMatchObject({
      code: 2,
      err: expect.stringMatching(/BAD_INPUT\]: invalid port/),
    });
  });

  it('proxy: a stdio stream to a port inside (what ssh ProxyCommand runs); a closed port fails clearly', () => {
    const r = spawnSync(SNAPLAB, ['proxy', 'web', '80'], {
      env: env(),
      input: 'GET / HTTP/1.0\r\n\r\n',
      encoding: 'utf8',
      timeout: 30_000,
    });
    expect(r.status).toBe(0);
    expect(r.stdout).toMatch(/^HTTP\/1\.[01] 200 OK[\s\S]*hello from inside\n$/);
    const closed = snaplab(['proxy', 'web', '81'], '');
    expect(closed.code).toBe(1);
    expect(closed.err).toMatch(/connect 127\.0\.0\.1:81: Connection refused/);
  });

  it("holds a scenario's declared ports (port-forward SCENARIO); a scenario port needs a fixed local port", async () => {
    const port = await freePort();
    const file = join(home, 'pf.yaml');
    writeFileSync(
      file,
      [
        'name: pf',
        'machines:',
        '  site:',
        `    ports: ["${port}:8000"]`,
        '    start:',
        '      - run: mkdir -p /w && echo scenario site > /w/index.html && httpd -p 8000 -h /w',
        '    ready:',
        '      - tcp: 8000',
        '',
      ].join('\n'),
    );
    const up = snaplab(['up', file]);
    expect(up.code, up.err).toBe(0);
    expect(up.out).toContain('snaplab port-forward pf');
    const pf = await running(['port-forward', 'pf'], /Forwarding from/);
    try {
      expect(pf.out()).toBe(`Forwarding from 127.0.0.1:${port} -> pf/site:8000\n`);
      expect(curl(port).stdout).toBe('scenario site\n');
    } finally {
      await pf.stop();
    }
    writeFileSync(join(home, 'bad.yaml'), ['machines:', '  m:', '    ports: [":80"]', ''].join('\n'));
    expect(snaplab(['up', join(home, 'bad.yaml')])).toMatchObject({
      code: 2,
      err: expect.stringMatching(/fixed local port[\s\S]*hint: write it as LOCAL:REMOTE/),
    });
  });
});
