/**
 * The built-in templates (src/image/templates.ts, docs/e2b.md "Templates"): `base` is built on
 * first use, really (mmdebstrap from the host's apt sources, a minute or two), in a home that has
 * no image of that name: two `snaplab create --image base` at once make one build. Then E2B's own
 * SDK (`e2b`, pinned) against `snaplab serve --e2b-listen` on that home: the default template is
 * that image, and commands run as its user `user`, in /home/user, as under E2B's envd.
 */
import { createHash } from 'node:crypto';
import { mkdtempSync, readdirSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildKey, checkSpec } from '../src/image/debian.js';
import { TEMPLATES } from '../src/image/templates.js';
import { cli, cliAsync, removeHome, startE2bDaemon, type TestDaemon } from './daemon-helpers.js';

let home: string;
const saved = { ...process.env };

beforeAll(() => {
  home = mkdtempSync(join(tmpdir(), 'snaplab-test-templates-'));
});

afterAll(() => {
  if (home) removeHome(home);
  process.env = saved;
});

describe('built-in template base', () => {
  it('is built on first use by `snaplab create --image base`, once for two creates at once, then cached', async () => {
    const [a, b] = await Promise.all([
      cliAsync(home, ['create', '--image', 'base', '--name', 'first'], 900_000),
      cliAsync(home, ['create', '--image', 'base', '--name', 'second'], 900_000),
    ]);
    expect(a.code, a.err).toBe(0);
    expect(b.code, b.err).toBe(0);
    // one of them built it (its steps on stderr); the other waited for that build
    const builds = [a, b].filter((r) => r.err.includes('building image base'));
    expect(builds).toHaveLength(1);
    expect(builds[0]?.err).toMatch(/installing remaining packages/);
    const images = JSON.parse(cli(home, ['image', 'ls', '--json']).out) as { name: string }[];
    expect(images.map((i) => i.name)).toEqual(expect.arrayContaining(['base']));
    // an ordinary image now: building it again is a cache hit
    const again = cli(home, ['image', 'build', 'base', '--json']);
    expect(again.code, again.err).toBe(0);
    expect((JSON.parse(again.out) as { cached: boolean }).cached).toBe(true);
    const passwd = cli(home, ['exec', 'first', '--', 'getent', 'passwd', 'user']);
    expect(passwd.out).toBe('user:x:1000:1000::/home/user:/bin/bash\n');
    const sudoers = cli(home, ['exec', 'second', '--', 'cat', '/etc/sudoers.d/user']);
    expect(sudoers.out).toBe('user ALL=(ALL:ALL) NOPASSWD: ALL\n');
    expect(cli(home, ['rm', 'first', 'second']).code).toBe(0);
  }, 900_000);

  it('a built-in template takes no options that would change it', () => {
    const r = cli(home, ['image', 'build', 'base', '--packages', 'curl']);
    expect(r.code).not.toBe(0);
    expect(r.err).toContain('error[BAD_INPUT]');
    expect(r.err).toMatch(/hint: .*image build debian/);
  });
});

