import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
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
  it('builds bookworm minbase with an extra package; a sandbox of it has the package; the same inputs again are a cache hit', async () => {
    const env = { ...process.env, SNAPLAB_HOME: lab.home };
    const build = (): { name: string; cached: boolean; path: string; seconds: number; stderr: string } => {
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
    const root = first.path;
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
