/**
 * The E2B-compatible front (docs/e2b.md) driven by E2B's own SDK (`e2b` on npm, pinned): a real
 * `snaplab serve --e2b-listen` on 127.0.0.1, the SDK pointed at it by E2B_API_URL,
 * E2B_SANDBOX_URL and E2B_API_KEY, and each effect checked from outside with the snaplab CLI.
 * Every case runs with the latest SDK and with the oldest that routes by header (2.14.1), but
 * for what the old one does not have (gzip and streamed uploads).
 */
import { spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync } from 'node:fs';
import { request } from 'node:http';
import { Readable } from 'node:stream';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as latest from 'e2b';
import * as oldest from 'e2b-v2-14';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cli, cliAsync, removeHome, startE2bDaemon, until, type TestDaemon } from './daemon-helpers.js';

let home: string;
let d: TestDaemon;
let key: string;
let other: string;
const saved = { ...process.env };

/** `snaplab exec ID -- sh -c SCRIPT`: what the machine holds, seen without the front. */
function inside(id: string, script: string): { code: number; out: string } {
  const r = cli(home, ['exec', id, '--', 'sh', '-c', script]);
  return { code: r.code, out: r.out };
}

/** `snaplab ls --json`: every sandbox of the home, as the CLI sees them. */
function listed(): { id: string; owner: string | null }[] {
  return JSON.parse(cli(home, ['ls', '--json']).out) as { id: string; owner: string | null }[];
}

/** The uplink of the sandboxes' egress (on by default under E2B): a namespace of the test's, never the host's network. */
const UPLINK = `sltest-e2b-${process.pid}`;

beforeAll(async () => {
  spawnSync('ip', ['netns', 'add', UPLINK]);
  process.env.SNAPLAB_UPLINK_NETNS = UPLINK;
  home = mkdtempSync(join(tmpdir(), 'snaplab-test-e2b-'));
  key = cli(home, ['key', 'create', 'agent', '--e2b']).out;
  other = cli(home, ['key', 'create', 'stranger', '--e2b']).out.trim();
  // a template backed by a pool of warm standbys (the daemon keeps it full)
  const made = cli(home, ['pool', 'create', 'warm', '--size', '1']);
  if (made.code !== 0) throw new Error(`pool create: ${made.err}`);
  // E2B's default template `base` is snaplab's built-in Debian template, built on first use in
  // minutes (test/templates.test.ts builds it and runs its user `user`): these cases are about the
  // protocol, so `base` here is an image of that name that a user can make, a copy of busybox (root
  // its only user, /bin/sh)
  const base = cli(home, ['image', 'import', join(home, 'images', 'busybox', 'rootfs'), '--name', 'base']);
  if (base.code !== 0) throw new Error(`image import: ${base.err}`);
  d = await startE2bDaemon(home, key.trim());
}, 120_000);

/** A sandbox's envd access token, as the control API's connect answers it (for raw envd calls). */
async function accessToken(id: string): Promise<string> {
  const connected = await fetch(`${d.e2bUrl}/sandboxes/${id}/connect`, {
    method: 'POST',
    headers: { 'X-API-Key': key.trim(), 'content-type': 'application/json' },
    body: JSON.stringify({ timeout: 600 }),
  });
  return ((await connected.json()) as { envdAccessToken: string }).envdAccessToken;
}

type Sdk = typeof latest;
/** what e2b_protocol.py prints: each case reads the fields it checks by name */
// biome-ignore lint/suspicious/noExplicitAny: see above
type Json = any;

afterAll(async () => {
  await d?.stop();
  if (home) removeHome(home);
  process.env = saved;
  spawnSync('ip', ['netns', 'del', UPLINK]);
});

