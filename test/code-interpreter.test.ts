/**
 * E2B's code interpreter (docs/e2b.md) driven by E2B's own `@e2b/code-interpreter` (pinned): a real
 * `snaplab serve --e2b-listen`, the SDK's default template `code-interpreter-v1` (snaplab's built-in
 * template: a Debian image with python3-ipykernel and a user `user`, built by mmdebstrap from the
 * host's apt sources: src/image/templates.ts), and snaplab's own interpreter server inside the machine.
 *
 * The image takes minutes to build, so it is built once (`snaplab image build code-interpreter-v1`)
 * into a cache home of its own (test/image-cache.ts: kept between runs and test files, a cache hit
 * when its inputs are the same) and imported from there into this file's temporary home.
 * (test/templates.test.ts builds `base` on first use, as a home without it does.)
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Sandbox, TimeoutError } from '@e2b/code-interpreter';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cli, removeHome, startE2bDaemon, type TestDaemon } from './daemon-helpers.js';
import { cachedImage } from './image-cache.js';
import { cgroupFor, isFrozen, stats } from '../src/host/cgroups/cgroups.js';
import { interpreterVersion } from '../src/interpreter/start.js';
import Database from 'better-sqlite3';

let home: string;
let d: TestDaemon;
const saved = { ...process.env };

beforeAll(async () => {
  home = mkdtempSync(join(tmpdir(), 'snaplab-test-ci-'));
  await cachedImage(home, ['code-interpreter-v1'], 'code-interpreter-v1');
  const key = cli(home, ['key', 'create', 'agent', '--e2b']).out.trim();
  d = await startE2bDaemon(home, key);
}, 900_000);

afterAll(async () => {
  await d?.stop();
  if (home) cli(home, ['image', 'rm', '--force', 'code-interpreter-v1']);
  if (home) removeHome(home);
  process.env = saved;
});

describe('@e2b/code-interpreter@2.8.0', () => {
  it('keeps state between runCode calls, streams stdout, and returns an error with its traceback', async () => {
    const sbx = await Sandbox.create({ allowInternetAccess: false, envs: { GREETING: 'made' } });
    try {
      expect((await sbx.runCode('x = 1')).error).toBeUndefined();
      const two = await sbx.runCode('x + 1');
      expect(two.text).toBe('2');
      expect(two.results[0]?.isMainResult).toBe(true);
      expect(two.executionCount).toBe(2);

      const lines: string[] = [];
      const printed = await sbx.runCode('for i in range(3): print("line", i)', {
        onStdout: (m) => lines.push(m.line),
      });
      expect(lines.join('')).toBe('line 0\nline 1\nline 2\n');
      expect(printed.logs.stdout.join('')).toBe('line 0\nline 1\nline 2\n');

      const env = await sbx.runCode('import os; os.environ.get("MODE")', { envs: { MODE: 'test' } });
      expect(env.text).toBe("'test'");
      // put back as it was (unset: IPython shows no result for None, hence the string)
      expect((await sbx.runCode('str(os.environ.get("MODE"))')).text).toBe("'None'");
      // the create's envs are the kernel's, as E2B's server reads them from envd; a call's own win for that call
      expect((await sbx.runCode('os.environ["GREETING"], os.environ["E2B_SANDBOX"]')).text).toBe("('made', 'true')");
      expect((await sbx.runCode('os.environ["GREETING"]', { envs: { GREETING: 'call' } })).text).toBe("'call'");
      expect((await sbx.runCode('os.environ["GREETING"]')).text).toBe("'made'");

      const failed = await sbx.runCode('1 / 0');
      expect(failed.error?.name).toBe('ZeroDivisionError');
      expect(failed.error?.value).toBe('division by zero');
      expect(failed.error?.traceback).toContain('ZeroDivisionError');
      // the kernel lives on after an error
      expect((await sbx.runCode('x * 10')).text).toBe('10');

      // the sandbox's id alone reaches nothing: code runs with its access token, and its contexts
      // answer that or its traffic token (which the SDK sends on its context calls)
      const call = (path: string, headers: Record<string, string>, body?: unknown): Promise<Response> =>
        fetch(`${d.e2bUrl}${path}`, {
          method: body === undefined ? 'GET' : 'POST',
          headers: {
            'content-type': 'application/json',
            'e2b-sandbox-id': sbx.sandboxId,
            'e2b-sandbox-port': '49999',
            ...headers,
          },
          body: body === undefined ? undefined : JSON.stringify(body),
        });
      const code = { code: 'x = 99' };
      expect((await call('/execute', {}, code)).status).toBe(401);
      expect((await call('/execute', { 'x-access-token': 'not-the-token' }, code)).status).toBe(401);
      expect((await call('/contexts', {})).status).toBe(401);
      expect((await call('/contexts', { 'e2b-traffic-access-token': 'not-the-token' })).status).toBe(401);
      expect((await call('/contexts', { 'x-access-token': 'not-the-token' })).status).toBe(401);
      expect((await call('/contexts/python/restart', {}, {})).status).toBe(401);
      const traffic = (sbx as unknown as { trafficAccessToken?: string }).trafficAccessToken;
      expect(traffic).toMatch(/^[0-9a-f]{48}$/);
      expect((await call('/contexts', { 'e2b-traffic-access-token': traffic! })).status).toBe(200);
      // with the query the SDK adds when E2B_USER_AGENT_SOURCE is set
      expect((await call('/contexts?source=test', { 'e2b-traffic-access-token': traffic! })).status).toBe(200);
      // a wrong access token is not saved by a right traffic token, and code needs the access token
      const both = { 'x-access-token': 'not-the-token', 'e2b-traffic-access-token': traffic! };
      expect((await call('/contexts', both)).status).toBe(401);
      expect((await call('/execute', { 'e2b-traffic-access-token': traffic! }, code)).status).toBe(401);
      expect((await sbx.runCode('x')).text).toBe('1');
    } finally {
      await sbx.kill();
    }
  }, 120_000);

  it('returns a matplotlib plot as a PNG; contexts keep their own state, a crash of one spares the other, restart', async () => {
    const sbx = await Sandbox.create({ allowInternetAccess: false });
    try {
      const plot = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()');
      expect(plot.error).toBeUndefined();
      const png = plot.results.find((r) => r.png)?.png ?? '';
      expect(Buffer.from(png, 'base64').subarray(1, 4).toString()).toBe('PNG');

      const ctx = await sbx.createCodeContext({ cwd: '/tmp' });
      expect(ctx).toMatchObject({ language: 'python', cwd: '/tmp' });
      await sbx.runCode('y = "own"', { context: ctx });
      expect((await sbx.runCode('import os; os.getcwd()', { context: ctx })).text).toBe("'/tmp'");
      expect((await sbx.runCode('"y" in dir()')).text).toBe('False');
      expect((await sbx.listCodeContexts()).map((c) => c.id)).toContain(ctx.id);
      // its kernel dies: the default context's lives on; a restart gives the context a fresh one
      await sbx.runCode('import os; os._exit(1)', { context: ctx });
      expect((await sbx.runCode('1 + 1')).text).toBe('2');
      await sbx.restartCodeContext(ctx);
      expect((await sbx.runCode('"y" in dir()', { context: ctx })).text).toBe('False');
      await sbx.removeCodeContext(ctx);
      expect((await sbx.listCodeContexts()).map((c) => c.id)).not.toContain(ctx.id);
    } finally {
      await sbx.kill();
    }
  }, 120_000);

  it('a timeout interrupts the kernel, not the sandbox; two sandboxes do not share state', async () => {
    const a = await Sandbox.create({ allowInternetAccess: false });
    const b = await Sandbox.create({ allowInternetAccess: false });
    try {
      await a.runCode('z = 5');
      await expect(a.runCode('import time; time.sleep(120)', { timeoutMs: 2000 })).rejects.toBeInstanceOf(TimeoutError);
      // were the kernel not interrupted, this would wait for the sleep's end
      const t0 = Date.now();
      expect((await a.runCode('z')).text).toBe('5');
      expect(Date.now() - t0).toBeLessThan(30_000);
      expect(await a.isRunning()).toBe(true);
      const other = await b.runCode('z');
      expect(other.error?.name).toBe('NameError');
    } finally {
      await a.kill();
      await b.kill();
    }
  }, 180_000);

  it("MCP's run_code (a daemon's /mcp, the SDK's client): state kept, a plot as an image, an error as isError, a timeout interrupts", async () => {
    const c = new Client({ name: 'snaplab-test', version: '0' });
    await c.connect(
      new StreamableHTTPClientTransport(new URL(`${d.url}/mcp`), {
        requestInit: { headers: { Authorization: `Bearer ${process.env.E2B_API_KEY}` } },
      }),
    );
    const call = async (name: string, args: Record<string, unknown>): Promise<CallToolResult> =>
      (await c.callTool({ name, arguments: args })) as CallToolResult;
    const texts = (r: CallToolResult): string =>
      r.content.map((x) => (x.type === 'text' ? x.text : `[${x.type}]`)).join('\n');
    const made = await call('create_sandbox', { image: 'code-interpreter-v1', ttl_seconds: 600 });
    const id = (JSON.parse(texts(made)) as { id: string }).id;
    try {
      expect((await call('run_code', { sandbox: id, code: 'n = 20' })).isError).toBeFalsy();
      const two = await call('run_code', { sandbox: id, code: 'print("hi"); n + 22' });
      expect(texts(two)).toContain('stdout:\nhi');
      expect(texts(two)).toContain('42');
      const plot = await call('run_code', {
        sandbox: id,
        code: 'import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4])\nplt.show()',
      });
      const image = plot.content.find((x) => x.type === 'image');
      expect(image?.type === 'image' && image.mimeType).toBe('image/png');
      expect(
        Buffer.from(image?.type === 'image' ? image.data : '', 'base64')
          .subarray(1, 4)
          .toString(),
      ).toBe('PNG');
      const bad = await call('run_code', { sandbox: id, code: 'undefined_name' });
      expect(bad.isError).toBe(true);
      expect(texts(bad)).toContain('NameError');
      const slow = await call('run_code', { sandbox: id, code: 'import time; time.sleep(120)', timeout_seconds: 2 });
      expect(slow.isError).toBe(true);
      expect(texts(slow)).toContain('TIMEOUT');
      // interrupted, not killed: the state is there, and at once
      expect(texts(await call('run_code', { sandbox: id, code: 'n' }))).toContain('20');
    } finally {
      await call('destroy_sandbox', { sandbox: id });
      await c.close();
    }
  }, 180_000);

  it('a pool with warm interpreters: a take finds its kernel up (started before the create, frozen while it waited), each sandbox a kernel of its own', async () => {
    // named as the SDK's default template, so Sandbox.create() takes from it
    const made = cli(home, [
      'pool',
      'create',
      'code-interpreter-v1',
      '--image',
      'code-interpreter-v1',
      '--size',
      '1',
      '--warm',
      'interpreter',
      '--json',
    ]);
    expect(made.code, made.err).toBe(0);
    expect(JSON.parse(made.out)).toMatchObject({ warm: 'interpreter', recycle: false, ready: 1 });
    const pool = (): { ready: number; hits: number; misses: number } =>
      (
        JSON.parse(cli(home, ['pool', 'ls', '--json']).out) as {
          name: string;
          ready: number;
          hits: number;
          misses: number;
        }[]
      ).find((p) => p.name === 'code-interpreter-v1')!;
    const standbys = (): string[] =>
      (JSON.parse(cli(home, ['ls', '--json']).out) as { id: string; state: string; pool?: string | null }[])
        .filter((b) => b.pool === 'code-interpreter-v1' && b.state === 'paused')
        .map((b) => b.id);
    const until = async (check: () => boolean, what: string): Promise<void> => {
      const end = Date.now() + 120_000;
      while (!check()) {
        if (Date.now() > end) throw new Error(`not in time: ${what}`);
        await new Promise((r) => setTimeout(r, 200));
      }
    };
    // its kernel's start, read in the kernel (the host's boot time, whole seconds, plus the process's start in ticks)
    const started =
      'import os\n' +
      "_t = int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19]) / os.sysconf('SC_CLK_TCK')\n" +
      "int((int([l for l in open('/proc/stat') if l.startswith('btime')][0].split()[1]) + _t) * 1000)";
    try {
      // the standby waits frozen: a kernel and its heartbeats would otherwise wake it
      // one: the daemon, holding the pool once it saw it, counted the CLI's raise as coming
      const [id, ...more] = standbys();
      expect(id).toBeDefined();
      expect(more).toEqual([]);
      expect(await isFrozen(cgroupFor(id!))).toBe(true);
      const cpu0 = (await stats(cgroupFor(id!))).cpuUsec;
      await new Promise((r) => setTimeout(r, 1000));
      expect((await stats(cgroupFor(id!))).cpuUsec).toBe(cpu0);

      const before = pool().hits;
      const t0 = Date.now();
      const a = await Sandbox.create({ allowInternetAccess: false, envs: { GREETING: 'warm' } });
      try {
        expect(a.sandboxId).toBe(id);
        expect(pool().hits).toBe(before + 1);
        const first = await a.runCode(started);
        // the kernel ran nothing before this sandbox's code, and was up seconds before the create
        // (the boot time is whole seconds: a second's slack)
        expect(first.executionCount).toBe(1);
        expect(Number(first.text)).toBeLessThan(t0 - 1000);
        // the create's envs reach a kernel started before it
        expect((await a.runCode('os.environ["GREETING"]')).text).toBe("'warm'");
        await a.runCode('secret = 42');
      } finally {
        await a.kill();
      }
      // the daemon raises another warm standby (the pool was made by another process after the
      // daemon's start); the next create takes it, its kernel as fresh
      await until(() => standbys().length === 1, 'the pool refilled');
      const refill = standbys()[0];
      expect(refill).not.toBe(id);
      const b = await Sandbox.create({ allowInternetAccess: false });
      try {
        expect(b.sandboxId).toBe(refill);
        const fresh = await b.runCode('secret');
        expect(fresh.error?.name).toBe('NameError');
        expect(fresh.executionCount).toBe(1);
      } finally {
        await b.kill();
      }
      expect(pool()).toMatchObject({ hits: before + 2, misses: 0 });
      // after an upgrade a standby runs another build's server (as its record says): a take passes
      // it by (a miss), and a fill (`pool resize`) removes it and raises one of this build's
      await until(() => standbys().length === 1, 'the pool refilled again');
      const old = standbys()[0]!;
      const db = new Database(join(home, 'state.db'));
      const warmedAs = db.prepare('SELECT warm_version FROM sandboxes WHERE id = ?').pluck();
      try {
        expect(warmedAs.get(old)).toBe(interpreterVersion());
        db.prepare('UPDATE sandboxes SET warm_version = ? WHERE id = ?').run('an older build', old);
        const c = await Sandbox.create({ allowInternetAccess: false });
        try {
          expect(c.sandboxId).not.toBe(old);
          expect(pool()).toMatchObject({ hits: before + 2, misses: 1 });
        } finally {
          await c.kill();
        }
        expect(cli(home, ['pool', 'resize', 'code-interpreter-v1', '1']).code).toBe(0);
        const now = standbys();
        expect(now).not.toContain(old);
        expect(now.map((id) => warmedAs.get(id))).toEqual([interpreterVersion()]);
      } finally {
        db.close();
      }
    } finally {
      expect(cli(home, ['pool', 'rm', 'code-interpreter-v1']).code).toBe(0);
    }
  }, 300_000);

  it("a paused sandbox's kernel keeps its state: connect resumes it where it was (namespaces keep processes)", async () => {
    const sbx = await Sandbox.create({ allowInternetAccess: false });
    try {
      await sbx.runCode('kept = [1, 2, 3]');
      expect(await sbx.pause()).toBe(true);
      expect(await sbx.isRunning()).toBe(false);
      const again = await Sandbox.connect(sbx.sandboxId);
      const r = await again.runCode('sum(kept)');
      expect(r.error).toBeUndefined();
      expect(r.text).toBe('6');
      expect(r.executionCount).toBe(2); // the same kernel, not a fresh one
    } finally {
      await sbx.kill();
    }
  }, 120_000);
});
