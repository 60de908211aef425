/**
 * `snaplab serve` as clients use it: curl on the Unix socket and on 127.0.0.1 with keys, raw
 * WebSockets for a stream cut and reattached, deadlines that kill a process tree, TTLs, quotas,
 * the event stream resumed, and a daemon killed with SIGKILL mid-create and started again.
 */
import { ROUTE_SCOPES } from '../src/server/scopes.js';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import WebSocket from 'ws';
import Database from 'better-sqlite3';
import SwaggerParser from '@apidevtools/swagger-parser';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cli, removeHome, sleep, startDaemon, until, type TestDaemon } from './daemon-helpers.js';
import { SNAPLAB } from './cli-command.js';
import { DRIVER_NAMES } from '../src/drivers/registry.js';

let home: string;
let d: TestDaemon;
let admin: string;

/**
 * A parsed JSON answer of the daemon. Each test reads the fields it checks by name, and its
 * expect() fails when one is not there, so a declared shape per route would add nothing.
 */
// biome-ignore lint/suspicious/noExplicitAny: see above
type Json = any;

interface Res {
  status: number;
  body: Json;
  headers: string;
}

/** curl: over the Unix socket (no key), or TCP with `token`. */
function curl(
  method: string,
  path: string,
  opts: { token?: string; json?: unknown; tcp?: boolean; data?: string; timeoutS?: number; headers?: string[] } = {},
): Res {
  const args = ['-s', '-D', '-', '-X', method, '--max-time', String(opts.timeoutS ?? 60)];
  if (opts.tcp || opts.token) args.push(`${d.url}${path}`);
  else args.push('--unix-socket', d.socket, `http://snaplab${path}`);
  if (opts.token) args.push('-H', `authorization: Bearer ${opts.token}`);
  for (const h of opts.headers ?? []) args.push('-H', h);
  if (opts.json !== undefined)
    args.push('-H', 'content-type: application/json', '--data-binary', JSON.stringify(opts.json));
  if (opts.data !== undefined) args.push('--data-binary', '@-');
  const r = spawnSync('curl', args, { encoding: 'utf8', input: opts.data, maxBuffer: 64 << 20 });
  const [head, ...rest] = r.stdout.split('\r\n\r\n');
  const text = rest.join('\r\n\r\n');
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    /* text */
  }
  return { status: Number(/^HTTP\/1\.1 (\d+)/.exec(head ?? '')?.[1] ?? 0), body, headers: head ?? '' };
}

/**
 * A WebSocket to the daemon, resolved once open. Frames that came in the same read as the
 * upgrade's answer are emitted before the caller's `await` returns, so they are held and given to
 * the first 'message' listener when it is attached (the stream-reattach test lost its catch-up's
 * first chunk, or everything up to the exit, this way about once in a dozen runs).
 */
function socket(path: string): Promise<WebSocket> {
  const ws = new WebSocket(`ws+unix:${d.socket}:${path}`);
  const early: [Buffer, boolean][] = [];
  const hold = (m: Buffer, binary: boolean): void => void early.push([m, binary]);
  ws.on('message', hold);
  const on = ws.on.bind(ws) as (event: string, fn: (...args: unknown[]) => void) => WebSocket;
  let first = true;
  (ws as unknown as { on: typeof on }).on = (event, fn) => {
    on(event, fn);
    if (event === 'message' && first) {
      first = false;
      ws.off('message', hold);
      for (const [m, binary] of early.splice(0)) fn(m, binary);
    }
    return ws;
  };
  return new Promise((resolve, reject) => {
    ws.once('open', () => resolve(ws));
    ws.once('error', reject);
  });
}

beforeAll(async () => {
  home = mkdtempSync(join(tmpdir(), 'snaplab-test-daemon-'));
  admin = cli(home, ['key', 'create', 'admin', '--scope', 'read,exec,admin']).out.trim();
  d = await startDaemon(home, ['--default-timeout', '0']);
}, 120_000);

afterAll(async () => {
  await d?.stop();
  removeHome(home);
});

