import { randomBytes } from 'node:crypto';
import {
  chmod,
  chown,
  lstat,
  mkdir,
  mkdtemp,
  readdir,
  readFile,
  readlink,
  rm,
  symlink,
  unlink,
  writeFile,
} from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HostOpError, HostOps } from '../host/hostops.js';
import { run } from '../host/run.js';
import type { StorageBackend, StorageKind, Volume } from './backend.js';
import { loopsOf, unmountPool } from './btrfs/pool.js';
import { createBackend } from './index.js';
import { readMounts, unmountAll } from './mounts.js';
import { MAX_LAYERS } from './overlay/layers.js';

/** A tree as comparable data: path → type, mode, owner, and content or link target. */
async function listing(root: string, rel = ''): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const name of (await readdir(join(root, rel))).sort()) {
    const p = join(rel, name);
    const st = await lstat(join(root, p));
    const head = `${(st.mode & 0o170000).toString(8)} ${(st.mode & 0o7777).toString(8)} ${st.uid}:${st.gid}`;
    if (st.isSymbolicLink()) out[p] = `${head} -> ${await readlink(join(root, p))}`;
    else if (st.isDirectory()) {
      out[p] = head;
      Object.assign(out, await listing(root, p));
    } else out[p] = `${head} ${await readFile(join(root, p), 'utf8')}`;
  }
  return out;
}

const mountsBelow = async (dir: string) =>
  (await readMounts()).filter((m) => m.target === dir || m.target.startsWith(`${dir}/`));
const gone = (p: string) =>
  lstat(p).then(
    () => false,
    () => true,
  );

async function makeImageSrc(dir: string): Promise<void> {
  await mkdir(join(dir, 'sub', 'deep'), { recursive: true });
  await mkdir(join(dir, 'bin'));
  await writeFile(join(dir, 'hello.txt'), 'hello\n');
  await writeFile(join(dir, 'data.txt'), 'x'.repeat(64 << 10)); // tiny files are inline on btrfs
  await writeFile(join(dir, 'mod.txt'), 'original\n');
  await writeFile(join(dir, 'gone.txt'), 'delete me\n');
  await writeFile(join(dir, 'sub', 'deep', 'old.txt'), 'old\n');
  await symlink('hello.txt', join(dir, 'link'));
  await writeFile(join(dir, 'bin', 'tool'), '#!/bin/sh\necho tool\n');
  await chmod(join(dir, 'bin', 'tool'), 0o755);
  await chown(join(dir, 'bin', 'tool'), 1000, 1000);
}

/** Makes the home directory inside `top`; the default is a plain directory on the host's fs. */
type HomeMaker = (top: string) => Promise<string>;
const plainHome: HomeMaker = async (top) => {
  await mkdir(join(top, 'home'));
  return join(top, 'home');
};
/** A home that is itself on btrfs, so the btrfs backend uses it directly with no pool. */
const btrfsHome: HomeMaker = async (top) => {
  const img = join(top, 'fs.img');
  await run('truncate', ['-s', '1G', img]);
  await run('mkfs.btrfs', ['-q', img]);
  await mkdir(join(top, 'home'));
  await run('mount', ['-o', 'loop', img, join(top, 'home')]);
  return join(top, 'home');
};

