import { execFileSync } from 'node:child_process';
import {
  lstatSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Lab } from '../src/sdk/lab.js';
import { SNAPLAB } from './cli-command.js';
import { disposeLab, testLab } from './helpers.js';
import { dockerSave, ociLayout, tar, type Entry } from './image-archives.js';

let lab: Lab;
let scratch: string;
// made when the file loads: the hostile cases name it in their archives
const outside = mkdtempSync(join(tmpdir(), 'snaplab-test-outside-'));
writeFileSync(join(outside, 'victim'), 'untouched\n');
beforeAll(async () => {
  lab = await testLab();
  scratch = mkdtempSync(join(tmpdir(), 'snaplab-test-oci-'));
});
afterAll(async () => {
  await disposeLab(lab);
  rmSync(scratch, { recursive: true, force: true });
  rmSync(outside, { recursive: true, force: true });
});

const busybox = readFileSync('/bin/busybox');
// VFS_CAP_REVISION_2 with the effective bit, permitted = CAP_NET_RAW (13)
const CAP = Buffer.from([0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);

const layer1 = tar([
  { name: 'bin/', type: 'dir' },
  { name: 'bin/busybox', data: busybox, mode: 0o755 },
  ...['sh', 'cat', 'id', 'pwd', 'echo', 'ls', 'env'].map(
    (a): Entry => ({ name: `bin/${a}`, type: 'symlink', link: 'busybox' }),
  ),
  { name: 'etc/', type: 'dir' },
  { name: 'etc/a', data: 'a1\n' },
  { name: 'etc/b', data: 'b1\n' },
  { name: 'etc/passwd', data: 'root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/u:/bin/sh\n' },
  { name: 'etc/group', data: 'root:x:0:\napp:x:1000:\nstaff:x:50:app\n' },
  { name: 'etc/bad-xattr', data: 'x', xattrs: { 'trusted.overlay.opaque': 'y' } },
  { name: 'opt/', type: 'dir' },
  { name: 'opt/keep/', type: 'dir' },
  { name: 'opt/keep/x', data: 'x' },
  { name: 'opt/keep/sub/', type: 'dir' },
  { name: 'opt/keep/sub/y', data: 'y' },
  { name: 'usr/', type: 'dir' },
  { name: 'usr/bin/', type: 'dir' },
  { name: 'usr/bin/pinger', data: 'cap\n', mode: 0o755, xattrs: { 'security.capability': CAP } },
  { name: 'usr/bin/suid', data: 'suid\n', mode: 0o4755 },
  { name: 'home/', type: 'dir' },
  { name: 'home/u/', type: 'dir', uid: 1000, gid: 1000, mode: 0o750 },
  { name: 'home/u/f', data: 'owned\n', uid: 1000, gid: 1000, mtime: 1_600_000_000 },
  { name: 'dev/', type: 'dir' },
  { name: 'dev/fifo', type: 'fifo' },
]);
const layer2 = tar([
  { name: 'etc/', type: 'dir' },
  { name: 'etc/.wh.b' },
  { name: 'etc/.wh.never-was' },
  { name: 'opt/keep/', type: 'dir' },
  // the opaque marker after a file of the same layer: it must stay, the lower ones must go
  { name: 'opt/keep/z', data: 'z' },
  { name: 'opt/keep/.wh..wh..opq' },
  { name: 'usr/bin/hl', type: 'link', link: 'etc/a' },
]);
const config = {
  Env: ['GREETING=hello', 'PATH=/bin'],
  WorkingDir: '/opt/keep',
  User: 'app',
  Entrypoint: ['/bin/sh', '-c'],
  Cmd: ['echo $GREETING from $(pwd) as $(id -u):$(id -g) groups $(id -G)'],
  Labels: { made: 'by-test' },
};

const getfattr = (path: string): string =>
  execFileSync('getfattr', ['--absolute-names', '-d', '-m', '-', '-e', 'hex', path]).toString();

/** Every entry of a tree: type, mode, owner, size or link target (what "the same tree" means here). */
function listing(root: string): string[] {
  const out: string[] = [];
  const walk = (rel: string): void => {
    for (const n of readdirSync(join(root, rel)).sort()) {
      const p = join(root, rel, n);
      const st = lstatSync(p);
      const what = st.isSymbolicLink() ? `-> ${readlinkSync(p)}` : st.isDirectory() ? 'dir' : `${st.size}`;
      out.push(`${join(rel, n)} ${(st.mode & 0o7777).toString(8)} ${st.uid}:${st.gid} ${what}`);
      if (st.isDirectory()) walk(join(rel, n));
    }
  };
  walk('');
  return out;
}

function leftovers(): string[] {
  return readdirSync(join(lab.home, 'images')).filter((d) => d.startsWith('.tmp-'));
}

describe('image import: OCI layouts and docker save', () => {
  let reference: string[];

  it('applies layers as the OCI image spec says (whiteouts, opaque dirs, hard links, xattrs, owners, modes)', async () => {
    const dir = join(scratch, 'layout');
    ociLayout(dir, { layers: [layer1, layer2], compress: 'gzip', config });
    const img = await lab.importImage(dir, 'oci-dir');
    const root = img.path;
    expect(readFileSync(join(root, 'etc/a'), 'utf8')).toBe('a1\n');
    expect(() => lstatSync(join(root, 'etc/b'))).toThrow();
    expect(readdirSync(join(root, 'opt/keep'))).toEqual(['z']);
    expect(statSync(join(root, 'usr/bin/hl')).ino).toBe(statSync(join(root, 'etc/a')).ino);
    expect(getfattr(join(root, 'usr/bin/pinger'))).toContain(`security.capability=0x${CAP.toString('hex')}`);
    expect(getfattr(join(root, 'etc/bad-xattr'))).not.toContain('trusted');
    expect(statSync(join(root, 'usr/bin/suid')).mode & 0o7777).toBe(0o4755);
    const f = statSync(join(root, 'home/u/f'));
    expect([f.uid, f.gid, f.mtimeMs]).toEqual([1000, 1000, 1_600_000_000_000]);
    expect(statSync(join(root, 'home/u')).mode & 0o7777).toBe(0o750);
    expect(() => lstatSync(join(root, 'dev/fifo'))).toThrow();
    expect(img.provenance?.kind).toBe('oci');
    expect(img.provenance?.layers?.map((l) => l.compression)).toEqual(['gzip', 'gzip']);
    expect(img.provenance?.notes.join('\n')).toMatch(/1 device node.*skipped/);
    expect(img.provenance?.notes.join('\n')).toMatch(/1 extended attribute.*dropped/);
    expect(img.config).toMatchObject({
      env: config.Env,
      workingDir: '/opt/keep',
      user: 'app',
      entrypoint: config.Entrypoint,
      cmd: config.Cmd,
      labels: { made: 'by-test' },
    });
    reference = listing(root);
  });

  it("runs the image's Entrypoint and Cmd with its Env, WorkingDir and User when run has no argv", async () => {
    const r = await lab.run([], { image: 'oci-dir' });
    expect(r.stderr.toString()).toBe('');
    expect(r.stdout.toString()).toBe('hello from /opt/keep as 1000:1000 groups 1000 50\n');
    // argv replaces Entrypoint and Cmd; the Env and the user stay; --user overrides
    const own = await lab.run(['/bin/sh', '-c', 'echo $GREETING $(id -u)'], { image: 'oci-dir', user: 'root' });
    expect(own.stdout.toString()).toBe('hello 0\n');
  });

  it.each([
    [
      'docker save, legacy layout',
      (): string => save('legacy.tar', dockerSave({ layers: [layer1, layer2], config, legacy: true })),
    ],
    [
      'docker save, Docker 25+ layout with zstd layers',
      (): string => save('d25.tar', dockerSave({ layers: [layer1, layer2], config, legacy: false, compress: 'zstd' })),
    ],
    [
      'an OCI layout tarball, gzip-compressed as a whole',
      (): string => {
        const dir = join(scratch, 'layout-for-tar');
        ociLayout(dir, { layers: [layer1, layer2], compress: 'none', config });
        const file = join(scratch, 'layout.tar');
        execFileSync('tar', ['-cf', file, '-C', dir, '.']);
        return save('layout.tar.gz', gzipSync(readFileSync(file)));
      },
    ],
  ])('imports %s to the same tree', async (_what, make) => {
    const name = `img-${Math.random().toString(36).slice(2, 8)}`;
    const img = await lab.importImage(make(), name);
    expect(listing(img.path)).toEqual(reference);
    expect(img.config?.cmd).toEqual(config.Cmd);
  });

  it('imports what skopeo writes, as it is: an OCI layout (oci:DIR:TAG) and its docker-archive', async () => {
    const src = save('for-skopeo.tar', dockerSave({ layers: [layer1, layer2], config, legacy: true, tag: 'sk/test' }));
    const layout = join(scratch, 'skopeo-layout');
    execFileSync('skopeo', ['copy', '--quiet', `docker-archive:${src}`, `oci:${layout}:v7`]);
    const fromOci = await lab.importImage(layout, 'skopeo-oci', { tag: 'v7' });
    expect(listing(fromOci.path)).toEqual(reference);
    expect(fromOci.provenance).toMatchObject({ kind: 'oci', ref: 'v7' });
    const archive = join(scratch, 'skopeo-archive.tar');
    execFileSync('skopeo', ['copy', '--quiet', `oci:${layout}:v7`, `docker-archive:${archive}:sk/again:latest`]);
    const fromArchive = await lab.importImage(archive, 'skopeo-archive');
    expect(listing(fromArchive.path)).toEqual(reference);
    expect(fromArchive.config?.cmd).toEqual(config.Cmd);
  });

  it('refuses a blob that does not match its digest, and a layer that does not match its diff_id, leaving nothing', async () => {
    const dir = join(scratch, 'corrupt');
    ociLayout(dir, { layers: [layer1, layer2], compress: 'gzip', config, corruptLayer: 1 });
    await expect(lab.importImage(dir, 'corrupt')).rejects.toMatchObject({
      code: expect.stringMatching(/IMAGE_DIGEST_MISMATCH|BAD_IMAGE/),
      message: expect.stringContaining('layer 2 of 2'),
    });
    // a legacy archive names no blob digests: the diff_ids of its config catch a changed layer
    const other = tar([
      { name: 'etc/', type: 'dir' },
      { name: 'etc/changed', data: 'not what the config says' },
    ]);
    const swapped = dockerSave({ layers: [layer1, other], diffIdsOf: [layer1, layer2], config, legacy: true });
    await expect(lab.importImage(save('diffid.tar', swapped), 'diffid')).rejects.toMatchObject({
      code: 'IMAGE_DIGEST_MISMATCH',
      message: expect.stringMatching(/layer 2 of 2.*the config says/),
    });
    expect((await lab.images()).map((i) => i.name)).not.toContain('corrupt');
    expect((await lab.images()).map((i) => i.name)).not.toContain('diffid');
    expect(leftovers()).toEqual([]);
  });

  it('stops an import at an abort with its reason, leaving no image and no directory', async () => {
    const dir = join(scratch, 'aborted');
    ociLayout(dir, { layers: [layer1, layer2], compress: 'gzip', config });
    const ac = new AbortController();
    const reason = new Error('stop the import');
    const progress: string[] = [];
    const onProgress = (s: string): void => {
      progress.push(s);
      if (s.includes('layer 2 of 2')) ac.abort(reason);
    };
    await expect(lab.importImage(dir, 'aborted', { signal: ac.signal, onProgress })).rejects.toBe(reason);
    expect(progress.length).toBe(2); // the first layer was applied, the second was not begun
    expect((await lab.images()).map((i) => i.name)).not.toContain('aborted');
    expect(leftovers()).toEqual([]);
  });
});

describe('layer semantics at the edges', () => {
  const layered = async (name: string, layers: Entry[][]): Promise<string> => {
    const dir = join(scratch, name);
    ociLayout(dir, { layers: layers.map(tar), compress: 'none' });
    return (await lab.importImage(dir, name)).path;
  };

  it('a hard link to a lower file does not shield it from a whiteout of the same layer', async () => {
    const root = await layered('hl-wh', [
      [
        { name: 'd/', type: 'dir' },
        { name: 'd/f', data: 'lower\n' },
      ],
      [{ name: 'e/', type: 'dir' }, { name: 'e/link', type: 'link', link: 'd/f' }, { name: 'd/.wh.f' }],
    ]);
    expect(() => lstatSync(join(root, 'd/f'))).toThrow();
    expect(readFileSync(join(root, 'e/link'), 'utf8')).toBe('lower\n');
  });

  it('an opaque directory keeps what the layer put below it, whatever the order, also under a parent with no entry of its own', async () => {
    const root = await layered('opq-order', [
      [
        { name: 'd/', type: 'dir' },
        { name: 'd/sub/', type: 'dir' },
        { name: 'd/sub/old', data: 'old' },
        { name: 'd/gone', data: 'x' },
      ],
      [{ name: 'd/sub/new', data: 'new' }, { name: 'd/.wh..wh..opq' }],
    ]);
    expect(readdirSync(join(root, 'd'))).toEqual(['sub']);
    expect(readdirSync(join(root, 'd/sub'))).toEqual(['new']);
  });

  it('a .wh. name is a whiteout whatever its entry type', async () => {
    const root = await layered('wh-dir', [
      [
        { name: 'd/', type: 'dir' },
        { name: 'd/f', data: 'x' },
      ],
      [{ name: 'd/.wh.f', type: 'dir' }],
    ]);
    expect(readdirSync(join(root, 'd'))).toEqual([]);
  });

  it('two pax headers before one entry: the name of the first, the time of the second', async () => {
    const file = save(
      'two-pax.tar',
      tar([
        { name: 'short', data: 'x', pax: true, extraPax: { mtime: '1500000000', comment: 'ZZZZZZZZZZZZZZZZZZZZZZZZ' } },
      ]),
    );
    const img = await lab.importImage(file, 'two-pax');
    expect(
      readdirSync(img.path).filter(
        (n) => !['bin', 'sbin', 'usr', 'etc', 'root', 'tmp', 'proc', 'dev', 'run', 'var', 'home'].includes(n),
      ),
    ).toEqual(['short']);
    expect(statSync(join(img.path, 'short')).mtimeMs).toBe(1_500_000_000_000);
  });

  it('reads a docker save whose members carry their size in pax records (Go writes members past 8 GiB so)', async () => {
    const img = await lab.importImage(
      save('pax-size.tar', dockerSave({ layers: [layer1, layer2], config, legacy: false, paxSizes: true })),
      'pax-size',
    );
    expect(listing(img.path)).toEqual(listing((await lab.images()).find((i) => i.name === 'oci-dir')!.path));
  });

  it('refuses sizes and owners out of range', async () => {
    const huge = tar([
      { name: 'a', type: 'dir', extraPax: { size: '18446744073709551615' } },
      { name: 'hidden', data: 'x' },
    ]);
    await expect(lab.importImage(save('huge.tar', huge), 'huge')).rejects.toMatchObject({
      code: 'BAD_IMAGE',
      message: expect.stringMatching(/size/),
    });
    const neg = tar([{ name: 'a', data: 'x', extraPax: { uid: '-1' } }]);
    await expect(lab.importImage(save('neg.tar', neg), 'neg')).rejects.toMatchObject({
      code: 'BAD_IMAGE',
      message: expect.stringMatching(/uid/),
    });
    const wide = tar([{ name: 'a', data: 'x', extraPax: { uid: '4294967296' } }]);
    await expect(lab.importImage(save('wide.tar', wide), 'wide')).rejects.toMatchObject({ code: 'BAD_IMAGE' });
    expect(leftovers()).toEqual([]);
  });

  it('a numeric --user takes its group and groups from the machine, as Docker does', async () => {
    const r = await lab.run(['/bin/sh', '-c', 'echo $(id -u):$(id -g) $(id -G)'], { image: 'oci-dir', user: '1000' });
    expect(r.stdout.toString()).toBe('1000:1000 1000 50\n');
    const unknown = await lab.run(['/bin/sh', '-c', 'echo $(id -u):$(id -g)'], { image: 'oci-dir', user: '4242' });
    expect(unknown.stdout.toString()).toBe('4242:0\n');
  });
});

function save(name: string, data: Buffer): string {
  const p = join(scratch, name);
  writeFileSync(p, data);
  return p;
}

describe('hostile archives', () => {
  const planted = (): string[] => readdirSync(outside).filter((f) => f !== 'victim');
  const victim = (): string => readFileSync(join(outside, 'victim'), 'utf8');
  const deep = '../'.repeat(24);
  const single =
    (entries: Entry[]): ((n: string) => string) =>
    (n) =>
      save(`${n}.tar`, tar(entries));
  const layered =
    (lower: Entry[], upper: Entry[]): ((n: string) => string) =>
    (n) => {
      const dir = join(scratch, n);
      ociLayout(dir, { layers: [tar(lower), tar(upper)], compress: 'none' });
      return dir;
    };
  const cases: [string, (n: string) => string, RegExp][] = [
    ['an absolute name', single([{ name: join(outside, 'planted'), data: 'x' }]), /absolute/],
    ['a .. name', single([{ name: `${deep}${outside.slice(1)}/planted`, data: 'x' }]), /'\.\.'/],
    [
      'a file written through a symlink of the archive',
      single([
        { name: 'evil', type: 'symlink', link: outside },
        { name: 'evil/planted', data: 'x' },
      ]),
      /symbolic link/,
    ],
    [
      'a symlink named .',
      single([
        { name: '.', type: 'symlink', link: outside },
        { name: 'planted', data: 'x' },
      ]),
      /'\.'/,
    ],
    [
      'a symlink named ./ then written through',
      single([
        { name: './', type: 'symlink', link: outside },
        { name: './planted', data: 'x' },
      ]),
      /'\.'/,
    ],
    [
      'a hard link to an absolute host path',
      single([{ name: 'hl', type: 'link', link: join(outside, 'victim') }]),
      /absolute/,
    ],
    [
      'a hard link out with ..',
      single([{ name: 'hl', type: 'link', link: `${deep}${outside.slice(1)}/victim` }]),
      /'\.\.'/,
    ],
    [
      'a hard link through a symlink',
      single([
        { name: 's', type: 'symlink', link: outside },
        { name: 'hl', type: 'link', link: 's/victim' },
      ]),
      /symbolic link/,
    ],
    ['a name past 4095 bytes', single([{ name: `${'d/'.repeat(2100)}f`, data: 'x', pax: true }]), /longer than/],
    [
      "a layer writing through a lower layer's symlink",
      layered([{ name: 'lnk', type: 'symlink', link: outside }], [{ name: 'lnk/planted', data: 'x' }]),
      /symbolic link/,
    ],
    [
      "a whiteout through a lower layer's symlink",
      layered([{ name: 'lnk', type: 'symlink', link: outside }], [{ name: 'lnk/.wh.victim' }]),
      /symbolic link/,
    ],
    [
      "an opaque marker through a lower layer's symlink",
      layered([{ name: 'lnk', type: 'symlink', link: outside }], [{ name: 'lnk/.wh..wh..opq' }]),
      /symbolic link/,
    ],
    ['a whiteout of ..', layered([{ name: 'etc/', type: 'dir' }], [{ name: 'etc/.wh...' }]), /whiteout/],
  ];
  it.each(cases)('refuses %s, touching nothing outside the tree', async (_what, make, message) => {
    const name = `evil-${Math.random().toString(36).slice(2, 8)}`;
    await expect(lab.importImage(make(name), name)).rejects.toMatchObject({
      code: 'IMAGE_UNSAFE',
      message: expect.stringMatching(message),
    });
    expect(planted()).toEqual([]);
    expect(victim()).toBe('untouched\n');
    expect((await lab.images()).map((i) => i.name)).not.toContain(name);
    expect(leftovers()).toEqual([]);
  });

  it('replaces a symlink by a later entry of its name instead of writing through it', async () => {
    const file = save(
      'replace.tar',
      tar([
        { name: 's', type: 'symlink', link: join(outside, 'victim') },
        { name: 's', data: 'mine\n' },
        { name: 'd', type: 'symlink', link: outside },
        { name: 'd/', type: 'dir' },
        { name: 'd/inside', data: 'in\n' },
      ]),
    );
    const img = await lab.importImage(file, 'replaced');
    expect(readFileSync(join(img.path, 's'), 'utf8')).toBe('mine\n');
    expect(readFileSync(join(img.path, 'd/inside'), 'utf8')).toBe('in\n');
    expect(victim()).toBe('untouched\n');
    expect(planted()).toEqual([]);
  });

  it("reads a compressed rootfs whose first names could be an image archive's once, within --max-size", async () => {
    // "repositories" is a docker save name: the first MiB decides nothing, the archive is decompressed once to look
    const file = save(
      'ambiguous.tar.gz',
      gzipSync(
        tar([
          { name: 'repositories', data: Buffer.alloc(2 << 20, 'r') },
          { name: 'etc/', type: 'dir' },
          { name: 'etc/x', data: 'x' },
        ]),
      ),
    );
    const img = await lab.importImage(file, 'ambiguous', { maxBytes: 3 << 20 });
    expect(img.provenance?.kind).toBe('rootfs');
    expect(readFileSync(join(img.path, 'etc/x'), 'utf8')).toBe('x');
    expect(leftovers()).toEqual([]);
  });

  it('refuses a decompression bomb past --max-size', async () => {
    const bomb = save('bomb.tar.gz', gzipSync(tar([{ name: 'zeros', data: Buffer.alloc(64 << 20) }])));
    expect(statSync(bomb).size).toBeLessThan(1 << 20);
    await expect(lab.importImage(bomb, 'bomb', { maxBytes: 8 << 20 })).rejects.toMatchObject({
      code: 'IMAGE_TOO_LARGE',
    });
    expect(leftovers()).toEqual([]);
  });
});

describe('image commands', () => {
  const cli = (...args: string[]): string =>
    execFileSync(SNAPLAB, args, { env: { ...process.env, SNAPLAB_HOME: lab.home } }).toString();

  it('import --json, ls, inspect, run with no argv, rm refused while used and --force', () => {
    const dir = join(scratch, 'cli-layout');
    ociLayout(dir, { layers: [layer1, layer2], compress: 'zstd', config, tag: 'v1' });
    const rec = JSON.parse(cli('image', 'import', dir, '--name', 'cli-img', '--json')) as {
      name: string;
      provenance: { ref: string; layers: unknown[] };
    };
    expect(rec).toMatchObject({ name: 'cli-img', provenance: { ref: 'v1' } });
    expect(rec.provenance.layers).toHaveLength(2);
    expect(cli('image', 'ls')).toMatch(/cli-img\s+\S+ \S+\s+2\s+oci v1/);
    const text = cli('image', 'inspect', 'cli-img');
    expect(text).toContain('entrypoint: ["/bin/sh","-c"]');
    expect(text).toContain('env:       GREETING=hello');
    expect(cli('run', '--image', 'cli-img')).toBe('hello from /opt/keep as 1000:1000 groups 1000 50\n');
    cli('create', '--image', 'cli-img', '--name', 'uses-it');
    expect(() =>
      execFileSync(SNAPLAB, ['image', 'rm', 'cli-img'], {
        env: { ...process.env, SNAPLAB_HOME: lab.home },
        stdio: 'pipe',
      }),
    ).toThrow(/IMAGE_IN_USE[\s\S]*sandbox uses-it[\s\S]*--force/);
    expect(cli('image', 'rm', 'cli-img', '--force')).toContain('sandbox uses-it');
    expect(cli('ls', '--json')).not.toContain('uses-it');
  });

  it('exec --user runs as a user of the machine', () => {
    cli('image', 'import', join(scratch, 'layout'), '--name', 'users');
    cli('create', '--image', 'users', '--name', 'u1');
    expect(cli('exec', 'u1', '--user', 'app', '--', 'id', '-u')).toBe('1000\n');
    expect(cli('exec', 'u1', '-u', '1000:50', '--', 'id', '-g')).toBe('50\n');
    expect(() =>
      execFileSync(SNAPLAB, ['exec', 'u1', '--user', 'nobody-here', '--', 'true'], {
        env: { ...process.env, SNAPLAB_HOME: lab.home },
        stdio: 'pipe',
      }),
    ).toThrow(/no user "nobody-here"/);
    cli('rm', 'u1');
  });
});
