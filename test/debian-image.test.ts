import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import type { Lab } from '../src/sdk/lab.js';
import { SNAPLAB } from './cli-command.js';
import { disposeLab, testLab } from './helpers.js';

// The one test that uses the network: Debian's archive, from this host's own apt sources.
let lab: Lab;
beforeAll(async () => {
  lab = await testLab();
});
afterAll(async () => {
  await disposeLab(lab);
});

describe('image build debian (mmdebstrap)', () => {
  it('builds bookworm minbase with an extra package, fetching only what the package cache lacks and keeping what it fetched; a sandbox of it has the package; the same inputs again are a cache hit', async () => {
    // a package cache of this test's own, holding hello alone (downloaded with the host's apt)
    const cache = mkdtempSync(join(tmpdir(), 'snaplab-test-packages-'));
    onTestFinished(() => rmSync(cache, { recursive: true, force: true }));
    const debs = join(cache, 'bookworm');
    mkdirSync(debs);
    execFileSync('apt-get', ['download', 'hello'], { cwd: debs, stdio: 'ignore' });
    const seeded = readdirSync(debs);
    expect(seeded).toEqual([expect.stringMatching(/^hello_.*\.deb$/)]);
    const env = { ...process.env, SNAPLAB_HOME: lab.home, SNAPLAB_PACKAGE_CACHE: cache };
    const build = (): { name: string; cached: boolean; path: string; log?: string } => {
      const out = execFileSync(
        SNAPLAB,
        [
          'image',
          'build',
          'debian',
          '--suite',
          'bookworm',
          '--variant',
          'minbase',
          '--packages',
          'hello',
          '--name',
          'deb-hello',
          '--json',
        ],
        { env, stdio: ['ignore', 'pipe', 'pipe'] },
      );
      return JSON.parse(out.toString());
    };
    const first = build();
    expect(first).toMatchObject({ name: 'deb-hello', cached: false });
    // apt took hello from the cache and fetched the rest; the rest is kept for the next build
    const fetched = readFileSync(first.log!, 'utf8')
      .split('\n')
      .filter((l) => /^Get:\d+ \S+ \S+ amd64 \S+ (amd64|all) /.test(l))
      .map((l) => l.split(' ')[4]);
    expect(fetched).toContain('libc6');
    expect(fetched).not.toContain('hello');
    const kept = readdirSync(debs);
    expect(kept.filter((f) => f.startsWith('libc6_'))).toHaveLength(1);
    expect(kept.length).toBeGreaterThan(fetched.length); // hello, and what was fetched
    expect(readdirSync(cache)).toEqual(['bookworm']); // the build's own directory went
    const root = first.path;
    expect(readdirSync(join(root, 'var/cache/apt/archives')).filter((f) => f.endsWith('.deb'))).toEqual([]);
    expect(readFileSync(join(root, 'etc/machine-id'), 'utf8')).toBe('');
    expect(readFileSync(join(root, 'etc/hostname'), 'utf8')).toBe('deb-hello\n');
    expect(existsSync(join(root, 'etc/resolv.conf'))).toBe(false);
    expect(readdirSync(join(root, 'var/lib/apt/lists')).some((f) => f.endsWith('_Packages'))).toBe(true);
    await using box = await lab.create({ image: 'deb-hello' });
    expect((await box.exec(['cat', '/etc/debian_version'])).stdout.toString()).toMatch(/^12\./);
    const dpkg = await box.exec(['dpkg', '-s', 'hello']);
    expect(dpkg.stdout.toString()).toContain('Status: install ok installed');
    expect((await box.exec(['hello'])).stdout.toString()).toBe('Hello, world!\n');
    const again = build();
    expect(again).toMatchObject({ name: 'deb-hello', cached: true });
    const img = (await lab.images()).find((i) => i.name === 'deb-hello');
    expect(img?.provenance).toMatchObject({
      kind: 'debian',
      build: { suite: 'bookworm', variant: 'minbase', packages: ['hello'] },
    });
  }, 600_000);

  it("a scenario that says how its image is made finds the one built (by name, and a machine's own by its inputs): `up` downloads nothing", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'snaplab-test-scn-image-'));
    try {
      writeFileSync(join(dir, 'packages'), 'hello\n');
      writeFileSync(
        join(dir, 'scenario.yaml'),
        [
          'machines:',
          '  named:',
          '    image: { name: deb-hello, debian: { packages: ./packages } }',
          '  unnamed:',
          '    image: { debian: { suite: bookworm, variant: minbase, packages: [hello] } }',
          '',
        ].join('\n'),
      );
      const before = (await lab.images()).length;
      const progress: string[] = [];
      let unnamed = '';
      const scn = await lab.up(join(dir, 'scenario.yaml'), {
        name: 'imgscn',
        onProgress: (m, s) => progress.push(`${m}: ${s}`),
      });
      try {
        expect(progress.some((p) => /^named: image: building deb-hello from Debian bookworm/.test(p))).toBe(true);
        // the named one is the image built above; the other a copy of it under a name of its inputs, no download
        unnamed = scn.spec.machines.find((m) => m.name === 'unnamed')!.image;
        expect(scn.spec.machines.find((m) => m.name === 'named')!.image).toBe('deb-hello');
        expect(unnamed).not.toBe('deb-hello');
        const copy = (await lab.images()).find((i) => i.name === unnamed);
        expect(copy?.provenance?.notes).toContain('a copy of deb-hello, built from the same inputs');
        expect((await lab.images()).length).toBe(before + 1);
        for (const m of ['named', 'unnamed'])
          expect((await (await scn.machine(m)).exec(['hello'])).stdout.toString()).toBe('Hello, world!\n');
      } finally {
        await scn.down();
        if (unnamed) await lab.removeImage(unnamed);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 600_000);

  it('says when the mirror cannot be reached, with the log kept, and leaves no image', async () => {
    // port 9 of loopback: nothing listens (the only address a test may use)
    await expect(
      lab.buildImage(
        { suite: 'bookworm', variant: 'minbase', packages: [], mirror: 'http://127.0.0.1:9/debian' },
        { name: 'unreachable' },
      ),
    ).rejects.toMatchObject({
      code: 'IMAGE_BUILD_FAILED',
      message: expect.stringContaining('cannot be reached'),
      hint: expect.stringContaining('full log:'),
    });
    expect((await lab.images()).map((i) => i.name)).not.toContain('unreachable');
    expect(readdirSync(join(lab.home, 'images')).filter((d) => d.startsWith('.tmp-'))).toEqual([]);
  }, 120_000);

  it('refuses bad inputs before building anything', async () => {
    await expect(lab.buildImage({ suite: 'bookworm; rm', variant: 'minbase', packages: [] })).rejects.toMatchObject({
      code: 'BAD_INPUT',
    });
    await expect(lab.buildImage({ suite: 'bookworm', variant: 'tiny', packages: [] })).rejects.toMatchObject({
      code: 'BAD_INPUT',
    });
    await expect(
      lab.buildImage({ suite: 'bookworm', variant: 'minbase', packages: ['Bad_Name'] }),
    ).rejects.toMatchObject({ code: 'BAD_INPUT' });
  });
});