function contractSuite(kind: StorageKind, factory: (home: string) => StorageBackend, makeHome: HomeMaker = plainHome) {
  let top: string;
  let home: string;
  let b: StorageBackend;
  let image: Volume;
  const live = new Map<string, Volume>();
  const keep = (v: Volume) => {
    live.set(v.id, v);
    return v;
  };
  const drop = async (v: Volume, backend = b) => {
    await backend.delete(v);
    return live.delete(v.id);
  };

  beforeAll(async () => {
    top = await mkdtemp(join(tmpdir(), `snaplab-test-${kind}-`));
    home = await makeHome(top);
    process.env.SNAPLAB_BTRFS_SIZE = '1G';
    b = factory(home);
    await b.init();
    await makeImageSrc(join(top, 'src'));
  });

  afterAll(async () => {
    await b.gc(new Set());
    if (kind === 'btrfs') await unmountPool(home);
    await unmountAll(top);
    for (const img of [join(home, 'btrfs.img'), join(top, 'fs.img')]) {
      for (const d of await loopsOf(img)) await run('losetup', ['-d', d], { allowFail: true });
    }
    await rm(top, { recursive: true, force: true });
    expect(await mountsBelow(top)).toEqual([]);
  });

  it('probes ok on this host', async () => {
    const a = await b.probe();
    expect(a.ok, a.reason).toBe(true);
  });

  it('imports an image with the same tree, read-only', async () => {
    image = keep(await b.importImage(join(top, 'src'), 'test-image'));
    expect(image).toMatchObject({ kind, readOnly: true });
    expect(image.id).toMatch(/^[0-9a-f]{12}$/);
    expect(image.path.startsWith(home)).toBe(true);
    expect(await listing(image.path)).toEqual(await listing(join(top, 'src')));
    expect(JSON.parse(JSON.stringify(image))).toEqual(image);
  });

  it('clones are writable and independent of their base', async () => {
    const c = keep(await b.clone(image));
    expect(c.readOnly).toBe(false);
    await writeFile(join(c.path, 'new.txt'), 'new\n');
    await writeFile(join(c.path, 'hello.txt'), 'changed\n');
    expect(await readFile(join(image.path, 'hello.txt'), 'utf8')).toBe('hello\n');
    expect(await gone(join(image.path, 'new.txt'))).toBe(true);
    const c2 = keep(await b.clone(image));
    expect(await readFile(join(c2.path, 'hello.txt'), 'utf8')).toBe('hello\n');
    await drop(c2);
    await drop(c);
  });

  it('change marker: different after any write (or null: cannot tell); stable under reads on noatime', async () => {
    const c = keep(await b.clone(image));
    const m0 = await b.changeMarker(c);
    if (m0 === null) {
      expect(b.kind).toBe('dir'); // the only backend with no cheap change record
      await drop(c);
      return;
    }
    await readFile(join(c.path, 'hello.txt'), 'utf8');
    // a read may update atime (a change on disk) unless the filesystem is mounted noatime
    const under = (await readMounts()).filter((m) => c.path === m.target || c.path.startsWith(`${m.target}/`)).pop();
    if (b.kind === 'overlay' || under?.options.split(',').includes('noatime')) expect(await b.changeMarker(c)).toBe(m0);
    const before = await b.changeMarker(c);
    await writeFile(join(c.path, 'sub-new.txt'), 'x');
    expect(await b.changeMarker(c)).not.toBe(before);
    const c2 = keep(await b.clone(image));
    const before2 = await b.changeMarker(c2);
    await rm(join(c2.path, 'hello.txt')); // deleting a file of the base is a change too
    expect(await b.changeMarker(c2)).not.toBe(before2);
    await drop(c2);
    await drop(c);
  });

  it('snapshots keep their point in time; clones of them show deletes and changes', async () => {
    const c = keep(await b.clone(image));
    await unlink(join(c.path, 'gone.txt'));
    await writeFile(join(c.path, 'mod.txt'), 'modified\n');
    await rm(join(c.path, 'sub'), { recursive: true }); // a deleted dir made again: opaque
    await mkdir(join(c.path, 'sub'));
    await writeFile(join(c.path, 'sub', 'fresh.txt'), 'fresh\n');
    const s = keep(await b.snapshot(c));
    expect(s.readOnly).toBe(true);
    await writeFile(join(c.path, 'later.txt'), 'later\n');
    await writeFile(join(c.path, 'mod.txt'), 'modified again\n');
    expect(await gone(join(s.path, 'later.txt'))).toBe(true);
    expect(await readFile(join(s.path, 'mod.txt'), 'utf8')).toBe('modified\n');

    const c2 = keep(await b.clone(s));
    expect(await gone(join(c2.path, 'gone.txt'))).toBe(true);
    expect(await gone(join(c2.path, 'later.txt'))).toBe(true);
    expect(await readFile(join(c2.path, 'mod.txt'), 'utf8')).toBe('modified\n');
    expect(await readdir(join(c2.path, 'sub'))).toEqual(['fresh.txt']);
    expect(await readFile(join(c2.path, 'link'), 'utf8')).toBe('hello\n');
    // a snapshot of a snapshot, and a clone of that
    const s2 = keep(await b.snapshot(s));
    const c3 = keep(await b.clone(s2));
    expect(await listing(c3.path)).toEqual(await listing(s.path));

    if (kind === 'overlay') {
      await expect(b.delete(s)).rejects.toThrow(/still stacked/);
      await expect(b.delete(image)).rejects.toThrow(/still stacked/);
    }
    for (const v of [c3, s2, c2, s, c]) await drop(v);
  });

  it('refuses writes to images and snapshots', async () => {
    const c = keep(await b.clone(image));
    const s = keep(await b.snapshot(c));
    for (const v of [image, s]) {
      await expect(writeFile(join(v.path, 'x'), 'x')).rejects.toThrow(/EROFS|EACCES|EPERM/);
      await expect(unlink(join(v.path, 'hello.txt'))).rejects.toThrow(/EROFS|EACCES|EPERM/);
    }
    await drop(s);
    await drop(c);
  });

  it('reports usage: a 1 MiB new file is exclusive to its clone', async () => {
    const c = keep(await b.clone(image));
    await writeFile(join(c.path, 'big.bin'), randomBytes(1 << 20));
    const u = await b.usage(c);
    expect(u.exclusiveBytes).toBeGreaterThanOrEqual(1 << 20);
    expect(u.exclusiveBytes).toBeLessThan(64 << 20);
    expect(u.sharedBytes).toBeGreaterThanOrEqual(0);
    const ui = await b.usage(image);
    expect(ui.exclusiveBytes + ui.sharedBytes).toBeGreaterThan(0);
    await drop(c);
  });

  it('deletes everything, mounts included, and twice is fine', async () => {
    const c = keep(await b.clone(image));
    const s = keep(await b.snapshot(c));
    for (const v of [s, c]) {
      await drop(v);
      expect(await gone(v.path)).toBe(true);
      expect(await mountsBelow(v.path)).toEqual([]);
      await b.delete(v);
    }
    expect((await readMounts()).some((m) => m.target.includes(c.id) || m.target.includes(s.id))).toBe(false);
  });

  it('gc removes volumes that are not live and keeps live ones', async () => {
    const a = keep(await b.clone(image));
    const dead = await b.clone(image);
    const removed = await b.gc(new Set(live.keys()));
    expect(removed.join('\n')).toContain(dead.id);
    expect(removed.join('\n')).not.toContain(a.id);
    expect(await gone(dead.path)).toBe(true);
    expect(await mountsBelow(dead.path)).toEqual([]);
    expect(await readFile(join(a.path, 'hello.txt'), 'utf8')).toBe('hello\n');
    expect(await readFile(join(image.path, 'hello.txt'), 'utf8')).toBe('hello\n');
    await drop(a);
  });

  it('another backend object (another process) works from the Volume record alone', async () => {
    const c = keep(await b.clone(image));
    await writeFile(join(c.path, 'mine.txt'), 'mine\n');
    const other = factory(home);
    await other.init();
    const record = (v: Volume): Volume => JSON.parse(JSON.stringify(v)) as Volume;
    const s = keep(await other.snapshot(record(c)));
    const c2 = keep(await other.clone(record(s)));
    expect(await readFile(join(c2.path, 'mine.txt'), 'utf8')).toBe('mine\n');
    expect((await other.usage(record(c2))).exclusiveBytes).toBeGreaterThanOrEqual(0);
    await drop(record(c2), other);
    await drop(record(s), other);
    await drop(record(c), other);
    expect(await gone(c.path)).toBe(true);
  });

  if (kind === 'overlay') {
    it('gc keeps a dead snapshot whose layer a live clone stacks', async () => {
      const c = keep(await b.clone(image));
      const s = await b.snapshot(c);
      const c2 = keep(await b.clone(s));
      await b.gc(new Set(live.keys()));
      expect(await readFile(join(c2.path, 'hello.txt'), 'utf8')).toBe('hello\n');
      await drop(c2);
      const removed = await b.gc(new Set(live.keys()));
      expect(removed.join('\n')).toContain(s.id);
      await drop(c);
    });
  }

  if (kind === 'overlay') {
    it('refuses to clone a writable volume and flattens deep snapshot chains', async () => {
      const first = keep(await b.clone(image));
      await expect(b.clone(first)).rejects.toThrow(/writable/);
      let c = first;
      const made: Volume[] = [];
      for (let i = 0; i < MAX_LAYERS + 2; i++) {
        await writeFile(join(c.path, `gen${i}`), `${i}\n`);
        if (i === 3) await unlink(join(c.path, 'gone.txt'));
        const s = keep(await b.snapshot(c));
        expect((s.ref.layers as string[]).length).toBeLessThanOrEqual(MAX_LAYERS);
        c = keep(await b.clone(s));
        made.push(s, c);
      }
      expect(await readFile(join(c.path, `gen${MAX_LAYERS + 1}`), 'utf8')).toBe(`${MAX_LAYERS + 1}\n`);
      expect(await readFile(join(c.path, 'gen0'), 'utf8')).toBe('0\n');
      expect(await gone(join(c.path, 'gone.txt'))).toBe(true);
      for (const v of made.reverse()) await drop(v);
      await drop(first);
    });
  }

  if (kind === 'btrfs' && makeHome === plainHome) {
    it('keeps its pool on a loop file that unmountPool detaches and init remounts', async () => {
      const img = join(home, 'btrfs.img');
      const pool = join(home, 'btrfs');
      expect((await loopsOf(img)).length).toBe(1);
      expect((await readMounts()).find((m) => m.target === pool)?.fstype).toBe('btrfs');
      const done = await unmountPool(home);
      expect(done.join('\n')).toContain(pool);
      expect(await loopsOf(img)).toEqual([]);
      expect(await mountsBelow(pool)).toEqual([]);
      await b.init();
      await b.init(); // idempotent
      expect((await readMounts()).filter((m) => m.target === pool).length).toBe(1);
      expect(await readFile(join(image.path, 'hello.txt'), 'utf8')).toBe('hello\n');
      // two processes racing to init the same home end with one mount
      await unmountPool(home);
      await Promise.all([factory(home).init(), factory(home).init(), factory(home).init()]);
      expect((await readMounts()).filter((m) => m.target === pool).length).toBe(1);
      expect((await loopsOf(img)).length).toBe(1);
    });
  }

  if (kind === 'btrfs') {
    it('clones made together are staged in directories of their own, then moved into place', async () => {
      const volumes = dirname(image.path);
      const made = await Promise.all(Array.from({ length: 6 }, async () => keep(await b.clone(image))));
      for (const v of made) {
        expect(v.path).toBe(join(volumes, v.id));
        expect(await readFile(join(v.path, 'hello.txt'), 'utf8')).toBe('hello\n');
      }
      const stages = (await readdir(volumes)).filter((n) => n.startsWith('.stage-'));
      expect(stages.length).toBeGreaterThan(1);
      for (const stage of stages) expect(await readdir(join(volumes, stage))).toEqual([]);
      for (const v of made) await drop(v);
    });

    it('gc deletes a snapshot an interrupted clone left staged', async () => {
      const volumes = dirname(image.path);
      const left = join(volumes, '.stage-9', randomBytes(6).toString('hex'));
      await mkdir(dirname(left), { recursive: true });
      await run('btrfs', ['subvolume', 'snapshot', image.path, left]);
      const removed = await b.gc(new Set(live.keys()));
      expect(removed.join('\n')).toContain(`left staged by an interrupted clone (${left})`);
      expect(await gone(left)).toBe(true);
      expect(await readFile(join(image.path, 'hello.txt'), 'utf8')).toBe('hello\n');
    });

    it('a staged snapshot that cannot be moved into place is deleted, and the error says why', async () => {
      const volumes = dirname(image.path);
      const dst = join(volumes, randomBytes(6).toString('hex'));
      await mkdir(join(dst, 'taken'), { recursive: true });
      const stage = join(volumes, '.stage-10');
      const err = await HostOps.require()
        .request('btrfs-clone', image.path, dst, stage)
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(HostOpError);
      expect((err as HostOpError).errno).toBe(17); // EEXIST
      expect((err as HostOpError).message).toMatch(/move the staged snapshot into place/);
      expect(await readdir(stage)).toEqual([]);
      expect(await readdir(dst)).toEqual(['taken']);
      await rm(dst, { recursive: true });
    });
  }

  it('init() restores the mounts a reboot takes away', async () => {
    const c = keep(await b.clone(image));
    await writeFile(join(c.path, 'kept.txt'), 'kept\n');
    const s = keep(await b.snapshot(c));
    if (kind === 'btrfs' && makeHome === plainHome) await unmountPool(home);
    else await unmountAll(join(home, 'storage'));
    await factory(home).init();
    expect(await readFile(join(c.path, 'kept.txt'), 'utf8')).toBe('kept\n');
    await writeFile(join(c.path, 'after.txt'), 'after\n');
    expect(await readFile(join(s.path, 'kept.txt'), 'utf8')).toBe('kept\n');
    await expect(writeFile(join(s.path, 'x'), 'x')).rejects.toThrow(/EROFS|EACCES|EPERM/);
    await expect(writeFile(join(image.path, 'x'), 'x')).rejects.toThrow(/EROFS|EACCES|EPERM/);
    await drop(s);
    await drop(c);
  });

  it('deletes its image last', async () => {
    await drop(image);
    expect(await gone(image.path)).toBe(true);
    await b.delete(image);
  });
}

const kinds: StorageKind[] = ['dir', 'overlay', 'btrfs'];
describe.each(kinds)('storage contract: %s', { timeout: 60_000 }, (kind) => {
  contractSuite(kind, (home) => createBackend(kind, home));
});

// biome-ignore lint/suspicious/noTemplateCurlyInString: the title names the variable, it is not a template
describe('storage contract: btrfs with ${home} on btrfs (no pool)', { timeout: 60_000 }, () => {
  contractSuite('btrfs', (home) => createBackend('btrfs', home), btrfsHome);
});