describe('snaplab serve', () => {
  it('keys: none, unknown, wrong scope, removed; the Unix socket needs none; the OpenAPI document validates', async () => {
    expect(curl('GET', '/healthz', { tcp: true })).toMatchObject({ status: 200, body: { ok: true } });
    expect(curl('GET', '/sandboxes', { tcp: true })).toMatchObject({ status: 401, body: { code: 'UNAUTHORIZED' } });
    expect(curl('GET', '/sandboxes', { token: 'snaplab_wrong' })).toMatchObject({
      status: 401,
      body: { code: 'UNAUTHORIZED' },
    });
    const reader = cli(home, ['key', 'create', 'reader', '--scope', 'read']).out.trim();
    expect(curl('GET', '/sandboxes', { token: reader }).status).toBe(200);
    expect(curl('POST', '/sandboxes', { token: reader, json: {} })).toMatchObject({
      status: 403,
      body: { code: 'FORBIDDEN', hint: expect.stringMatching(/--scope exec/) },
    });
    expect(cli(home, ['key', 'ls', '--json']).out).not.toContain(reader); // only a hash is kept
    expect(cli(home, ['key', 'rm', 'reader']).code).toBe(0);
    expect(curl('GET', '/sandboxes', { token: reader }).status).toBe(401);
    expect(curl('GET', '/sandboxes').status).toBe(200);
    expect(curl('POST', '/sandboxes', { json: { bogus: 1 } })).toMatchObject({
      status: 400,
      body: { code: 'BAD_INPUT' },
    });
    expect(curl('GET', '/sandboxes/nope')).toMatchObject({ status: 404, body: { code: 'SANDBOX_NOT_FOUND' } });
    // a path routing refuses answers in the same shape, with a hint, and without echoing it whole
    for (const [path, hint] of [
      [`/sandboxes/${'x'.repeat(300)}`, /at most 100 characters/],
      ['/sandboxes/%E0%A4%A', /percent-encode/],
    ] as const)
      expect(curl('GET', path)).toMatchObject({
        status: 400,
        body: { code: 'BAD_INPUT', message: expect.stringMatching(/^.{1,200}$/), hint: expect.stringMatching(hint) },
      });
    const doc = curl('GET', '/openapi.json').body;
    await expect(SwaggerParser.validate(structuredClone(doc))).resolves.toBeTruthy();
    expect(Object.keys(doc.paths)).toEqual(
      expect.arrayContaining([
        '/sandboxes',
        '/sandboxes/{id}/exec',
        '/sandboxes/{id}/files',
        '/events',
        '/pools/{name}/run',
      ]),
    );
    // a driver is one of the registry's, in the document and in every body that names one
    const body = (path: string) => doc.paths[path].post.requestBody.content['application/json'].schema.properties;
    for (const path of ['/sandboxes', '/pools', '/scenarios'])
      for (const n of DRIVER_NAMES) expect(JSON.stringify(body(path).driver)).toContain(`"${n}"`);
    expect(curl('POST', '/pools', { json: { name: 'p-bogus', size: 0, driver: 'firecracker' } })).toMatchObject({
      status: 400,
      body: { code: 'BAD_INPUT' },
    });
    // one daemon per home: a second is refused before it touches anything
    const second = spawnSync(SNAPLAB, ['serve', '--socket', join(home, 'second.sock')], {
      env: { ...process.env, SNAPLAB_HOME: home },
      encoding: 'utf8',
      timeout: 30_000,
    });
    expect([second.status, second.stderr]).toEqual([2, expect.stringMatching(/DAEMON_ERROR.*a daemon already runs/)]);
    // one line per request, written once the response has gone
    await until(
      'the request log',
      () =>
        /GET \/sandboxes 401 [\d.]+ms key=-/.test(d.log()) && /GET \/sandboxes 200 [\d.]+ms key=local/.test(d.log()),
    );
  });

  it('every route holds a request to the scope server/scopes.ts names for it: none is 401, one scope short is 403', () => {
    const seen: string[] = [];
    try {
      const reader = cli(home, ['key', 'create', 'scope-reader', '--scope', 'read']).out.trim();
      const runner = cli(home, ['key', 'create', 'scope-runner', '--scope', 'read,exec']).out.trim();
      for (const [route, scope] of Object.entries(ROUTE_SCOPES)) {
        const [method, path] = route.split(' ') as [string, string];
        if (path.startsWith('/cluster/')) continue; // a cluster gateway's
        const url = path.replace(':id', 'nope').replace(':pid', '1').replace(':name', 'nope');
        // refused before anything else is looked at (an unknown route would be 404)
        expect([route, curl(method, url, { tcp: true, timeoutS: 5 }).status]).toEqual([route, 401]);
        if (method === 'GET') {
          // (curl -I: -X HEAD waits for the body the length announces)
          const head = spawnSync('curl', [
            '-s',
            '-I',
            '-o',
            '/dev/null',
            '-w',
            '%{http_code}',
            '--max-time',
            '5',
            `${d.url}${url}`,
          ]);
          expect([route, `HEAD ${head.stdout}`]).toEqual([route, 'HEAD 401']);
        }
        const short = scope === 'exec' ? reader : scope === 'admin' ? runner : undefined;
        if (short) expect([route, curl(method, url, { token: short }).body?.code]).toEqual([route, 'FORBIDDEN']);
        seen.push(route);
      }
    } finally {
      cli(home, ['key', 'rm', 'scope-reader']);
      cli(home, ['key', 'rm', 'scope-runner']);
    }
    expect(seen.length).toBeGreaterThan(60);
  });

  it('an exec deadline kills the whole tree; a client that goes kills its exec', async () => {
    expect(curl('POST', '/sandboxes', { json: { name: 'tree' } }).status).toBe(201);
    const r = curl('POST', '/sandboxes/tree/exec', {
      json: { argv: ['sh', '-c', 'sleep 100 & sleep 100'], timeoutMs: 500 },
    });
    expect(r.body).toMatchObject({ exitCode: 124, timedOut: true });
    const left = (): string =>
      curl('POST', '/sandboxes/tree/exec', {
        json: { argv: ['sh', '-c', 'ps -o comm | grep -c sleep || true'] },
      }).body.stdout.trim();
    await until('the tree gone', () => left() === '0');
    // curl gives up after 1 s: the command it started must not outlive it
    expect(
      curl('POST', '/sandboxes/tree/exec', {
        json: { argv: ['sh', '-c', 'sleep 100 & sleep 100'], timeoutMs: 0 },
        timeoutS: 1,
      }).status,
    ).toBe(0);
    await until('the abandoned exec killed', () => left() === '0');
  });

  it('/rpc: calls answered by id in the order they end, bad calls refused, and a connection that goes kills its commands', async () => {
    curl('POST', '/sandboxes', { json: { name: 'rpc' } });
    const ws = await socket('/rpc');
    const answers: Json[] = [];
    ws.on('message', (m) => answers.push(JSON.parse(String(m))));
    ws.send(JSON.stringify({ id: 1, op: 'exec', sandbox: 'rpc', argv: ['sh', '-c', 'sleep 0.3; echo slow'] }));
    ws.send(
      JSON.stringify({
        id: 2,
        op: 'exec',
        sandbox: 'rpc',
        argv: ['cat'],
        stdin: Buffer.from('fast').toString('base64'),
      }),
    );
    ws.send(JSON.stringify({ id: 3, op: 'exec', sandbox: 'rpc' }));
    ws.send('not json');
    await until('four answers', () => answers.length === 4);
    expect(answers.map((a) => a.id)).toEqual([3, null, 2, 1]);
    expect(answers[0].error).toMatchObject({ code: 'BAD_INPUT', message: expect.stringMatching(/argv/) });
    expect(Buffer.from(answers[2].result.stdout, 'base64').toString()).toBe('fast');
    expect(Buffer.from(answers[3].result.stdout, 'base64').toString()).toBe('slow\n');
    ws.send(JSON.stringify({ id: 4, op: 'exec', sandbox: 'rpc', argv: ['sleep', '100'] }));
    const sleeping = (): string =>
      curl('POST', '/sandboxes/rpc/exec', {
        json: { argv: ['sh', '-c', 'ps -o comm | grep -c sleep || true'] },
      }).body.stdout.trim();
    await until('the sleep running', () => sleeping() === '1');
    ws.terminate();
    await until('the sleep killed with its connection', () => sleeping() === '0');
    curl('DELETE', '/sandboxes/rpc');
  });

  it('a stream cut mid-command is reattached from its offset with nothing lost; a ring overrun is a gap', async () => {
    const made = curl('POST', '/sandboxes', { json: { name: 'stream' } });
    expect(made.status, JSON.stringify(made.body)).toBe(201);
    const ws = await socket('/sandboxes/stream/exec');
    ws.send(
      JSON.stringify({
        type: 'start',
        argv: [
          'sh',
          '-c',
          'i=0; while [ $i -lt 300 ]; do i=$((i+1)); echo line$i; [ $i = 50 ] && sleep 1; done; echo err >&2',
        ],
      }),
    );
    let got = Buffer.alloc(0);
    let id = '';
    const texts: string[] = [];
    await new Promise<void>((resolve, reject) => {
      const t = setTimeout(
        () =>
          reject(
            new Error(
              `no line50 within 15 s: control frames ${JSON.stringify(texts)}, output so far ending ${JSON.stringify(got.toString().slice(-80))}`,
            ),
          ),
        15000,
      );
      ws.on('message', (m: Buffer, binary) => {
        if (!binary) {
          texts.push(String(m));
          const j = JSON.parse(String(m));
          if (j.type === 'started') id = j.process;
          return;
        }
        got = Buffer.concat([got, m.subarray(1)]);
        if (got.toString().includes('line50\n')) {
          clearTimeout(t);
          resolve();
        }
      });
      ws.on('close', (c) => texts.push(`close ${c}`));
    });
    ws.terminate(); // cut
    const offset = got.length;
    await sleep(1500);
    const again = await socket(`/sandboxes/stream/processes/${id}/attach?offset=${offset}`);
    let rest = Buffer.alloc(0);
    let stderr = '';
    const texts2: string[] = [];
    const exit = await new Promise<Json>((resolve, reject) => {
      const t = setTimeout(
        () =>
          reject(
            new Error(
              `no exit within 15 s of the reattach: control frames ${JSON.stringify(texts2)}, output ending ${JSON.stringify(rest.toString().slice(-80))}`,
            ),
          ),
        15000,
      );
      again.on('close', (c) => texts2.push(`close ${c}`));
      again.on('message', (m: Buffer, binary) => {
        if (!binary) texts2.push(String(m));
        if (binary)
          return m[0] === 1
            ? void (rest = Buffer.concat([rest, m.subarray(1)]))
            : void (stderr += m.subarray(1).toString());
        const j = JSON.parse(String(m));
        if (j.type === 'exit' || j.type === 'gap') {
          clearTimeout(t);
          resolve(j);
        }
      });
    });
    expect(exit.type).toBe('exit');
    expect(exit.result.exitCode).toBe(0);
    const all = Buffer.concat([got, rest]).toString();
    expect(all).toBe(Array.from({ length: 300 }, (_, i) => `line${i + 1}\n`).join(''));
    expect(stderr).toBe('err\n');

    // 3 MiB with nobody reading, a 1 MiB ring: attaching at 0 is told what was lost
    const bg = curl('POST', '/sandboxes/stream/processes', {
      json: { argv: ['sh', '-c', 'head -c 3145728 /dev/zero'], tag: 'big' },
    });
    expect(bg.status).toBe(201);
    await until('it exited', () => curl('GET', `/sandboxes/stream/processes/${bg.body.id}`).body.state === 'exited');
    const out = curl('GET', `/sandboxes/stream/processes/${bg.body.id}/output?offset=0`).body;
    // what is held is the last MiB (to a chunk), and the gap is exactly what is not
    const held = out.chunks.reduce((n: number, c: Json) => n + Buffer.from(c.data, 'base64').length, 0);
    expect(out.gap).toEqual({ from: 0, to: out.chunks[0].offset });
    expect(out.next).toBe(3 << 20);
    expect(out.gap.to + held).toBe(3 << 20);
    expect(held).toBeLessThanOrEqual(1 << 20);
    expect(held).toBeGreaterThan((1 << 20) - (256 << 10));
  });

  it('TTLs kill or pause; a timeout can be extended; events say why, and resume from Last-Event-ID', async () => {
    const start = Number(
      curl('GET', '/events?after=0', { timeoutS: 1 })
        .body.match?.(/id: (\d+)/g)
        ?.pop()
        ?.slice(4) ?? 0,
    );
    expect(curl('POST', '/sandboxes', { json: { name: 'ttl-kill', timeoutS: 1 } }).status).toBe(201);
    expect(curl('POST', '/sandboxes', { json: { name: 'ttl-pause', timeoutS: 1, onTimeout: 'pause' } }).status).toBe(
      201,
    );
    expect(curl('POST', '/sandboxes', { json: { name: 'ttl-long', timeoutS: 1 } }).status).toBe(201);
    expect(curl('POST', '/sandboxes/ttl-long/timeout', { json: { timeoutS: 600 } }).body.timeoutS).toBe(600);
    await until('ttl-kill gone', () => curl('GET', '/sandboxes/ttl-kill').status === 404);
    await until('ttl-pause paused', () => curl('GET', '/sandboxes/ttl-pause').body.state === 'paused');
    expect(curl('GET', '/sandboxes/ttl-long').body.state).toBe('running');
    // the log from before these, as a client that reconnects asks for it
    const sse = curl('GET', '/events', { headers: [`last-event-id: ${start}`], timeoutS: 1 }).body as string;
    const events = sse
      .split('\n\n')
      .filter((b) => b.startsWith('id: '))
      .map((b) => JSON.parse(b.split('\ndata: ')[1]!));
    expect(events.every((e) => e.id > start)).toBe(true);
    const of = (name: string): string[] => events.filter((e) => e.name === name).map((e) => e.type);
    expect(of('ttl-kill')).toEqual(['created', 'ready', 'timeout', 'destroyed']);
    expect(of('ttl-pause')).toEqual(['created', 'ready', 'timeout', 'paused']);
    expect(events.find((e) => e.name === 'ttl-kill' && e.type === 'destroyed').reason).toMatch(/timeout of 1 s ended/);
    curl('DELETE', '/sandboxes/ttl-pause');
    curl('DELETE', '/sandboxes/ttl-long');
  });

  it('a machine that dies is reported exited, with how; one removed by the CLI, destroyed; keys through the API', async () => {
    const after = Math.max(
      0,
      ...[...(curl('GET', '/events?after=0', { timeoutS: 1 }).body as string).matchAll(/^id: (\d+)$/gm)].map((m) =>
        Number(m[1]),
      ),
    );
    const box = curl('POST', '/sandboxes', { json: { name: 'dies' } }).body;
    expect(curl('POST', '/sandboxes', { json: { name: 'cli-removed' } }).status).toBe(201);
    // the list in pages: a full page names the next one (X-Next-Cursor), the last does not
    const names = (r: Res): string[] => (r.body as Json[]).map((b) => b.name);
    const all = names(curl('GET', '/sandboxes'));
    const page1 = curl('GET', '/sandboxes?limit=1');
    const cursor = /^x-next-cursor: (\S+)$/im.exec(page1.headers)?.[1];
    expect(cursor, page1.headers).toMatch(/^\d+\.[0-9a-f]+$/);
    const page2 = curl('GET', `/sandboxes?limit=10000&after=${cursor}`);
    expect([...names(page1), ...names(page2)]).toEqual(all);
    expect(page2.headers).not.toMatch(/x-next-cursor/i);
    expect(curl('GET', '/sandboxes?limit=0').status).toBe(400);
    process.kill(box.pid, 'SIGKILL');
    expect(cli(home, ['rm', 'cli-removed']).code).toBe(0);
    const events = async (): Promise<Json[]> =>
      (curl('GET', `/events?after=${after}`, { timeoutS: 1 }).body as string)
        .split('\n\n')
        .filter((b) => b.startsWith('id: '))
        .map((b) => JSON.parse(b.split('\ndata: ')[1]!));
    const exited = await until(
      'exited',
      async () => (await events()).find((e) => e.name === 'dies' && e.type === 'exited'),
      15_000,
    );
    expect(exited.reason).toMatch(/killed|signal|gone|exited/i);
    expect((await events()).find((e) => e.name === 'cli-removed' && e.type === 'destroyed')?.reason).toBe(
      'removed outside the daemon',
    );
    curl('DELETE', '/sandboxes/dies');

    const made = curl('POST', '/keys', { json: { name: 'via-api', scopes: ['read'] } });
    expect(made).toMatchObject({
      status: 201,
      body: { name: 'via-api', scopes: ['read'], token: expect.stringMatching(/^snaplab_/) },
    });
    expect(curl('GET', '/sandboxes', { token: made.body.token }).status).toBe(200);
    expect(curl('GET', '/keys').body.find((k: Json) => k.name === 'via-api')).not.toHaveProperty('hash');
    expect(curl('GET', '/keys', { token: made.body.token }).status).toBe(403);
    expect(curl('DELETE', '/keys/via-api').status).toBe(204);
    expect(curl('DELETE', '/keys/via-api')).toMatchObject({ status: 404, body: { code: 'KEY_NOT_FOUND' } });
  });

  it('quotas: a key over its sandboxes or its concurrent execs gets 429 with Retry-After and the limit', async () => {
    const k = cli(home, ['key', 'create', 'small', '--max-sandboxes', '1', '--max-execs', '1']).out.trim();
    expect(curl('POST', '/sandboxes', { token: k, json: { name: 'q1' } }).status).toBe(201);
    const over = curl('POST', '/sandboxes', { token: k, json: { name: 'q2' } });
    expect(over).toMatchObject({ status: 429, body: { code: 'QUOTA_EXCEEDED', limit: 'maxSandboxes' } });
    expect(over.headers).toMatch(/retry-after: \d+/i);
    expect(curl('GET', '/sandboxes/q2').status).toBe(404);
    const long = spawn('curl', [
      '-s',
      '-X',
      'POST',
      '-H',
      `authorization: Bearer ${k}`,
      '-H',
      'content-type: application/json',
      '--data-binary',
      JSON.stringify({ argv: ['sleep', '3'] }),
      `${d.url}/sandboxes/q1/exec`,
    ]);
    await until('the first exec running', () => curl('GET', '/metrics').body.includes('snaplab_execs_running 1'));
    expect(curl('POST', '/sandboxes/q1/exec', { token: k, json: { argv: ['true'] } })).toMatchObject({
      status: 429,
      body: { limit: 'maxExecs' },
    });
    await new Promise((r) => long.on('close', r));
    expect(curl('POST', '/sandboxes/q1/exec', { token: k, json: { argv: ['true'] } }).body.exitCode).toBe(0);
    expect(curl('DELETE', '/sandboxes/q1', { token: k }).status).toBe(204);
    expect(curl('POST', '/sandboxes', { token: k, json: { name: 'q3' } }).status).toBe(201);
    curl('DELETE', '/sandboxes/q3');
  });

  it('the CLI through the daemon (SNAPLAB_HOST, a key): create, exec with its exit code and stdin, ls, pause and resume twice, rm', () => {
    const env = { ...process.env, SNAPLAB_HOME: '/nonexistent', SNAPLAB_HOST: d.url, SNAPLAB_TOKEN: admin };
    const remoteCli = (args: string[], input?: string) => spawnSync(SNAPLAB, args, { env, input, encoding: 'utf8' });
    expect(remoteCli(['create', '--name', 'via-cli', '--label', 'by=cli']).stdout).toBe('via-cli\n');
    const e = remoteCli(['exec', '-i', 'via-cli', '--', 'sh', '-c', 'cat; echo err >&2; exit 3'], 'typed\n');
    expect([e.status, e.stdout, e.stderr]).toEqual([3, 'typed\n', 'err\n']);
    expect(JSON.parse(remoteCli(['ls', '--json', '--label', 'by=cli']).stdout).map((b: Json) => b.name)).toEqual([
      'via-cli',
    ]);
    for (let i = 0; i < 2; i++) {
      expect(remoteCli(['pause', 'via-cli']).status).toBe(0);
      expect(remoteCli(['exec', 'via-cli', '--', 'true']).stderr).toMatch(/SANDBOX_PAUSED/);
      expect(remoteCli(['resume', 'via-cli']).status).toBe(0);
      expect(remoteCli(['exec', 'via-cli', '--', 'echo', 'back']).stdout).toBe('back\n');
    }
    expect(remoteCli(['df']).stderr).toMatch(/runs on the embedded lab/);
    expect(remoteCli(['rm', 'via-cli']).status).toBe(0);
    // a smaller user namespace range: --ids goes in the create body (docs/architecture.md "Ranges")
    const small = remoteCli(['create', '--name', 'via-cli-ids', '--ids', '2048', '--json']);
    expect(JSON.parse(small.stdout).userns, small.stderr).toMatchObject({ size: 2048 });
    expect(remoteCli(['create', '--ids', '3000']).stderr).toMatch(/BAD_INPUT|power of two/);
    expect(remoteCli(['rm', 'via-cli-ids']).status).toBe(0);
    expect(remoteCli(['exec', 'via-cli', '--', 'true'])).toMatchObject({
      status: 125,
      stderr: expect.stringMatching(/SANDBOX_NOT_FOUND/),
    });
    const noKey = spawnSync(SNAPLAB, ['ls'], { env: { ...env, SNAPLAB_TOKEN: '' }, encoding: 'utf8' });
    expect(noKey.stderr).toMatch(/UNAUTHORIZED/);
  });

  it('ls through the daemon pages (--limit, --after) and counts (--count): the Node CLI on the daemon, whose cursor it prints', () => {
    const env = { ...process.env, SNAPLAB_HOME: '/nonexistent', SNAPLAB_HOST: d.url, SNAPLAB_TOKEN: admin };
    const remoteCli = (args: string[]) => spawnSync(SNAPLAB, args, { env, encoding: 'utf8' });
    expect(remoteCli(['create', '--name', 'via-cli-page', '--label', 'by=page']).stdout).toBe('via-cli-page\n');
    // the native command leaves these flags to the Node CLI, which asks the daemon for the page
    const page = JSON.parse(remoteCli(['ls', '--json', '--limit', '1', '--label', 'by=page']).stdout);
    expect(page).toEqual({
      sandboxes: [expect.objectContaining({ name: 'via-cli-page' })],
      nextCursor: expect.any(String),
    });
    expect(
      JSON.parse(remoteCli(['ls', '--json', '--limit', '1', '--label', 'by=page', '--after', page.nextCursor]).stdout),
    ).toEqual({ sandboxes: [], nextCursor: null });
    expect(remoteCli(['ls', '--count', '--label', 'by=page']).stdout).toBe('1 sandbox: 1 running\n');
    expect(remoteCli(['rm', 'via-cli-page']).status).toBe(0);
  });

  it('create, ls and rm through the daemon: the same output, codes and errors from the command itself (no Node) and from the Node CLI', async () => {
    // a server that reads the request and hangs up: the request was out, so it is reported, not sent again
    const hangUp = createServer((s) => s.once('data', () => s.destroy()));
    await new Promise<void>((r) => hangUp.listen(0, '127.0.0.1', r));
    const cut = `http://127.0.0.1:${(hangUp.address() as AddressInfo).port}`;
    const snaplab = (args: string[], env: NodeJS.ProcessEnv) =>
      new Promise<{ code: number | null; out: string; err: string }>((resolve) => {
        const c = spawn(SNAPLAB, args, {
          env: { ...process.env, SNAPLAB_HOME: '/nonexistent', SNAPLAB_HOST: d.url, SNAPLAB_TOKEN: admin, ...env },
          stdio: ['ignore', 'pipe', 'pipe'],
        });
        let out = '';
        let err = '';
        c.stdout.on('data', (b: Buffer) => (out += b.toString()));
        c.stderr.on('data', (b: Buffer) => (err += b.toString()));
        c.once('exit', (code) => resolve({ code, out, err }));
      });
    // what differs from one create to the next (ids, times, ranges, the path's own names) made alike
    const same = (r: { code: number | null; out: string; err: string }, p: string) => ({
      code: r.code,
      out: r.out
        .replaceAll(p, 'P')
        .replace(/^[0-9a-f]{12} /gm, 'ID ')
        .replace(/(?<= )\d{1,2}s(?= )/g, (a) => 'S'.repeat(a.length)) // ls's AGE
        .replace(/"(id|createdAt|expiresAt|pid|uidBase)": ("[^"]*"|\d+)/g, '"$1": "X"'),
      err: r.err.replaceAll(p, 'P').replace(/op-[0-9a-f]+/g, 'OP'),
    });
    const seen: unknown[] = [];
    for (const [p, env] of [
      ['fast', {}],
      ['node', { SNAPLAB_NO_FAST: '1' }],
    ] as const) {
      const x = async (args: string[], extra: NodeJS.ProcessEnv = {}) =>
        same(await snaplab(args, { ...env, ...extra }), p);
      seen.push([
        await x(['create', '--name', `${p}-a`, '--label', `by=${p}`]),
        await x(['create', `--name=${p}-a`]), // taken
        await x([
          'create',
          '--name',
          `${p}-j`,
          '--json',
          '--label',
          'q="x\\y é😀\t',
          '--label',
          'a=b',
          '--label=c=d',
          '--timeout',
          '007',
          '--on-timeout',
          'pause',
        ]),
        await x(['create', '--image', 'nope', '--json']),
        await x(['--host', `unix:${d.socket}`, 'create', '--name', `${p}-u`], { SNAPLAB_TOKEN: '' }),
        await x(['create', '--name', `${p}-k`], { SNAPLAB_TOKEN: 'not-a-key' }),
        await x(['create', '--name', `${p}-h`], { SNAPLAB_HOST: cut }),
        await x(['rm', `${p}-a`, `${p}-j`, '--json']),
        await x(['rm', `${p}-u`, 'ghost', `${p}-a`]),
        await x(['rm', '--json', 'ghost']),
        await x(['create'], { SNAPLAB_HOST: 'http://127.0.0.1:1' }),
        await x(['create', '--name', `${p}-l`, '--label', `by=${p}`, '--label', 'v=a b&é+%']),
        await x(['ls', '--label', `by=${p}`]),
        await x(['ls', '--json', '--label', 'v=a b&é+%']),
        await x(['ls', '--label', 'bad']),
        await x(['rm', `${p}-l`]),
        // found in review: a long --timeout overran a buffer, a long path another; an empty --pool is none
        await x(['create', '--name', `${p}-t`, '--timeout', '3600', '--pool=', '--json']),
        await x(['rm', 'a'.repeat(1100)]),
        await x(['ls', '--label', `a=${'/'.repeat(9000)}`]), // fastify's own 431, not a snaplab error
        await x(['ls'], { SNAPLAB_HOST: 'http://127.0.0.1:99999' }),
        await x(['rm', `${p}-t`]),
        // a key given twice is refused (the fast path hands it to Node): it was the last one kept
        await x(['create', '--name', `${p}-d`, '--label', 'k=1', '--label=k=2']),
      ]);
    }
    hangUp.close();
    expect(seen[0]).toEqual(seen[1]);
    const [fast] = seen as { code: number; out: string; err: string }[][];
    expect(fast!.map((r) => r.code)).toEqual([0, 2, 0, 2, 0, 2, 2, 0, 2, 2, 2, 0, 0, 0, 2, 0, 0, 2, 2, 2, 0, 2]);
    expect(fast![21]!.err).toMatch(/^error\[BAD_INPUT\]: label "k" given twice\nhint: give each key once\n/);
    expect(JSON.parse(fast![16]!.out)).toMatchObject({ name: 'P-t', image: 'busybox', timeoutS: 3600 });
    expect(fast![18]!.err).toMatch(/^error\[DAEMON_ERROR\]: the daemon answered 431: /);
    expect(fast![19]!.err).toMatch(/^error\[BAD_INPUT\]: invalid daemon URL/);
    expect(fast![0]!.out).toBe('P-a\n');
    expect(fast![1]!.err).toMatch(/^error\[SANDBOX_EXISTS\]: .*\nhint: .*\ntrace: snaplab trace OP\n$/);
    const made = JSON.parse(fast![2]!.out);
    expect(made).toMatchObject({
      name: 'P-j',
      labels: { q: 'q="x\\y é😀\t'.slice(2), a: 'b', c: 'd' },
      timeoutS: 7,
      onTimeout: 'pause',
      state: 'running',
    });
    expect(fast![2]!.out).toMatch(/^\{\n {2}"id": "X",\n {2}"name": "P-j",\n/); // JSON.stringify(..., null, 2)
    expect(JSON.parse(fast![3]!.err).error).toMatchObject({ code: 'IMAGE_NOT_FOUND', operation: 'OP' });
    expect(fast![5]!.err).toMatch(/^error\[UNAUTHORIZED\]/);
    expect(fast![6]!.err).toBe(
      `error[DAEMON_UNREACHABLE]: cannot reach the daemon at ${cut}: socket hang up\nhint: is \`snaplab serve\` running there? (SNAPLAB_HOST says where)\n`,
    );
    expect(JSON.parse(fast![7]!.out)).toEqual({ removed: ['P-a', 'P-j'] });
    expect(fast![8]!.err).toMatch(/^error\[SANDBOX_NOT_FOUND\]: no sandbox with id or name "ghost"/);
    expect(fast![12]!.out).toMatch(
      /^ID {12}NAME {4}STATE {4}IMAGE {4}STORAGE {2}DRIVER {6}AGE {2}EXPIRES {2}NOTE\nID {2}P-l {2}running {2}busybox {2}\w+ +namespaces {2}SS {3}- {8}\n$/,
    );
    expect(JSON.parse(fast![13]!.out).map((b: { name: string; labels: object }) => [b.name, b.labels])).toEqual([
      ['P-l', { by: 'P', v: 'a b&é+%' }],
    ]);
    expect(fast![10]!.err).toMatch(
      /^error\[DAEMON_UNREACHABLE\]: cannot reach the daemon at http:\/\/127.0.0.1:1: connect ECONNREFUSED 127.0.0.1:1\n/,
    );
    // the fast path started no Node: with none on PATH it still answers; what it does not take goes to Node
    const noNode = { PATH: '/nonexistent' };
    expect(await snaplab(['create', '--name', 'no-node'], noNode)).toMatchObject({ code: 0, out: 'no-node\n' });
    expect(await snaplab(['ls', '--json'], noNode)).toMatchObject({
      code: 0,
      out: expect.stringContaining('"name": "no-node"'),
    });
    // exec: directly into a sandbox of this home when SNAPLAB_HOST is this home's socket; through the daemon (Node) else
    const local = { ...noNode, SNAPLAB_HOST: `unix:${d.socket}` };
    expect(await snaplab(['exec', 'no-node', '--', 'echo', 'direct'], { ...local, SNAPLAB_HOME: home })).toMatchObject({
      code: 0,
      out: 'direct\n',
    });
    expect(await snaplab(['exec', 'no-node', '--', 'echo', 'direct'], local)).toMatchObject({
      code: 125,
      err: expect.stringMatching(/cannot start node/),
    });
    expect(await snaplab(['rm', 'no-node'], noNode)).toMatchObject({ code: 0, out: 'removed no-node\n' });
    expect(await snaplab(['create', '--memory', '64M'], noNode)).toMatchObject({
      code: 125,
      err: expect.stringMatching(/cannot start node/),
    });
    expect(await snaplab(['rm', '--all'], noNode)).toMatchObject({
      code: 125,
      err: expect.stringMatching(/cannot start node/),
    });
    expect(curl('GET', '/sandboxes').body.filter((b: { name: string }) => /^(fast|node|no-node)/.test(b.name))).toEqual(
      [],
    );
  });

  it('keys see their own sandboxes only, need admin for no user namespace, and a removed key closes its open sockets', async () => {
    const a = cli(home, ['key', 'create', 'tenant-a']).out.trim();
    const b = cli(home, ['key', 'create', 'tenant-b']).out.trim();
    expect(curl('POST', '/sandboxes', { token: a, json: { name: 'of-a' } }).status).toBe(201);
    expect(curl('GET', '/sandboxes/of-a', { token: b }).status).toBe(404);
    expect(curl('POST', '/sandboxes/of-a/exec', { token: b, json: { argv: ['true'] } }).status).toBe(404);
    expect(curl('DELETE', '/sandboxes/of-a', { token: b }).status).toBe(404);
    expect(curl('GET', '/sandboxes', { token: b }).body).toEqual([]);
    expect(curl('GET', '/sandboxes', { token: a }).body.map((x: Json) => x.name)).toEqual(['of-a']);
    // and their counts: a key's own, and nothing of another's when it asks for that owner
    expect(curl('GET', '/counts/sandboxes', { token: b }).body).toEqual({ total: 0, byState: {} });
    expect(curl('GET', '/counts/sandboxes', { token: a }).body).toEqual({ total: 1, byState: { running: 1 } });
    expect(curl('GET', '/counts/sandboxes?owner=tenant-a', { token: b }).body).toEqual({ total: 0, byState: {} });
    expect(curl('GET', '/counts/sandboxes?state=bogus', { token: a })).toMatchObject({
      status: 400,
      body: { code: 'BAD_INPUT' },
    });
    // a not-found error names no sandbox: of-a is not b's to know of (the hint says how to list)
    const missing = curl('GET', '/sandboxes/nope', { token: b });
    expect(missing).toMatchObject({ status: 404, body: { code: 'SANDBOX_NOT_FOUND' } });
    expect(JSON.stringify(missing.body)).not.toMatch(/of-a/);
    expect(curl('GET', '/sandboxes/nope', { token: a }).body.hint).toBe('list them with GET /sandboxes');
    expect(curl('POST', '/sandboxes', { token: a, json: { userns: false } })).toMatchObject({
      status: 403,
      body: { code: 'FORBIDDEN' },
    });
    expect(cli(home, ['key', 'create', 'local']).err).toMatch(/BAD_NAME/);
    // a key's event stream tells of its own sandboxes, their end included, and of no one else's
    expect(curl('POST', '/sandboxes', { token: a, json: { name: 'of-a-2' } }).status).toBe(201);
    expect(curl('POST', '/sandboxes', { token: b, json: { name: 'of-b' } }).status).toBe(201);
    expect(curl('DELETE', '/sandboxes/of-a-2', { token: a }).status).toBe(204);
    const seen = (curl('GET', '/events?after=0', { token: a, timeoutS: 1 }).body as string)
      .split('\n\n')
      .filter((x) => x.startsWith('id: '))
      .map((x) => JSON.parse(x.split('\ndata: ')[1]!));
    expect(seen.filter((e) => e.name === 'of-a-2').map((e) => e.type)).toEqual(['created', 'ready', 'destroyed']);
    expect(seen.some((e) => e.name === 'of-b' || (e.name !== 'of-a' && e.name !== 'of-a-2'))).toBe(false);
    // usage: a key's own machines; with ids (the dashboard's page), those only, never another key's
    const [ofA, ofB] = ['of-a', 'of-b'].map((n) => curl('GET', `/sandboxes/${n}`).body.id as string);
    const usage = (token: string, q = ''): string[] =>
      (curl('GET', `/usage${q}`, { token }).body as Json[]).map((u) => `${u.id}:${typeof u.memoryBytes}`);
    expect(usage(a)).toEqual([`${ofA}:number`]);
    expect(usage(b, `?id=${ofA},${ofB},nope`)).toEqual([`${ofB}:number`]);
    expect(usage(a, `?id=${ofB}&id=${ofA}`)).toEqual([`${ofA}:number`]);
    expect(usage(a, '?id=')).toEqual([]);
    expect(curl('GET', `/usage?id=${Array(1001).fill(ofA).join(',')}`, { token: a })).toMatchObject({
      status: 400,
      body: { code: 'BAD_INPUT', hint: /at most 1000/ },
    });
    curl('DELETE', '/sandboxes/of-b');

    const ws = new WebSocket(`${d.url.replace('http', 'ws')}/rpc`, { headers: { authorization: `Bearer ${a}` } });
    await new Promise((r) => ws.once('open', r));
    // a frame that is JSON but no object is bad input, not a bug of the daemon's
    const answer = new Promise<Json>((r) => ws.once('message', (m) => r(JSON.parse(String(m)))));
    ws.send('null');
    expect(await answer).toMatchObject({ id: null, error: { code: 'BAD_INPUT' } });
    const closed = new Promise((r) => ws.once('close', r));
    expect(cli(home, ['key', 'rm', 'tenant-a']).code).toBe(0);
    await closed; // within a reconcile tick (5 s)
    expect(curl('GET', '/sandboxes', { token: a }).status).toBe(401);
    curl('DELETE', '/sandboxes/of-a');
    cli(home, ['key', 'rm', 'tenant-b']);
  });

  it('an upload cut short leaves the file as it was; a slow reader of a stream is held, not given gaps', async () => {
    curl('POST', '/sandboxes', { json: { name: 'files' } });
    const put = curl('PUT', '/sandboxes/files/files?path=/data/f', {
      data: 'old content\n',
      headers: ['content-type: application/octet-stream'],
    });
    expect(put.body).toEqual({ bytes: 12 });
    // a client that says 1 MB and goes after 1000 bytes
    const { connect } = await import('node:net');
    const sock = connect(d.socket);
    await new Promise((r) => sock.once('connect', r));
    sock.write(
      'PUT /sandboxes/files/files?path=/data/f HTTP/1.1\r\nhost: x\r\ncontent-type: application/octet-stream\r\ncontent-length: 1000000\r\n\r\n',
    );
    sock.write(Buffer.alloc(1000, 120));
    await sleep(300);
    sock.destroy();
    // and one that sends chunks with no length, then goes
    const chunked = connect(d.socket);
    await new Promise((r) => chunked.once('connect', r));
    chunked.write(
      'PUT /sandboxes/files/files?path=/data/f HTTP/1.1\r\nhost: x\r\ncontent-type: application/octet-stream\r\ntransfer-encoding: chunked\r\n\r\n3e8\r\n',
    );
    chunked.write(Buffer.alloc(1000, 121));
    chunked.write('\r\n');
    await sleep(300);
    chunked.destroy();
    await until(
      'the writer gone',
      () =>
        curl('POST', '/sandboxes/files/exec', {
          json: { argv: ['sh', '-c', 'ps -o args | grep -c "[f]ile write" || true'] },
        }).body.stdout.trim() === '0',
    );
    expect(curl('GET', '/sandboxes/files/files?path=/data/f').body).toBe('old content\n');
    expect(curl('GET', '/sandboxes/files/files/list?path=/data').body.map((e: Json) => e.name)).toEqual(['f']);
    expect(curl('PUT', '/sandboxes/files/files?path=/data/g', { json: { not: 'bytes' } })).toMatchObject({
      status: 415,
      body: { code: 'UNSUPPORTED_MEDIA' },
    });

    // 32 MiB to a reader that stops reading at its first bytes for 1.5 s: all of it, and no gap
    const ws = await socket('/sandboxes/files/exec');
    ws.send(JSON.stringify({ type: 'start', argv: ['head', '-c', String(32 << 20), '/dev/zero'] }));
    let bytes = 0;
    let gaps = 0;
    let paused = false;
    const exit = new Promise<Json>((resolve) =>
      ws.on('message', (m: Buffer, binary) => {
        if (binary) {
          bytes += m.length - 1;
          if (!paused) {
            paused = true;
            ws.pause();
            setTimeout(() => ws.resume(), 1500);
          }
          return;
        }
        const j = JSON.parse(String(m));
        if (j.type === 'gap') gaps++;
        if (j.type === 'exit') resolve(j);
      }),
    );
    expect((await exit).result.exitCode).toBe(0);
    expect([bytes, gaps]).toEqual([32 << 20, 0]);
    curl('DELETE', '/sandboxes/files');
  });

  it('the rest as a client uses it: a terminal over the stream, process signals and stdin, tar in and out, images, pools, scenarios, traces', async () => {
    curl('POST', '/sandboxes', { json: { name: 'rest' } });
    // a terminal: the command sees a tty of the size asked, and a resize
    const ws = await socket('/sandboxes/rest/exec');
    ws.send(
      JSON.stringify({
        type: 'start',
        argv: ['sh', '-c', 'tty; stty size; read x; stty size'],
        tty: { cols: 100, rows: 30 },
        stdin: true,
      }),
    );
    let out = '';
    const done = new Promise<Json>((resolve) =>
      ws.on('message', (m: Buffer, binary) => {
        if (binary) out += m.subarray(1).toString();
        else if (JSON.parse(String(m)).type === 'exit') resolve(JSON.parse(String(m)));
      }),
    );
    await until('the first size', () => out.includes('30 100'));
    ws.send(JSON.stringify({ type: 'resize', cols: 120, rows: 40 }));
    await sleep(100);
    ws.send(Buffer.from('\n'));
    expect((await done).result.exitCode).toBe(0);
    expect(out).toMatch(/^\/dev\/pts\/\d+\r?\n30 100\r?\n[\s\S]*40 120/);

    // a background process fed through POST stdin, then signalled
    const p = curl('POST', '/sandboxes/rest/processes', {
      json: { argv: ['sh', '-c', 'read line; echo "got $line"; sleep 100'], tag: 'svc', stdin: true },
    }).body;
    expect(p).toMatchObject({ tag: 'svc', state: 'running' });
    curl('POST', `/sandboxes/rest/processes/${p.id}/stdin`, {
      data: 'hello\n',
      headers: ['content-type: application/octet-stream'],
    });
    const got = curl('GET', `/sandboxes/rest/processes/${p.id}/output?offset=0&wait=5`).body;
    expect(Buffer.from(got.chunks[0].data, 'base64').toString()).toBe('got hello\n');
    expect(curl('POST', `/sandboxes/rest/processes/${p.id}/signal`, { json: { signal: 'TERM' } }).status).toBe(200);
    await until('it ended on TERM', () => curl('GET', `/sandboxes/rest/processes/${p.id}`).body.result?.signal === 15);
    expect(curl('GET', '/sandboxes/rest/processes').body.map((x: Json) => x.tag)).toContain('svc');

    // a tree in as tar and out again
    const work = mkdtempSync(join(tmpdir(), 'snaplab-test-daemon-tar-'));
    spawnSync('sh', ['-c', `mkdir -p ${work}/t/sub && echo a > ${work}/t/sub/a && tar -C ${work} -cf ${work}/t.tar t`]);
    expect(curl('POST', '/sandboxes/rest/files/mkdir', { json: { path: '/srv' } }).status).toBe(204);
    const up = spawnSync(
      'curl',
      [
        '-s',
        '--unix-socket',
        d.socket,
        '-X',
        'PUT',
        '-H',
        'content-type: application/x-tar',
        '--data-binary',
        `@${work}/t.tar`,
        'http://x/sandboxes/rest/archive?path=/srv',
      ],
      { encoding: 'utf8' },
    );
    expect(JSON.parse(up.stdout)).toMatchObject({ complete: true });
    const down = spawnSync(
      'sh',
      ['-c', `curl -s --unix-socket ${d.socket} 'http://x/sandboxes/rest/archive?path=/srv/t' | tar -tf -`],
      { encoding: 'utf8' },
    );
    expect(down.stdout.split('\n').filter(Boolean).sort()).toEqual(['t/', 't/sub/', 't/sub/a']);
    rmSync(work, { recursive: true, force: true });

    // images: an import is an operation that a client waits on
    const tarball = join(home, 'rootfs.tar');
    spawnSync('sh', ['-c', `curl -s --unix-socket ${d.socket} 'http://x/sandboxes/rest/archive?path=/.' > ${tarball}`]);
    const op = curl('POST', '/images/import', { json: { source: tarball, name: 'copied' } });
    expect(op.status).toBe(202);
    const ended = curl('GET', `/operations/${op.body.id}?wait=60`).body;
    expect(ended).toMatchObject({ state: 'done', kind: 'image import' });
    expect(curl('GET', '/images').body.map((i: Json) => i.name)).toContain('copied');
    expect(curl('GET', '/operations/nope')).toMatchObject({ status: 404, body: { code: 'OPERATION_NOT_FOUND' } });

    // pools: define, resize, run, remove
    const pool = curl('POST', '/pools', { json: { name: 'pp', size: 1 } });
    expect(curl('GET', `/operations/${pool.body.id}?wait=60`).body.state).toBe('done');
    expect(
      curl('GET', `/operations/${curl('PATCH', '/pools/pp', { json: { size: 2 } }).body.id}?wait=60`).body.result,
    ).toMatchObject({ target: 2, ready: 2 });
    expect(curl('POST', '/pools/pp/run', { json: { argv: ['echo', 'pooled'] } }).body).toMatchObject({
      exitCode: 0,
      stdout: 'pooled\n',
      hit: true,
    });
    // a run whose client goes before its answer is killed, its standby not held for ever
    expect(curl('POST', '/pools/pp/run', { json: { argv: ['sleep', '1000'], timeoutMs: 0 }, timeoutS: 1 }).status).toBe(
      0,
    );
    await until('the abandoned run killed', () => curl('GET', '/pools/pp').body.inUse === 0);
    expect(curl('DELETE', '/pools/pp').body.removed).toBeGreaterThanOrEqual(2);

    // a scenario: up (an operation), status, snapshot, net, reset, down
    const file = join(import.meta.dirname, '..', 'examples', 'scenarios', 'tiny-service', 'scenario.yaml');
    const sup = curl('POST', '/scenarios', { json: { file, name: 'apilab' } });
    expect(curl('GET', `/operations/${sup.body.id}?wait=120`, { timeoutS: 130 }).body).toMatchObject({ state: 'done' });
    expect(curl('GET', '/scenarios/apilab').body.machines.map((m: Json) => m.state)).toEqual([
      'running',
      'running',
      'running',
      'running',
    ]);
    expect(curl('POST', '/scenarios/apilab/snapshot', { json: { name: 'base' } }).status).toBe(200);
    expect(
      curl('POST', '/scenarios/apilab/net', { json: { action: 'block', machines: ['client', 'proxy'] } }).status,
    ).toBe(204);
    expect(curl('POST', '/scenarios/apilab/net', { json: { action: 'heal' } }).status).toBe(204);
    expect(curl('POST', '/scenarios/apilab/reset', { json: { to: 'base' } }).status).toBe(200);
    expect(curl('POST', '/sandboxes/apilab%2Fclient/exec', { json: { argv: ['hostname'] } }).body.stdout).toBe(
      'client\n',
    );
    expect(curl('DELETE', '/scenarios/apilab').status).toBe(200);

    // traces of what was done
    const traces = curl('GET', '/traces?limit=200').body;
    expect(traces.map((t: Json) => t.kind)).toEqual(expect.arrayContaining(['create', 'image import', 'up', 'reset']));
    expect(curl('GET', `/traces/${traces[0].id}`).body.phases).toBeInstanceOf(Array);
    curl('DELETE', '/sandboxes/rest');
    curl('DELETE', '/images/copied?force=true');
  }, 300_000);

  it('metrics: sandboxes by state, exec histograms, phases', () => {
    const listed = curl('GET', '/sandboxes', { token: admin }).body as Json[];
    const m = curl('GET', '/metrics', { token: admin }).body as string;
    // as many as the list has in each state (counted in the store), states none is in at 0
    for (const state of ['creating', 'running', 'paused', 'dead', 'removing'])
      expect(m).toContain(`snaplab_sandboxes{state="${state}"} ${listed.filter((b) => b.state === state).length}\n`);
    expect(m).toMatch(/^snaplab_exec_duration_seconds_count\{kind="oneshot"\} \d+$/m);
    expect(m).toMatch(/^snaplab_phase_duration_seconds_count\{operation="create",phase="total"\} \d+$/m);
  });

  it('kill -9 mid-create, then a restart: every sandbox exists and works, or is gone; nothing leaks; the rest is adopted', async () => {
    expect(curl('POST', '/sandboxes', { json: { name: 'survivor', timeoutS: 3600 } }).status).toBe(201);
    const expires = curl('GET', '/sandboxes/survivor').body.expiresAt;
    // a background process outlives the daemon (the machine's agent keeps it); one asked not to does not
    const svc = curl('POST', '/sandboxes/survivor/processes', {
      json: { argv: ['sh', '-c', 'echo up; read x; echo "got $x"'], tag: 'svc', stdin: true },
    }).body;
    const brief = curl('POST', '/sandboxes/survivor/processes', { json: { argv: ['sleep', '600'], keep: false } }).body;
    // a long command is kept all the same: its argv, if the machine cannot hold it, as its first word
    const long = curl('POST', '/sandboxes/survivor/processes', {
      json: { argv: ['sh', '-c', `sleep 600 # ${'x'.repeat(5000)}`] },
    }).body;
    expect([svc.kept, brief.kept, long.kept]).toEqual([true, false, true]);
    // a tag too long to keep once written down: refused when keep was asked for, else run unkept
    const wordy = { argv: ['true'], tag: '\u0001'.repeat(700) };
    const refused = curl('POST', '/sandboxes/survivor/processes', { json: { ...wordy, keep: true } });
    expect(refused).toMatchObject({
      status: 400,
      body: { code: 'BAD_INPUT', message: expect.stringMatching(/too long/) },
    });
    expect(curl('POST', '/sandboxes/survivor/processes', { json: wordy }).body.kept).toBe(false);
    // a key's kept commands hold its exec quota in the daemons after (each restart once gave it the whole quota again)
    const capped = cli(home, ['key', 'create', 'capped', '--scope', 'read,exec', '--max-execs', '2']).out.trim();
    const mine = curl('POST', '/sandboxes', { token: capped, json: {} }).body;
    for (let i = 0; i < 2; i++)
      expect(
        curl('POST', `/sandboxes/${mine.id}/processes`, { token: capped, json: { argv: ['sleep', '600'] } }).status,
      ).toBe(201);
    for (const delay of [5, 40, 90]) {
      const c = spawn('curl', [
        '-s',
        '--unix-socket',
        d.socket,
        '-X',
        'POST',
        '-H',
        'content-type: application/json',
        '--data-binary',
        JSON.stringify({ name: `k${delay}` }),
        'http://snaplab/sandboxes',
      ]);
      await sleep(delay);
      await d.kill9();
      c.kill();
      d = await startDaemon(home, ['--default-timeout', '0']);
      const got = curl('GET', `/sandboxes/k${delay}`);
      if (got.status === 200) {
        expect(got.body.state).toBe('running');
        expect(curl('POST', `/sandboxes/k${delay}/exec`, { json: { argv: ['echo', 'ok'] } }).body.stdout).toBe('ok\n');
        curl('DELETE', `/sandboxes/k${delay}`);
      } else {
        expect(got.status).toBe(404);
      }
    }
    // killed while the store says `creating`: after the restart it is gone, reported failed, and cleaned
    const db = new Database(join(home, 'state.db'), { readonly: true, fileMustExist: true });
    const c = spawn('curl', [
      '-s',
      '--unix-socket',
      d.socket,
      '-X',
      'POST',
      '-H',
      'content-type: application/json',
      '--data-binary',
      JSON.stringify({ name: 'midway' }),
      'http://snaplab/sandboxes',
    ]);
    const creating = db.prepare("SELECT 1 FROM sandboxes WHERE name = 'midway' AND state = 'creating'");
    await new Promise((r) => c.once('spawn', r));
    for (const end = Date.now() + 10_000; !creating.get(); )
      if (Date.now() > end) throw new Error('midway never seen creating'); // a busy poll: the state lasts ~100 ms
    await d.kill9();
    c.kill();
    db.close();
    d = await startDaemon(home, ['--default-timeout', '0']);
    expect(curl('GET', '/sandboxes/midway').status).toBe(404);
    const failed = (curl('GET', '/events?after=0', { timeoutS: 1 }).body as string)
      .split('\n\n')
      .filter((b) => b.includes('"name":"midway"'));
    expect(failed.at(-1)).toMatch(/event: failed[\s\S]*creation was interrupted/);
    // nothing half-made is left for gc to find
    const gc = JSON.parse(cli(home, ['gc', '--json']).out);
    expect(gc.removed).toEqual([]);
    const s = curl('GET', '/sandboxes/survivor').body;
    expect([s.state, s.expiresAt]).toEqual(['running', expires]);
    // four daemons later: the same id and tag, its output from its finding on, its stdin and end
    const procs = curl('GET', '/sandboxes/survivor/processes').body as Json[];
    expect(procs.map((p) => [p.id, p.tag, p.state, p.kept, p.found, p.pid, p.argv.length])).toEqual([
      [svc.id, 'svc', 'running', true, true, svc.pid, 3],
      [long.id, null, 'running', true, true, long.pid, 1],
    ]);
    expect(curl('DELETE', `/sandboxes/survivor/processes/${long.id}`).status).toBeLessThan(300);
    // an offset past the end is refused, not waited on for ever
    const past = curl('GET', `/sandboxes/survivor/processes/${svc.id}/output?offset=100`);
    expect(past).toMatchObject({
      status: 400,
      body: { code: 'BAD_INPUT', message: expect.stringMatching(/past the end/) },
    });
    expect(curl('GET', `/sandboxes/survivor/processes/${brief.id}`).status).toBe(404);
    curl('POST', `/sandboxes/survivor/processes/${svc.id}/stdin`, {
      data: 'again\n',
      headers: ['content-type: application/octet-stream'],
    });
    await until(
      'the kept one read its input',
      () => curl('GET', `/sandboxes/survivor/processes/${svc.id}`).body.state === 'exited',
    );
    const out = curl('GET', `/sandboxes/survivor/processes/${svc.id}/output?offset=0`).body;
    // what it wrote before ("up\n", read by the first daemon) is a gap, not new bytes under old offsets
    const text = out.chunks.map((c: Json) => Buffer.from(c.data, 'base64').toString()).join('');
    expect([out.gap, text, out.chunks[0].offset]).toEqual([{ from: 0, to: 3 }, 'got again\n', 3]);
    expect(curl('GET', `/sandboxes/survivor/processes/${svc.id}`).body.result.exitCode).toBe(0);
    expect(curl('POST', '/sandboxes/survivor/exec', { json: { argv: ['true'] } }).body.exitCode).toBe(0);
    curl('DELETE', '/sandboxes/survivor');
    const third = curl('POST', `/sandboxes/${mine.id}/exec`, { token: capped, json: { argv: ['true'] } });
    expect([third.status, third.body.limit]).toEqual([429, 'maxExecs']);
    expect(curl('GET', `/sandboxes/${mine.id}/processes`, { token: capped }).body.map((p: Json) => p.found)).toEqual([
      true,
      true,
    ]);
    curl('DELETE', `/sandboxes/${mine.id}`);
    cli(home, ['key', 'rm', 'capped']);
  });
});