describe.each([
  ['e2b@2.51.0', latest, true],
  ['e2b@2.14.1', oldest as unknown as Sdk, false],
] as const)('with %s', (_label, sdk: Sdk, modern: boolean) => {
  const { AuthenticationError, CommandExitError, InvalidArgumentError, Sandbox, TimeoutError } = sdk;
  // 2.14 has no SandboxNotFoundError yet: its NotFoundError, which the newer one extends
  const SandboxNotFoundError = sdk.SandboxNotFoundError ?? sdk.NotFoundError;
  describe('keys and the control API', () => {
    it('key create --e2b prints only a key shaped e2b_<hex>', () => {
      expect(key).toMatch(/^e2b_[0-9a-f]{40}\n$/);
      expect(d.e2bUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    });

    it('creates a sandbox of the base template, with metadata and envs, owned by the key', async () => {
      const sbx = await Sandbox.create({ metadata: { suite: 'e2b', who: 'first' }, envs: { GREETING: 'hello' } });
      try {
        const box = listed().find((b) => b.id === sbx.sandboxId);
        expect(box?.owner).toBe('agent');
        const info = await sbx.getInfo();
        expect(info.templateId).toBe('base');
        expect(info.metadata).toEqual({ suite: 'e2b', who: 'first' });
        expect(info.state).toBe('running');
        expect(info.endAt.getTime()).toBeGreaterThan(Date.now());
        // the create's envs are every command's
        const r = await sbx.commands.run('echo "$GREETING" > /tmp/greeting');
        expect(r.exitCode).toBe(0);
        expect(inside(sbx.sandboxId, 'cat /tmp/greeting').out).toBe('hello\n');
      } finally {
        await sbx.kill();
      }
    });

    it("the daemon's own PATCH of a sandbox's metadata keeps what the front keeps (template, envs)", async () => {
      const sbx = await Sandbox.create('busybox', { metadata: { first: '1' }, envs: { KEPT: 'kept' } });
      try {
        const patched = await fetch(`${d.url}/sandboxes/${sbx.sandboxId}`, {
          method: 'PATCH',
          headers: { authorization: `Bearer ${key.trim()}`, 'content-type': 'application/json' },
          body: JSON.stringify({ metadata: { second: '2' } }),
        });
        expect(patched.status).toBe(200);
        const info = await sbx.getInfo();
        expect(info.metadata).toEqual({ second: '2' });
        expect(info.templateId).toBe('busybox');
        expect((await sbx.commands.run('echo "$KEPT"')).stdout).toBe('kept\n');
      } finally {
        await sbx.kill();
      }
    });

    it('a template that names a pool takes one of its standbys; one that names an image is made from it', async () => {
      const hits = (): number =>
        (JSON.parse(cli(home, ['pool', 'ls', '--json']).out) as { name: string; hits: number }[]).find(
          (p) => p.name === 'warm',
        )?.hits ?? -1;
      const before = hits();
      const pooled = await Sandbox.create('warm', { metadata: { from: 'pool' } });
      const imaged = await Sandbox.create('busybox');
      try {
        const boxes = JSON.parse(cli(home, ['ls', '--json']).out) as { id: string; labels: Record<string, string> }[];
        expect(boxes.find((b) => b.id === pooled.sandboxId)).toBeDefined();
        expect((await pooled.getInfo()).templateId).toBe('warm');
        expect((await pooled.getInfo()).metadata).toEqual({ from: 'pool' });
        expect((await imaged.getInfo()).templateId).toBe('busybox');
        expect((await pooled.commands.run('echo pooled')).stdout).toBe('pooled\n');
        expect(hits()).toBe(before + 1);
      } finally {
        await pooled.kill();
        await imaged.kill();
      }
      await expect(Sandbox.create('no-such-template')).rejects.toThrow(/404/);
    });

    it('a template that was a pool and is one no more is made from its image of that name', async () => {
      const hits = (): number =>
        (JSON.parse(cli(home, ['pool', 'ls', '--json']).out) as { name: string; hits: number }[]).find(
          (p) => p.name === 'base',
        )?.hits ?? -1;
      const pooled = cli(home, ['pool', 'create', 'base', '--image', 'base', '--size', '1']);
      expect(pooled.code, pooled.err).toBe(0);
      let gone = false;
      try {
        const before = hits();
        // the front learns here that `base` is a pool: its next creates of it are takes at once
        const taken = await Sandbox.create('base');
        await taken.kill();
        expect(hits()).toBe(before + 1);
        expect(cli(home, ['pool', 'rm', 'base']).code).toBe(0);
        gone = true;
        // the take finds no pool: the template is looked up again, and is the image `base`
        const made = await Sandbox.create('base');
        try {
          expect((await made.getInfo()).templateId).toBe('base');
          expect((await made.commands.run('echo made')).stdout).toBe('made\n');
        } finally {
          await made.kill();
        }
      } finally {
        if (!gone) cli(home, ['pool', 'rm', 'base']);
      }
    });

    it('lists with a metadata filter and pages with X-Next-Token; setTimeout moves the end', async () => {
      const a = await Sandbox.create({ metadata: { suite: 'list' } });
      const b = await Sandbox.create({ metadata: { suite: 'list' } });
      const c = await Sandbox.create({ metadata: { suite: 'elsewhere' } });
      try {
        const pages = Sandbox.list({ query: { metadata: { suite: 'list' } }, limit: 1 });
        const first = await pages.nextItems();
        expect(pages.hasNext).toBe(true);
        const second = await pages.nextItems();
        // newest first
        expect([...first, ...second].map((s) => s.sandboxId)).toEqual([b.sandboxId, a.sandboxId]);
        if (pages.hasNext) expect(await pages.nextItems()).toEqual([]);
        // what the SDK does not send, as E2B's API takes it (read in the daemon's store: the Lab API's list)
        const raw = async (q: string, metadata = 'suite=list'): Promise<string[]> => {
          const r = await fetch(`${d.e2bUrl}/v2/sandboxes?metadata=${encodeURIComponent(metadata)}&${q}`, {
            headers: { 'X-API-Key': key.trim() },
          });
          return ((await r.json()) as { sandboxID: string }[]).map((x) => x.sandboxID);
        };
        expect(await raw('order=asc')).toEqual([a.sandboxId, b.sandboxId]);
        // startedAfter is inclusive
        const bStart = (await Sandbox.getInfo(b.sandboxId)).startedAt.toISOString();
        expect(await raw(`startedAfter=${encodeURIComponent(bStart)}`)).toEqual([b.sandboxId]);
        expect(await raw('template=base&state=running')).toEqual([b.sandboxId, a.sandboxId]);
        expect(await raw('template=elsewhere')).toEqual([]);
        expect(await raw('state=paused')).toEqual([]);
        // the front's own keys are not the caller's metadata
        expect(await raw('', 'suite=list&e2b.template=base')).toEqual([]);
        // an order or a state E2B's API does not know is refused, as there (not read as the default)
        for (const q of ['order=newest', 'state=sleeping']) {
          const r = await fetch(`${d.e2bUrl}/v2/sandboxes?${q}`, { headers: { 'X-API-Key': key.trim() } });
          expect([q, r.status]).toEqual([q, 400]);
        }
        // v1 lists the running ones only, as E2B's: a paused one is not among them
        await a.pause();
        const v1 = await fetch(`${d.e2bUrl}/sandboxes?metadata=${encodeURIComponent('suite=list')}`, {
          headers: { 'X-API-Key': key.trim() },
        });
        expect(((await v1.json()) as { sandboxID: string }[]).map((x) => x.sandboxID)).toEqual([b.sandboxId]);
        expect(await raw('state=paused')).toEqual([a.sandboxId]);
        await Sandbox.connect(a.sandboxId);
        await Sandbox.setTimeout(c.sandboxId, 3600_000);
        const end = (await Sandbox.getInfo(c.sandboxId)).endAt.getTime();
        expect(end).toBeGreaterThan(Date.now() + 3500_000);
        // a connect never shortens the end; a running sandbox's connect answers 200 (a resumed one 201)
        await Sandbox.connect(c.sandboxId, { timeoutMs: 60_000 });
        expect((await Sandbox.getInfo(c.sandboxId)).endAt.getTime()).toBe(end);
        for (const path of [`/sandboxes/${c.sandboxId}/connect`, `/v2/sandboxes/${c.sandboxId}/connect`]) {
          const r = await fetch(`${d.e2bUrl}${path}`, {
            method: 'POST',
            headers: { 'X-API-Key': key.trim(), 'content-type': 'application/json' },
            body: JSON.stringify({ timeout: 60 }),
          });
          expect([path, r.status]).toEqual([path, 200]);
          expect(await r.json()).toMatchObject({ sandboxID: c.sandboxId, envdVersion: expect.any(String) });
        }
        expect((await Sandbox.getInfo(c.sandboxId)).endAt.getTime()).toBe(end);
      } finally {
        for (const s of [a, b, c]) await s.kill();
      }
    });

    it("a timeout of 0 is E2B's: refused at create (400), and the end now when set", async () => {
      const refused = await fetch(`${d.e2bUrl}/v2/sandboxes`, {
        method: 'POST',
        headers: { 'X-API-Key': key.trim(), 'content-type': 'application/json' },
        body: JSON.stringify({ templateID: 'busybox', timeout: 0 }),
      });
      expect(refused.status).toBe(400);
      expect(await refused.json()).toMatchObject({ code: 400, message: expect.stringMatching(/greater than 0/) });
      const sbx = await Sandbox.create('busybox');
      await sbx.setTimeout(0);
      await until('ended by its timeout of 0', () => !listed().some((b) => b.id === sbx.sandboxId), 15_000);
      expect(await sbx.isRunning()).toBe(false);
    });

    it('kill ends the sandbox: gone from snaplab ls, not running, a second kill is false', async () => {
      const sbx = await Sandbox.create();
      expect(await sbx.isRunning()).toBe(true);
      expect(await Sandbox.kill(sbx.sandboxId)).toBe(true);
      expect(listed().some((b) => b.id === sbx.sandboxId)).toBe(false);
      expect(await sbx.isRunning()).toBe(false);
      expect(await Sandbox.kill(sbx.sandboxId)).toBe(false);
      await expect(Sandbox.getInfo(sbx.sandboxId)).rejects.toBeInstanceOf(SandboxNotFoundError);
    });

    it("answers errors in E2B's JSON shape, and 502 for envd of an unknown sandbox", async () => {
      const post = (body: string) =>
        fetch(`${d.e2bUrl}/v2/sandboxes`, {
          method: 'POST',
          headers: { 'X-API-Key': key.trim(), 'content-type': 'application/json' },
          body,
        });
      const bad = await post('{not json');
      expect(bad.status).toBe(400);
      expect(await bad.json()).toMatchObject({ code: 400, message: expect.any(String) });
      const badTimeout = await post('{"templateID": "base", "timeout": -1}');
      expect(await badTimeout.json()).toMatchObject({ code: 400 });
      const noKey = await fetch(`${d.e2bUrl}/sandboxes/nope`);
      expect(noKey.status).toBe(401);
      expect(await noKey.json()).toMatchObject({ code: 401 });
      const health = await fetch(`${d.e2bUrl}/health`, { headers: { 'E2b-Sandbox-Id': 'nope' } });
      expect(health.status).toBe(502);
      // ids that name nothing, with a good key: 404 in E2B's shape, whatever the id holds
      for (const id of ['nope', 'x'.repeat(300), '..%2F..%2Fetc', '%00', 'a%20b']) {
        for (const [method, path] of [
          ['GET', `/sandboxes/${id}`],
          ['DELETE', `/sandboxes/${id}`],
          ['POST', `/sandboxes/${id}/connect`],
          ['POST', `/sandboxes/${id}/timeout`],
          ['POST', `/sandboxes/${id}/pause`],
          ['GET', `/sandboxes/${id}/metrics`],
        ]) {
          const r = await fetch(`${d.e2bUrl}${path}`, {
            method,
            headers: { 'X-API-Key': key.trim(), 'content-type': 'application/json' },
            body: method === 'POST' ? '{"timeout": 60}' : undefined,
          });
          expect([method, path, r.status]).toEqual([method, path, 404]);
          expect(await r.json()).toMatchObject({ code: 404, message: expect.any(String) });
        }
      }
      // none of the bad requests made anything (the pool's standby is nobody's)
      expect(listed().filter((b) => b.owner !== null)).toEqual([]);
    });

    it('refuses an unknown key', async () => {
      await expect(Sandbox.create({ apiKey: `e2b_${'0'.repeat(40)}` })).rejects.toBeInstanceOf(AuthenticationError);
    });
  });

  describe('envd: commands and files', () => {
    let sbx: latest.Sandbox;
    beforeAll(async () => {
      sbx = await Sandbox.create({ timeoutMs: 600_000 });
    });
    afterAll(async () => {
      await sbx?.kill();
    });

    it('commands.run: stdout streamed, stderr, exit codes, env, cwd, user', async () => {
      const chunks: string[] = [];
      const r = await sbx.commands.run('echo out; echo err >&2; echo "$X"; pwd; id -u', {
        envs: { X: 'ex' },
        cwd: '/tmp',
        user: 'root',
        onStdout: (s) => void chunks.push(s),
      });
      expect(r).toMatchObject({ exitCode: 0, stdout: 'out\nex\n/tmp\n0\n', stderr: 'err\n' });
      expect(chunks.join('')).toBe(r.stdout);
      // E2B's `/bin/bash -l -c`: this machine has no bash, so its sh runs the command (base: bash)
      expect((await sbx.commands.run('echo $0')).stdout).toBe('/bin/sh\n');
      const failed = await sbx.commands.run('echo no >&2; exit 3').catch((e: unknown) => e);
      expect(failed).toBeInstanceOf(CommandExitError);
      // its message is its wait's error, as envd's end event says it
      expect(failed).toMatchObject({ exitCode: 3, stderr: 'no\n', message: 'exit status 3' });
      // root's commands run in its home unless told, as envd runs a user's
      expect((await sbx.commands.run('pwd')).stdout).toBe('/root\n');
      const nobody = await sbx.commands.run('id -u', { user: 'nobody' });
      expect(nobody.stdout.trim()).toBe('65534');
      // as envd's, a command ends with its output: what it left in the background writing there is read
      expect((await sbx.commands.run('(sleep 0.3; echo late) & echo early')).stdout).toBe('early\nlate\n');
    });

    it('as envd: ~ and relative paths and cwds under the home, a missing cwd, links, a late connect', async () => {
      expect((await sbx.commands.run('mkdir -p ~/sub && echo "$E2B_TEMPLATE_ID"')).stdout).toBe('base\n');
      for (const cwd of ['sub', '~/sub', '/root/sub'])
        expect((await sbx.commands.run('pwd', { cwd })).stdout).toBe('/root/sub\n');
      await expect(sbx.commands.run('pwd', { cwd: '/nope' })).rejects.toBeInstanceOf(InvalidArgumentError);
      await sbx.files.write('~/sub/t.txt', 'tilde');
      expect(inside(sbx.sandboxId, 'cat /root/sub/t.txt').out).toBe('tilde');
      expect(await sbx.files.exists('~/sub/t.txt')).toBe(true);
      // a directory read as a file: InvalidArgumentError (envd's 400)
      await expect(sbx.files.read('/root/sub')).rejects.toBeInstanceOf(InvalidArgumentError);
      // a link written through, as envd's open of it; listed as where it ends
      expect(inside(sbx.sandboxId, 'cd /root/sub && ln -s t.txt l && ln -s /root/sub d && ln -s /none gone').code).toBe(
        0,
      );
      await sbx.files.write('/root/sub/l', 'through');
      expect(inside(sbx.sandboxId, 'cat /root/sub/t.txt; test -L /root/sub/l && echo " link"').out).toBe(
        'through link\n',
      );
      const entries = await sbx.files.list('/root/sub');
      const of = (name: string) => entries.find((e) => e.name === name);
      expect([of('d')?.type, of('d')?.symlinkTarget, of('l')?.type, of('l')?.symlinkTarget]).toEqual([
        'dir',
        '/root/sub',
        'file',
        '/root/sub/t.txt',
      ]);
      // a dangling link has no type: the SDK leaves it out of a listing, as under envd
      expect(of('gone')).toBeUndefined();
      // a command that ended is still told of to a Connect for 30 s (envd ≥ 0.6.12)
      const h = await sbx.commands.run('exit 7', { background: true });
      await expect(h.wait()).rejects.toBeInstanceOf(CommandExitError);
      const late = await sbx.commands.connect(h.pid);
      await expect(late.wait()).rejects.toMatchObject({ exitCode: 7 });
      expect(inside(sbx.sandboxId, 'rm -r /root/sub').code).toBe(0);
    });

    it('a command past its timeout is killed inside, with what it started', async () => {
      // the shell, a child in the background and one in the foreground: the whole group goes
      const late = await sbx.commands.run('sleep 371 & sleep 372', { timeoutMs: 1000 }).catch((e: unknown) => e);
      expect(late).toBeInstanceOf(TimeoutError);
      await until(
        'the timed-out command and its children are gone',
        () => !/sleep 37[12]/.test(inside(sbx.sandboxId, 'ps').out),
      );
    });

    it('a background command runs until killed', async () => {
      const h = await sbx.commands.run('sleep 1234', { background: true, envs: { MINE: '1' } });
      expect(h.pid).toBeGreaterThan(0);
      expect(inside(sbx.sandboxId, 'ps').out).toContain('sleep 1234');
      // listed with its config as sent, as envd lists it (not the environment it runs with)
      const listed = (await sbx.commands.list()).find((p) => p.pid === h.pid);
      expect(listed).toMatchObject({ cmd: '/bin/bash', envs: { MINE: '1' } });
      expect(listed?.cwd).toBeUndefined();
      expect(await h.kill()).toBe(true);
      await expect(h.wait()).rejects.toBeInstanceOf(CommandExitError);
      await until('the killed command is gone', () => !inside(sbx.sandboxId, 'ps').out.includes('sleep 1234'));
      expect(await sbx.commands.kill(h.pid)).toBe(false);
    });

    it('pty: a terminal, its input, a resize and its end', async () => {
      let screen = '';
      const dec = new TextDecoder();
      const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (b) => void (screen += dec.decode(b)) });
      await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo "[$((6*7))]"; stty size\n'));
      await until('the answer on the terminal', () => screen.includes('[42]') && screen.includes('24 80'));
      await sbx.pty.resize(term.pid, { cols: 100, rows: 30 });
      await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size; exit 0\n'));
      expect((await term.wait()).exitCode).toBe(0);
      expect(screen).toContain('30 100');
      // a terminal killed: its shell ends, and the command list no longer has it
      const other = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {} });
      expect((await sbx.commands.list()).map((p) => p.pid)).toContain(other.pid);
      expect(await sbx.pty.kill(other.pid)).toBe(true);
      await expect(other.wait()).rejects.toBeInstanceOf(CommandExitError);
      expect((await sbx.commands.list()).map((p) => p.pid)).not.toContain(other.pid);
      expect(await sbx.pty.kill(other.pid)).toBe(false);
    });

    it('commands.connect reattaches to a running command by pid', async () => {
      const h = await sbx.commands.run('read x; echo "got $x"', { background: true, stdin: true });
      await h.disconnect();
      const seen: string[] = [];
      const again = await sbx.commands.connect(h.pid, { onStdout: (s) => void seen.push(s) });
      await sbx.commands.sendStdin(h.pid, 'it\n');
      expect((await again.wait()).stdout).toBe('got it\n');
      expect(seen.join('')).toBe('got it\n');
    });

    it.runIf(modern)('stdin: sendStdin and closeStdin feed a background command', async () => {
      const h = await sbx.commands.run('cat; echo done', { background: true, stdin: true });
      await h.sendStdin('abc\n');
      await sbx.commands.sendStdin(h.pid, 'def\n');
      await h.closeStdin();
      expect((await h.wait()).stdout).toBe('abc\ndef\ndone\n');
    });

    it('stdin by pid: commands.sendStdin and commands.closeStdin (what 2.14 has) end a reader at its EOF', async () => {
      const h = await sbx.commands.run('cat; echo done', { background: true, stdin: true });
      await sbx.commands.sendStdin(h.pid, 'abc\n');
      await sbx.commands.closeStdin(h.pid);
      expect((await h.wait()).stdout).toBe('abc\ndone\n');
      // an ended command's stdin takes nothing
      await expect(sbx.commands.sendStdin(h.pid, 'late')).rejects.toThrow();
    });

    it.runIf(modern)('files: octet-stream and gzip uploads', async () => {
      const big = Buffer.alloc(3 << 20, 'x');
      await sbx.files.write('/srv/plain.bin', new Blob([big]).stream(), {});
      expect(inside(sbx.sandboxId, 'wc -c < /srv/plain.bin').out.trim()).toBe(String(big.length));
      await sbx.files.write('/srv/zipped.txt', 'unzipped inside', { gzip: true });
      expect(inside(sbx.sandboxId, 'cat /srv/zipped.txt').out).toBe('unzipped inside');
    });

    it('files: write and read, both ways; list, makeDir, rename, remove', async () => {
      await sbx.files.write('/srv/data/hello.txt', 'hello from e2b');
      expect(inside(sbx.sandboxId, 'cat /srv/data/hello.txt').out).toBe('hello from e2b');
      expect(inside(sbx.sandboxId, 'printf made-inside > /srv/data/in.txt').code).toBe(0);
      expect(await sbx.files.read('/srv/data/in.txt')).toBe('made-inside');
      const bytes = Buffer.from([0, 1, 2, 255, 254]);
      await sbx.files.write('/srv/bin.dat', bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length));
      expect(Buffer.from(await sbx.files.read('/srv/bin.dat', { format: 'bytes' }))).toEqual(bytes);
      expect((await sbx.files.list('/srv/data')).map((e) => [e.name, e.type]).sort()).toEqual([
        ['hello.txt', 'file'],
        ['in.txt', 'file'],
      ]);
      expect(await sbx.files.makeDir('/srv/new')).toBe(true);
      expect(await sbx.files.makeDir('/srv/new')).toBe(false);
      await sbx.files.rename('/srv/data/in.txt', '/srv/new/moved.txt');
      expect(inside(sbx.sandboxId, 'cat /srv/new/moved.txt').out).toBe('made-inside');
      await sbx.files.remove('/srv/new');
      expect(await sbx.files.exists('/srv/new')).toBe(false);
      expect(inside(sbx.sandboxId, 'test -e /srv/new').code).not.toBe(0);
      await expect(sbx.files.read('/srv/none')).rejects.toThrow(/not found|No such/i);
      // removing what is not there succeeds, as envd's does
      await sbx.files.remove('/srv/none');
    });

    it('files: 20 MiB of binary both ways, unchanged', async () => {
      const big = randomBytes(20 << 20);
      await sbx.files.write('/srv/big.bin', big.buffer.slice(big.byteOffset, big.byteOffset + big.length));
      const sum = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');
      expect(inside(sbx.sandboxId, 'sha256sum /srv/big.bin').out.split(' ')[0]).toBe(sum(big));
      expect(sum(await sbx.files.read('/srv/big.bin', { format: 'bytes' }))).toBe(sum(big));
      await sbx.files.remove('/srv/big.bin');
    });

    // streamed both ways, not held whole by the daemon: over the 256 MiB it once refused, its peak
    // resident memory grows by far less than the file; an upload cut off leaves the file as it was
    it.runIf(modern)('files: 300 MiB streamed each way; a cut upload changes nothing', async () => {
      const peak = (): number =>
        Number(/VmHWM:\s+(\d+)/.exec(readFileSync(`/proc/${d.proc.pid}/status`, 'utf8'))![1]) * 1024;
      const MIB = 300;
      const block = randomBytes(1 << 20);
      const sent = createHash('sha256');
      function* blocks(): Generator<Buffer> {
        for (let i = 0; i < MIB; i++) {
          const b = Buffer.from(block);
          b.writeUInt32BE(i, 0); // each MiB its own: a block out of place changes the sum
          sent.update(b);
          yield b;
        }
      }
      const before = peak();
      await sbx.files.write('/srv/huge.bin', Readable.toWeb(Readable.from(blocks())) as ReadableStream);
      const sum = sent.digest('hex');
      expect(inside(sbx.sandboxId, 'sha256sum /srv/huge.bin').out.split(' ')[0]).toBe(sum);
      const got = createHash('sha256');
      let bytes = 0;
      for await (const c of await sbx.files.read('/srv/huge.bin', { format: 'stream' })) {
        got.update(c);
        bytes += c.length;
      }
      expect([bytes, got.digest('hex')]).toEqual([MIB << 20, sum]);
      expect(peak() - before).toBeLessThan(128 << 20);
      // cut off after 5 MiB, sent chunked (no length to fall short of): once the write is under way
      // (its temporary file there) the client goes; the file keeps its bytes, and nothing is left
      const url = new URL(await sbx.uploadUrl('/srv/huge.bin'));
      const req = request(url, {
        method: 'POST',
        headers: { 'content-type': 'application/octet-stream', 'transfer-encoding': 'chunked' },
      });
      const gone = new Promise<void>((resolve) => req.on('close', resolve));
      req.on('error', () => undefined); // the cut is the point
      req.write(randomBytes(5 << 20));
      const temporary = (): boolean => inside(sbx.sandboxId, 'ls -a /srv').out.includes('snaplab');
      await until('the write under way', temporary);
      req.destroy();
      await gone;
      await until('the temporary file gone', () => !temporary());
      expect(inside(sbx.sandboxId, 'sha256sum /srv/huge.bin').out.split(' ')[0]).toBe(sum);
      await sbx.files.remove('/srv/huge.bin');
    });

    it.runIf(modern)(
      'files: a bad upload gets a 400 and changes nothing; 1100 parts are written in order, a field that is no file skipped',
      async () => {
        const token = await accessToken(sbx.sandboxId);
        const post = async (
          query: string,
          body: string,
          headers: Record<string, string> = {},
        ): Promise<[number, Json]> => {
          const r = await fetch(`${d.e2bUrl}/files${query}`, {
            method: 'POST',
            headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': token, ...headers },
            body,
          });
          return [r.status, await r.json()];
        };
        await sbx.files.write('/srv/kept.txt', 'kept');
        const form = (parts: string): [string, Record<string, string>] => [
          parts,
          { 'content-type': 'multipart/form-data; boundary=XX' },
        ];
        // a part with neither a filename nor ?path=; a body cut before its closing boundary; gzip
        // that is not: each a 400 with its reason, and the daemon serves on
        const part = (disposition: string, data: string) =>
          `--XX\r\nContent-Disposition: form-data; ${disposition}\r\nContent-Type: application/octet-stream\r\n\r\n${data}\r\n`;
        expect(await post('', ...form(`${part('name="file"', 'x')}--XX--\r\n`))).toMatchObject([
          400,
          { message: /no path/ },
        ]);
        const [cut, cutBody] = await post('', ...form(part('name="file"; filename="/srv/kept.txt"', 'replaced')));
        expect([cut, cutBody.message]).toEqual([400, expect.stringMatching(/malformed multipart/)]);
        const [zip, zipBody] = await post('?path=/srv/kept.txt', 'not gzip at all', {
          'content-type': 'application/octet-stream',
          'content-encoding': 'gzip',
        });
        expect([zip, zipBody.message]).toEqual([400, expect.stringMatching(/gzip/)]);
        // an encoding envd does not take (deflate was written as it came, its bytes the file's)
        const [deflate, deflateBody] = await post('?path=/srv/kept.txt', 'x', {
          'content-type': 'application/octet-stream',
          'content-encoding': 'deflate',
        });
        expect([deflate, deflateBody.message]).toEqual([400, expect.stringMatching(/Content-Encoding "deflate"/)]);
        expect(inside(sbx.sandboxId, 'cat /srv/kept.txt; ls -a /srv | grep -c snaplab').out).toBe('kept0\n');
        // 1100 small parts, one after another (at once they were 1100 processes in the sandbox; over
        // 1000 the upload failed, after writing 1000), and a form field that is no file (envd skips it)
        const many = Array.from({ length: 1100 }, (_, i) =>
          part(`name="file"; filename="/srv/many/${i}.txt"`, String(i)),
        );
        many.splice(1, 0, part('name="note"; filename="/srv/many/note.txt"', 'not a file'));
        const [ok, entries] = await post('', ...form(`${many.join('')}--XX--\r\n`));
        expect(ok).toBe(200);
        expect((entries as { path: string }[]).map((e) => e.path)).toEqual(
          Array.from({ length: 1100 }, (_, i) => `/srv/many/${i}.txt`),
        );
        expect(inside(sbx.sandboxId, 'cat /srv/many/0.txt /srv/many/1099.txt; ls /srv/many | wc -l').out).toBe(
          '010991100\n',
        );
        expect(inside(sbx.sandboxId, 'rm -r /srv/many /srv/kept.txt').code).toBe(0);
      },
    );

    it("files.write to a file of the kernel's (/proc): written where it is, as envd opens it", async () => {
      // a temporary file beside it and a rename, as for any other file, cannot be made in /proc
      const h = await sbx.commands.run('sleep 600', { background: true });
      try {
        await sbx.files.write(`/proc/${h.pid}/oom_score_adj`, '500');
        expect(inside(sbx.sandboxId, `cat /proc/${h.pid}/oom_score_adj`).out).toBe('500\n');
      } finally {
        await h.kill();
      }
    });

    it('files.list with a depth: every entry down to it, depth first, names in order', async () => {
      expect(
        inside(
          sbx.sandboxId,
          'mkdir -p /srv/tree/b/y/deeper /srv/tree/a && touch /srv/tree/c /srv/tree/b/x /srv/tree/b/y/z',
        ).code,
      ).toBe(0);
      const at = async (depth: number) => (await sbx.files.list('/srv/tree', { depth })).map((e) => e.path);
      expect(await at(1)).toEqual(['/srv/tree/a', '/srv/tree/b', '/srv/tree/c']);
      expect(await at(3)).toEqual([
        '/srv/tree/a',
        '/srv/tree/b',
        '/srv/tree/b/x',
        '/srv/tree/b/y',
        '/srv/tree/b/y/deeper',
        '/srv/tree/b/y/z',
        '/srv/tree/c',
      ]);
    });

    it('files and filesystem calls as another user: run as root, what they make is theirs (as envd)', async () => {
      // /files takes the user in its `username` query, the filesystem RPCs in Basic authorization
      await sbx.files.write('/tmp/by-nobody.txt', 'x', { user: 'nobody' });
      expect(await sbx.files.makeDir('/tmp/dir-by-nobody/a/b', { user: 'nobody' })).toBe(true);
      // where only root may write: envd writes as root and gives the file to the user
      await sbx.files.write('/root/for-nobody/x.txt', 'x', { user: 'nobody' });
      expect(
        inside(
          sbx.sandboxId,
          'stat -c %u /tmp/by-nobody.txt /tmp/dir-by-nobody /tmp/dir-by-nobody/a/b /root/for-nobody /root/for-nobody/x.txt /root',
        ).out,
      ).toBe('65534\n65534\n65534\n65534\n65534\n0\n');
      // written over as root, a file becomes root's (envd chowns it to the writer)
      await sbx.files.write('/tmp/by-nobody.txt', 'y', { user: 'root' });
      expect(inside(sbx.sandboxId, 'stat -c %u:%g /tmp/by-nobody.txt; cat /tmp/by-nobody.txt').out).toBe('0:0\ny');
      // read and listed as root; EntryInfo names the owner and group as the machine does
      expect(inside(sbx.sandboxId, 'echo secret > /root/only-root && chmod 600 /root/only-root').code).toBe(0);
      expect(await sbx.files.read('/root/only-root', { user: 'nobody' })).toBe('secret\n');
      const entries = await sbx.files.list('/root/for-nobody', { user: 'nobody' });
      expect(entries.map((e) => [e.name, e.owner, e.group])).toEqual([['x.txt', 'nobody', 'nogroup']]);
      // Move is rename(2): the target's missing parents made (the user's), a file onto a directory refused
      await sbx.files.rename('/root/for-nobody/x.txt', '/root/moved/here/x.txt', { user: 'nobody' });
      expect(inside(sbx.sandboxId, 'stat -c %u:%n /root/moved/here; cat /root/moved/here/x.txt').out).toBe(
        '65534:/root/moved/here\nx',
      );
      await expect(sbx.files.rename('/root/moved/here/x.txt', '/root/moved')).rejects.toThrow(/EISDIR|directory/i);
      expect(inside(sbx.sandboxId, 'test -f /root/moved/here/x.txt').code).toBe(0);
      await sbx.files.remove('/root/moved', { user: 'nobody' });
      expect(inside(sbx.sandboxId, 'test -e /root/moved || echo gone').out).toBe('gone\n');
      expect(inside(sbx.sandboxId, 'rm -r /root/for-nobody /root/only-root /tmp/dir-by-nobody').code).toBe(0);
      // a user the sandbox does not have is refused, as envd refuses it (the calls run as root)
      await expect(sbx.files.remove('x', { user: 'ghost' })).rejects.toThrow(/invalid username/);
      await expect(sbx.files.write('/tmp/ghost.txt', 'x', { user: 'ghost' })).rejects.toThrow(/invalid username/);
      expect(inside(sbx.sandboxId, 'test -e /tmp/ghost.txt || echo none').out).toBe('none\n');
      // one added since the sandbox's users were read is found
      expect(inside(sbx.sandboxId, 'echo ghost:x:4321:4321::/tmp:/bin/sh >> /etc/passwd').code).toBe(0);
      await sbx.files.write('/tmp/ghost.txt', 'x', { user: 'ghost' });
      expect(inside(sbx.sandboxId, 'stat -c %u /tmp/ghost.txt && rm /tmp/ghost.txt').out).toBe('4321\n');
      expect(inside(sbx.sandboxId, "sed -i '/^ghost:/d' /etc/passwd").code).toBe(0);
      // and one removed since it was read is refused the same way (401, AuthenticationError), not as
      // the library's 400 (InvalidArgumentError), by the command that finds it gone and after it
      for (let i = 0; i < 2; i++) {
        const gone = sbx.commands.run('id -u', { user: 'ghost' });
        await expect(gone).rejects.toBeInstanceOf(sdk.AuthenticationError);
        await expect(gone).rejects.toThrow(/invalid username/);
      }
    });

    it('/files takes its user from Basic authorization when the query names none (as envd)', async () => {
      const token = await accessToken(sbx.sandboxId);
      const upload = (query: string, user: string) =>
        fetch(`${d.e2bUrl}/files?path=/tmp/basic.txt${query}`, {
          method: 'POST',
          headers: {
            'E2b-Sandbox-Id': sbx.sandboxId,
            'X-Access-Token': token,
            Authorization: `Basic ${Buffer.from(`${user}:`).toString('base64')}`,
            'content-type': 'application/octet-stream',
          },
          body: user,
        });
      expect((await upload('', 'nobody')).status).toBe(200);
      expect(inside(sbx.sandboxId, 'stat -c %u /tmp/basic.txt; cat /tmp/basic.txt').out).toBe('65534\nnobody');
      // a user the sandbox does not have, named only there, is refused as envd refuses it (401)
      const ghost = await upload('', 'nosuchuser');
      expect([ghost.status, await ghost.text()]).toEqual([401, expect.stringMatching(/invalid username/)]);
      // the query's user is the one when both are given
      expect((await upload('&username=root', 'nosuchuser')).status).toBe(200);
      expect(inside(sbx.sandboxId, 'stat -c %u /tmp/basic.txt && rm /tmp/basic.txt').out).toBe('0\n');
    });
  });

  describe('a full disk', () => {
    it("an upload past the sandbox's disk answers 507, the SDK's NotEnoughSpaceError", async () => {
      // a sandbox of the key's with a disk of 16 MiB, made through snaplab's own API (E2B's create has no disk size)
      const made = await fetch(`${d.url}/sandboxes`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key.trim()}`, 'content-type': 'application/json' },
        body: JSON.stringify({ image: 'busybox', limits: { diskBytes: 16 << 20 } }),
      });
      expect(made.status).toBe(201);
      const sbx = await Sandbox.connect(((await made.json()) as { id: string }).id);
      try {
        const big = randomBytes(32 << 20);
        const full = await sbx.files.write('/root/big.bin', big.buffer as ArrayBuffer).catch((e: unknown) => e);
        expect(full).toBeInstanceOf(sdk.NotEnoughSpaceError);
        // the rest of the sandbox goes on
        expect((await sbx.commands.run('echo on')).stdout).toBe('on\n');
      } finally {
        await sbx.kill();
      }
    });
  });

  describe('watches', () => {
    let sbx: latest.Sandbox;
    beforeAll(async () => {
      sbx = await Sandbox.create({ timeoutMs: 600_000 });
    });
    afterAll(async () => {
      await sbx?.kill();
    });
    const watchers = (): string =>
      inside(sbx.sandboxId, 'ps -o args')
        .out.split('\n')
        .filter((l) => l.includes(' watch '))
        .join('\n');

    it('files.watchDir: a write, an overwrite, a new directory (recursive), a remove; stop() ends its watcher', async () => {
      expect(await sbx.files.makeDir('/srv/watched')).toBe(true);
      const seen: string[] = [];
      const h = await sbx.files.watchDir('/srv/watched', (e) => void seen.push(`${e.type} ${e.name}`), {
        recursive: true,
      });
      expect(watchers()).toContain('--recursive -- /srv/watched');
      await sbx.files.write('/srv/watched/a.txt', 'one');
      await sbx.files.write('/srv/watched/a.txt', 'two');
      await sbx.commands.run('mkdir -p /srv/watched/later/deeper && echo x > /srv/watched/later/deeper/f.txt');
      await sbx.files.remove('/srv/watched/a.txt');
      await until('the remove', () => seen.includes('remove a.txt'));
      // a new file: create then write; an overwrite: write (as envd tells them)
      expect(seen.slice(0, 3)).toEqual(['create a.txt', 'write a.txt', 'write a.txt']);
      expect(seen).toEqual(
        expect.arrayContaining(['create later', 'create later/deeper', 'create later/deeper/f.txt']),
      );
      await h.stop();
      await until('no watcher left in the sandbox', () => watchers() === '');
      // a watch of a directory not there is refused
      await expect(sbx.files.watchDir('/srv/none', () => {})).rejects.toThrow(/not found|No such/i);
    });

    it('a kill ends the watches of the sandbox (onExit is called)', async () => {
      const doomed = await Sandbox.create();
      let exited = false;
      await doomed.files.watchDir('/tmp', () => {}, { onExit: () => void (exited = true) });
      await doomed.kill();
      await until('the watch ended', () => exited);
    });

    it.runIf(modern)('the watcher trio: CreateWatcher, GetWatcherEvents, RemoveWatcher', async () => {
      const token = await accessToken(sbx.sandboxId);
      const call = async (method: string, body: unknown): Promise<[number, Json]> => {
        const r = await fetch(`${d.e2bUrl}/filesystem.Filesystem/${method}`, {
          method: 'POST',
          headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': token, 'content-type': 'application/json' },
          body: JSON.stringify(body),
        });
        return [r.status, await r.json()];
      };
      await sbx.files.makeDir('/srv/polled');
      const [made, { watcherId }] = await call('CreateWatcher', { path: '/srv/polled', recursive: false });
      expect(made).toBe(200);
      expect(watcherId).toMatch(/^w/);
      await sbx.commands.run(
        'echo a > /srv/polled/p.txt; chmod 600 /srv/polled/p.txt; mv /srv/polled/p.txt /srv/polled/q.txt',
      );
      const events: Json[] = [];
      await until('the rename polled', async () => {
        const [status, r] = await call('GetWatcherEvents', { watcherId });
        expect(status).toBe(200);
        events.push(...r.events);
        return events.some((e) => e.name === 'q.txt');
      });
      expect(events).toEqual([
        { name: 'p.txt', type: 'EVENT_TYPE_CREATE' },
        { name: 'p.txt', type: 'EVENT_TYPE_WRITE' },
        { name: 'p.txt', type: 'EVENT_TYPE_CHMOD' },
        { name: 'p.txt', type: 'EVENT_TYPE_RENAME' },
        { name: 'q.txt', type: 'EVENT_TYPE_CREATE' },
      ]);
      expect(await call('GetWatcherEvents', { watcherId })).toEqual([200, { events: [] }]);
      expect(await call('RemoveWatcher', { watcherId })).toEqual([200, {}]);
      await until('no watcher left in the sandbox', () => watchers() === '');
      expect((await call('GetWatcherEvents', { watcherId }))[0]).toBe(404);
      expect((await call('CreateWatcher', { path: '/srv/none' }))[0]).toBe(404);
    });
  });

  describe('network', () => {
    /**
     * `snaplab egress ID --json`: the sandbox's egress as snaplab keeps it, or its error code. Not
     * blocking: three CLI runs in a row with spawnSync held the worker past the front's 5 s
     * keep-alive on a loaded host, so the front had closed the SDK's idle connections, and the
     * worker had not yet seen it when the kills went out on them ("other side closed").
     */
    const egressOf = async (id: string): Promise<{ code?: string; allow?: string[]; deny?: string[] }> => {
      const r = await cliAsync(home, ['egress', id, '--json'], 60_000);
      return r.code === 0 ? JSON.parse(r.out) : { code: /EGRESS_OFF/.exec(r.err)?.[0] ?? r.err };
    };

    it('internet access by default, none when refused; allowOut over a denyOut of all traffic is an allow list', async () => {
      const open = await Sandbox.create();
      const closed = await Sandbox.create({ allowInternetAccess: false });
      const some = await Sandbox.create({
        network: { denyOut: [sdk.ALL_TRAFFIC ?? '0.0.0.0/0'], allowOut: ['203.0.113.7', '198.51.100.0/24'] },
      });
      try {
        expect(await egressOf(open.sandboxId)).toMatchObject({ allow: [], deny: [] });
        expect(await egressOf(closed.sandboxId)).toEqual({ code: 'EGRESS_OFF' });
        expect(await egressOf(some.sandboxId)).toMatchObject({ allow: ['203.0.113.7', '198.51.100.0/24'], deny: [] });
        if (modern) {
          const info = await some.getInfo();
          expect(info.network?.allowOut).toEqual(['203.0.113.7', '198.51.100.0/24']);
          expect((await closed.getInfo()).allowInternetAccess).toBe(false);
          // an update replaces the rules (E2B: an allowed entry wins over a denied one)
          await open.updateNetwork({ denyOut: ['198.51.100.0/30'], allowOut: ['198.51.100.1'] });
          expect(await egressOf(open.sandboxId)).toMatchObject({
            allow: [],
            deny: ['198.51.100.2/31', '198.51.100.0'],
          });
        }
      } finally {
        await Promise.all([open.kill(), closed.kill(), some.kill()]);
      }
      // a pool template's standbys have no egress yet: asked for, it is refused, not ignored
      await expect(Sandbox.create('warm', { network: { allowOut: ['203.0.113.7'] } })).rejects.toThrow(/pool/);
    });
  });

  describe('metrics', () => {
    it('getMetrics: the CPUs, memory and disk the sandbox has and uses, sampled when asked', async () => {
      const sbx = await Sandbox.create();
      try {
        const nproc = Number(inside(sbx.sandboxId, 'nproc').out.trim());
        const [first] = await sbx.getMetrics();
        expect(first!.cpuCount).toBe(nproc);
        // getInfo and the list say what the sandbox has, as its metrics do
        const info = await sbx.getInfo();
        expect([info.cpuCount, info.memoryMB]).toEqual([nproc, Math.round(first!.memTotal / 2 ** 20)]);
        const listed = (await Sandbox.list().nextItems()).find((b) => b.sandboxId === sbx.sandboxId);
        expect([listed?.cpuCount, listed?.memoryMB]).toEqual([nproc, info.memoryMB]);
        expect(first!.memUsed).toBeGreaterThan(0);
        expect(first!.memTotal).toBeGreaterThan(first!.memUsed);
        expect(first!.diskUsed).toBeGreaterThan(0);
        expect(first!.diskTotal).toBeGreaterThan(first!.diskUsed);
        expect(Math.abs(first!.timestamp.getTime() - Date.now())).toBeLessThan(10_000);
        // the page cache of it (E2B's memCache; 2.14 does not read it): a file of 32 MiB written and kept
        if (modern) {
          expect(first!.memCache).toBeLessThanOrEqual(first!.memUsed);
          await sbx.commands.run('head -c 33554432 /dev/zero > /tmp/cached');
          const [cached] = await sbx.getMetrics();
          expect(cached!.memCache - first!.memCache).toBeGreaterThan(24 << 20);
          expect(cached!.memCache).toBeLessThanOrEqual(cached!.memUsed);
          await sbx.commands.run('rm /tmp/cached');
        }
        // 48 MiB held by a shell's variable (the shell waits: the last command would replace it)
        const h = await sbx.commands.run('x=$(head -c 50331648 /dev/zero | tr "\\0" a); sleep 600; echo "$x" | wc -c', {
          background: true,
        });
        const held = await until('the memory held to show', async () => {
          const [m] = await Sandbox.getMetrics(sbx.sandboxId);
          return m!.memUsed - first!.memUsed > 40 << 20 && m;
        });
        expect(held.memUsed).toBeLessThan(held.memTotal);
        // a busy loop between two samples shows as CPU used
        await sbx.commands.run('i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done');
        const [busy] = await sbx.getMetrics();
        expect(busy!.cpuUsedPct).toBeGreaterThan(1);
        expect(busy!.cpuUsedPct).toBeLessThanOrEqual(100);
        // a range that ended before now holds no sample (2.14 sends no range)
        if (modern) expect(await sbx.getMetrics({ end: new Date(Date.now() - 3_600_000) })).toEqual([]);
        await h.kill();
      } finally {
        await sbx.kill();
      }
      // (2.14 reads a 404 here as a plain SandboxError)
      const gone = expect(Sandbox.getMetrics(sbx.sandboxId)).rejects;
      await (modern ? gone.toBeInstanceOf(SandboxNotFoundError) : gone.toThrow(/^404: /));
    });
  });

  describe('pause and connect', () => {
    it('pause stops envd traffic; connect resumes the sandbox with its commands, env and files', async () => {
      const sbx = await Sandbox.create({ envs: { KEPT: 'kept-env' } });
      try {
        await sbx.files.write('/tmp/kept.txt', 'kept-file');
        const h = await sbx.commands.run('sleep 4321', { background: true });
        expect(await sbx.pause()).toBe(true);
        expect(await Sandbox.pause(sbx.sandboxId)).toBe(false);
        expect((await sbx.getInfo()).state).toBe('paused');
        const pausedOnes = await Sandbox.list({ query: { state: ['paused'] } }).nextItems();
        expect(pausedOnes.map((x) => x.sandboxId)).toEqual([sbx.sandboxId]);
        expect(await Sandbox.list({ query: { state: ['running'] } }).nextItems()).toEqual([]);
        expect(await sbx.isRunning()).toBe(false);
        const back = await Sandbox.connect(sbx.sandboxId);
        expect((await back.getInfo()).state).toBe('running');
        expect((await back.commands.list()).map((p) => p.pid)).toContain(h.pid);
        expect(inside(sbx.sandboxId, 'ps').out).toContain('sleep 4321');
        expect((await back.commands.run('echo "$KEPT"; cat /tmp/kept.txt')).stdout).toBe('kept-env\nkept-file');
        // the Sandbox object from before the pause still drives it: its access token is the same
        expect((await sbx.commands.run('echo again')).stdout).toBe('again\n');
        expect(await back.commands.kill(h.pid)).toBe(true);
      } finally {
        await sbx.kill();
      }
    });
  });

  describe('lifetimes and clients that leave', () => {
    it('a sandbox past its timeout is killed, or paused with onTimeout pause', async () => {
      const short = await Sandbox.create({ timeoutMs: 2000 });
      const paused = modern ? await Sandbox.create({ timeoutMs: 2000, lifecycle: { onTimeout: 'pause' } }) : undefined;
      try {
        await until('the short one is gone', () => !listed().some((b) => b.id === short.sandboxId), 30_000);
        expect(await short.isRunning()).toBe(false);
        if (paused) {
          await until('the other is paused', async () => (await paused.getInfo()).state === 'paused', 30_000);
          const back = await Sandbox.connect(paused.sandboxId, { timeoutMs: 60_000 });
          expect((await back.commands.run('echo back')).stdout).toBe('back\n');
        }
      } finally {
        await paused?.kill();
        await Sandbox.kill(short.sandboxId);
      }
    });

    // (2.14 takes no `signal` for a command)
    it.runIf(modern)(
      'a client that goes away mid-command leaves the command to its timeout, then nothing',
      async () => {
        const sbx = await Sandbox.create();
        try {
          const gone = new AbortController();
          const run = sbx.commands.run('sleep 2345', { timeoutMs: 3000, signal: gone.signal }).catch((e: unknown) => e);
          await until('the command runs', () => inside(sbx.sandboxId, 'ps').out.includes('sleep 2345'));
          gone.abort();
          expect(await run).toBeInstanceOf(Error);
          expect(inside(sbx.sandboxId, 'ps').out).toContain('sleep 2345');
          await until('it ended at its timeout', () => !inside(sbx.sandboxId, 'ps').out.includes('sleep 2345'), 10_000);
          expect(await sbx.commands.list()).toEqual([]);
        } finally {
          await sbx.kill();
        }
      },
    );
  });

  describe('kill with commands running', () => {
    it('a kill ends the streams of its running commands', async () => {
      const sbx = await Sandbox.create();
      const h = await sbx.commands.run('echo started; sleep 600', { background: true });
      const waiting = h.wait().catch((e: unknown) => e);
      await sbx.kill();
      // the stream is cut, as envd's is with its machine: not a command that failed (exit -1); the
      // newer SDK asks the sandbox's health on a cut, reads 502 and says it ended
      const cut = await waiting;
      expect(cut).toBeInstanceOf(Error);
      expect(cut).not.toBeInstanceOf(CommandExitError);
      if (modern) expect(cut).toBeInstanceOf(TimeoutError);
      expect(listed().some((b) => b.id === sbx.sandboxId)).toBe(false);
    });
  });

  describe('isolation', () => {
    it('a wrong access token is refused, and another key can neither see nor drive the sandbox', async () => {
      const sbx = await Sandbox.create();
      try {
        const headers = { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' };
        const wrong = await fetch(`${d.e2bUrl}/files?path=/etc/passwd`, {
          headers: { ...headers, 'X-Access-Token': 'f'.repeat(48) },
        });
        expect(wrong.status).toBe(401);
        const none = await fetch(`${d.e2bUrl}/files?path=/etc/passwd`, { headers });
        expect(none.status).toBe(401);
        const opts = { apiKey: other };
        await expect(Sandbox.getInfo(sbx.sandboxId, opts)).rejects.toBeInstanceOf(SandboxNotFoundError);
        await expect(Sandbox.connect(sbx.sandboxId, opts)).rejects.toBeInstanceOf(SandboxNotFoundError);
        expect(await Sandbox.kill(sbx.sandboxId, opts)).toBe(false);
        expect(await Sandbox.list(opts).nextItems()).toEqual([]);
        // still there, and its own key still drives it (connect gives the same access token)
        const again = await Sandbox.connect(sbx.sandboxId);
        expect((await again.commands.run('echo still')).stdout).toBe('still\n');
      } finally {
        await sbx.kill();
      }
    });
  });
});

describe("the Python SDK's exchanges, with Python's standard library (test/e2b_protocol.py)", () => {
  const py = (args: string[]) => {
    const r = spawnSync('python3', [join(import.meta.dirname, 'e2b_protocol.py'), ...args], { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`e2b_protocol.py ${args[0]}: ${r.stderr}`);
    return JSON.parse(r.stdout) as Json;
  };

  it('create, Start streamed, multipart upload, read, ListDir, Stat, tokens, a background command signalled, Move, Remove, timeout, list, pause, connect, kill', () => {
    const s = py(['run', d.e2bUrl!, key.trim()]);
    let killed = false;
    try {
      expect(s.create).toBe(201);
      expect(s.envdVersion).toMatch(/^\d+\.\d+\.\d+$/);
      expect(s.run).toMatchObject({
        status: 200,
        contentType: 'application/connect+json',
        first: 'start',
        stdout: 'py-1\n',
        stderr: 'e\n',
        end: { exitCode: 7, exited: true },
        trailer: [2, {}],
      });
      // a command quiet for 2.5 s, keepalives asked every second
      expect(s.quiet.keepalives).toBeGreaterThanOrEqual(2);
      expect(s.quiet.end).toMatchObject({ exitCode: 0 });
      // (the upload is read back by the download below: it was moved and removed since)
      expect(inside(s.sandboxID, 'cat /tmp/py-ran').out).toBe('py-1\n');
      expect(s.upload).toEqual([200, [{ name: 'py.txt', type: 'file', path: '/srv/py.txt' }]]);
      // a watcher of the directory, made before the upload, saw it
      expect(s.makeDir).toBe(200);
      expect(s.createWatcher).toEqual([200, expect.stringMatching(/^w/)]);
      expect(s.watcherEvents).toEqual([
        200,
        {
          events: [
            { name: 'py.txt', type: 'EVENT_TYPE_CREATE' },
            { name: 'py.txt', type: 'EVENT_TYPE_WRITE' },
          ],
        },
      ]);
      expect(s.removeWatcher).toEqual([200, {}]);
      // every field E2B's spec requires of a SandboxMetric (the Python SDK's model reads each)
      expect(s.metrics).toEqual([
        200,
        [
          expect.objectContaining({
            timestamp: expect.any(String),
            timestampUnix: expect.any(Number),
            cpuCount: expect.any(Number),
            cpuUsedPct: expect.any(Number),
            memUsed: expect.any(Number),
            memTotal: expect.any(Number),
            memCache: expect.any(Number),
            diskUsed: expect.any(Number),
            diskTotal: expect.any(Number),
          }),
        ],
      ]);
      expect(s.metrics[1][0].memUsed).toBeGreaterThan(0);
      expect(s.download).toEqual([200, 'written by python']);
      expect(s.listDir).toEqual([200, ['py.txt']]);
      expect(s.statMissing).toEqual([404, { code: 'not_found', message: expect.any(String) }]);
      expect(s.wrongToken).toBe(401);
      expect(s.info[0]).toBe(200);
      expect(s.info[1]).toMatchObject({
        sandboxID: s.sandboxID,
        templateID: 'base',
        clientID: expect.any(String),
        envdVersion: '0.6.4',
        state: 'running',
        metadata: { sdk: 'python' },
      });
      // what the sandbox has, as its metrics say it (the Python SDK's SandboxInfo reads all three)
      const [sample] = s.metrics[1] as { cpuCount: number; memTotal: number; diskTotal: number }[];
      expect(s.info[1]).toMatchObject({
        cpuCount: sample!.cpuCount,
        memoryMB: Math.round(sample!.memTotal / 2 ** 20),
        diskSizeMB: Math.round(sample!.diskTotal / 2 ** 20),
      });
      expect(s.info[1].diskSizeMB).toBeGreaterThan(0);
      expect(s.list).toEqual([200, expect.arrayContaining([s.list[2]]), expect.any(Number)]);
      expect(s.sendSignal).toEqual([200, {}]);
      expect(s.killedEnd).toMatchObject({ exited: false, status: expect.stringMatching(/killed/) });
      expect(s.move).toEqual([
        200,
        { entry: expect.objectContaining({ path: '/srv/moved.txt', type: 'FILE_TYPE_FILE' }) },
      ]);
      expect(s.remove).toEqual([200, 200]);
      expect(inside(s.sandboxID, 'ls /srv').out).toBe('');
      expect(s.setTimeout).toBe(204);
      expect(s.listed).toEqual([200, [s.sandboxID]]);
      expect(s.connectRunning).toEqual([200, true]);
      expect(s.pause).toEqual([204, 409, 409]);
      expect(s.healthPaused).toBe(502);
      expect(s.connectPaused).toEqual([201, true]);
      expect(s.afterResume).toBe('py-1\n');
      expect(listed().find((b) => b.id === s.sandboxID)?.owner).toBe('agent');
      const k = py(['kill', d.e2bUrl!, key.trim(), s.sandboxID, s.token]);
      killed = true;
      expect(k).toEqual({ kill: 204, again: [404, { code: 404, message: expect.any(String) }], health: 502 });
      expect(listed().some((b) => b.id === s.sandboxID)).toBe(false);
    } finally {
      // an assertion that failed above leaves nothing behind either
      if (!killed) py(['kill', d.e2bUrl!, key.trim(), s.sandboxID, s.token]);
    }
  });
});