describe('E2B default template on the built base', () => {
  let d: TestDaemon;

  beforeAll(async () => {
    const key = cli(home, ['key', 'create', 'agent', '--e2b']).out.trim();
    d = await startE2bDaemon(home, key);
  }, 120_000);

  afterAll(async () => {
    await d?.stop();
  });

  it('runs commands as user `user` in /home/user with bash, python3, tput and sudo; root when asked', async () => {
    // no internet access: the machine needs no uplink
    const sbx = await Sandbox.create({ allowInternetAccess: false });
    try {
      expect((await sbx.getInfo()).templateId).toBe('base');
      expect((await sbx.commands.run('whoami')).stdout).toBe('user\n');
      expect((await sbx.commands.run('pwd')).stdout).toBe('/home/user\n');
      expect((await sbx.commands.run('echo "$HOME $USER $0"; umask')).stdout).toBe('/home/user user /bin/bash\n0022\n');
      expect((await sbx.commands.run('command -v tput && TERM=xterm tput cols')).stdout).toBe('/usr/bin/tput\n80\n');
      expect((await sbx.commands.run('python3 -c "print(6 * 7)"')).stdout).toBe('42\n');
      // passwordless sudo (its machines are system machines: no no_new_privs on commands)
      expect((await sbx.commands.run('sudo -n true && sudo -n whoami')).stdout).toBe('root\n');
      // a relative path is under the user's home, and the file is the user's
      await sbx.files.write('notes.txt', 'hi');
      expect((await sbx.commands.run('stat -c %U:%n /home/user/notes.txt')).stdout).toBe('user:/home/user/notes.txt\n');
      expect(await sbx.files.read('/home/user/notes.txt')).toBe('hi');
      // as envd: file calls run as root and give what they make to the user, where only root may write
      await sbx.files.write('/opt/app/config.json', '{}');
      expect(await sbx.files.makeDir('/srv/data/cache')).toBe(true);
      expect(
        (await sbx.commands.run('stat -c %U:%G:%n /opt/app /opt/app/config.json /srv/data/cache /opt')).stdout,
      ).toBe('user:user:/opt/app\nuser:user:/opt/app/config.json\nuser:user:/srv/data/cache\nroot:root:/opt\n');
      const listed = await sbx.files.list('/opt');
      expect(listed.map((e) => [e.name, e.owner, e.group])).toEqual([['app', 'user', 'user']]);
      const root = await sbx.commands.run('whoami; pwd', { user: 'root' });
      expect(root.stdout).toBe('root\n/root\n');
    } finally {
      await sbx.kill();
    }
  }, 120_000);

  it("a pool of base (the fast path): its standbys boot the image's systemd too, so sudo works in a taken one", async () => {
    const made = cli(home, ['pool', 'create', 'base', '--image', 'base', '--size', '1']);
    expect(made.code, made.err).toBe(0);
    try {
      const sbx = await Sandbox.create({ allowInternetAccess: false }); // the pool named base: a take
      try {
        expect((await sbx.commands.run('cat /proc/1/comm')).stdout).toBe('systemd\n');
        expect((await sbx.commands.run('sudo -n whoami')).stdout).toBe('root\n');
      } finally {
        await sbx.kill();
      }
    } finally {
      cli(home, ['pool', 'rm', 'base']);
    }
  }, 180_000);
});

describe('recipes', () => {
  it('a user name is checked, and is in the build key only when there is one (the keys of other builds stay)', () => {
    const spec = { suite: 'bookworm', variant: 'minbase', packages: ['python3'] };
    for (const user of ['root', 'Bad', 'a b', "x'; rm -rf /"])
      expect(() => checkSpec({ ...spec, user })).toThrow(expect.objectContaining({ code: 'BAD_INPUT' }));
    const before = createHash('sha256')
      .update(JSON.stringify({ v: 1, suite: 'bookworm', variant: 'minbase', packages: ['python3'], sources: 'S' }))
      .digest('hex');
    expect(buildKey(spec, 'S')).toBe(before);
    expect(buildKey({ ...spec, user: 'user' }, 'S')).not.toBe(before);
    expect(TEMPLATES.map((t) => [t.name, t.spec.user])).toEqual([
      ['base', 'user'],
      ['code-interpreter-v1', 'user'],
    ]);
  });

  it('a first use that cannot build says why, with a hint, and leaves no image', () => {
    // a PATH with node and nothing else: no mmdebstrap
    const h = mkdtempSync(join(tmpdir(), 'snaplab-test-templates-fail-'));
    const bin = mkdtempSync(join(tmpdir(), 'snaplab-test-templates-bin-'));
    try {
      symlinkSync(process.execPath, join(bin, 'node'));
      const r = cli(h, ['prepare', '--image', 'base'], undefined, { PATH: bin });
      expect(r.code).not.toBe(0);
      expect(r.err).toContain('building image base');
      expect(r.err).toContain('error[MISSING_TOOL]: building Debian images needs mmdebstrap');
      expect(r.err).toContain('hint: apt-get install mmdebstrap');
      expect(readdirSync(join(h, 'images')).filter((f) => f !== '.logs')).toEqual([]);
    } finally {
      removeHome(h);
      rmSync(bin, { recursive: true, force: true });
    }
  });
});
