import { execFileSync } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { pidAlive } from '../src/host/procs.js';
import type { Lab } from '../src/sdk/lab.js';
import { disposeLab, testLab } from './helpers.js';

let lab: Lab;
let scratch: string;
beforeAll(async () => {
  lab = await testLab();
  scratch = mkdtempSync(join(tmpdir(), 'snaplab-test-img-'));
});
afterAll(async () => {
  await disposeLab(lab);
  rmSync(scratch, { recursive: true, force: true });
});

/** Forget a sandbox the way a crash would: its host objects stay, its record goes. */
function forgetRecord(id: string): void {
  const db = new Database(join(lab.home, 'state.db'));
  db.prepare('DELETE FROM sandboxes WHERE id = ?').run(id);
  db.close();
}

const cgroupDirs = (id: string): string[] =>
  readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter((l) => / - cgroup2? /.test(l))
    .map((l) => `${l.split(' ')[4]}/snaplab/${id}`)
    .filter(existsSync);

describe('gc', () => {
  it.each(['btrfs', 'overlay', 'dir'] as const)(
    'removes the processes, cgroup, mounts and volume of a sandbox whose record is gone (%s)',
    async (storage) => {
      const box = await lab.create({ storage });
      const { id, pid, volume } = box.info;
      box.close();
      forgetRecord(id);
      expect(cgroupDirs(id).length).toBeGreaterThan(0);
      const { removed, trace } = await lab.gc();
      expect(removed.join('\n')).toContain(id);
      expect(cgroupDirs(id)).toEqual([]);
      expect(await pidAlive(pid!)).toBe(false); // gone, or a zombie waiting for the host's init to reap it
      expect(existsSync(volume!.path)).toBe(false);
      expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(volume!.id);
      // what gc did is stored with its trace
      expect(((await lab.trace(trace.id))!.details as { removed: string[] }).removed).toEqual(removed);
    },
  );

  it("leaves a memory snapshot being written alone; removes a crash's leftover once it is old", async () => {
    const dir = join(lab.home, 'snapshots', 'leftover-test');
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'memory'), 'half a stream');
    let r = await lab.gc();
    expect(existsSync(dir)).toBe(true); // just written: a snapshot may be under way
    expect(r.notes.join('\n')).toMatch(/leftover-test not collected: written to in the last/);
    const old = new Date(Date.now() - 10 * 60_000);
    utimesSync(join(dir, 'memory'), old, old);
    utimesSync(dir, old, old);
    r = await lab.gc();
    expect(existsSync(dir)).toBe(false);
    expect(r.removed).toContain(`memory snapshot ${dir}`);
  });

  it('leaves live sandboxes alone', async () => {
    await using box = await lab.create();
    await lab.gc();
    expect((await box.exec(['echo', 'still here'])).stdout.toString()).toBe('still here\n');
  });
});

describe('images', () => {
  function makeTree(dir: string): void {
    mkdirSync(join(dir, 'bin'), { recursive: true });
    execFileSync('cp', ['/bin/busybox', join(dir, 'bin/busybox')]);
    for (const a of ['sh', 'cat', 'true', 'ls']) execFileSync('ln', ['-sf', 'busybox', join(dir, 'bin', a)]);
    writeFileSync(join(dir, 'hello.txt'), 'from the image\n');
  }

  it.each([
    ['directory', ''],
    ['tar', '.tar'],
    ['tar.gz', '.tar.gz'],
    ['tar.zst', '.tar.zst'],
  ])('imports a rootfs from a %s and runs it', async (kind, ext) => {
    const tree = join(scratch, `tree-${kind}`);
    makeTree(tree);
    let source = tree;
    if (ext) {
      source = join(scratch, `rootfs${ext}`);
      const flag = ext === '.tar.gz' ? ['-z'] : ext === '.tar.zst' ? ['--zstd'] : [];
      execFileSync('tar', [...flag, '-cf', source, '-C', tree, '.']);
    }
    const name = `img-${kind.replace('.', '-')}`;
    const img = await lab.importImage(source, name);
    expect(img.sizeBytes).toBeGreaterThan(1_000_000);
    expect((await lab.images()).map((i) => i.name)).toContain(name);
    await using box = await lab.create({ image: name });
    expect((await box.exec(['cat', '/hello.txt'])).stdout.toString()).toBe('from the image\n');
  });

  it("never follows an imported image's symlinks onto the host", async () => {
    const victim = join(scratch, 'victim');
    const victimEtc = join(scratch, 'victim-etc');
    mkdirSync(victim, { mode: 0o700 });
    mkdirSync(victimEtc);
    const tree = join(scratch, 'evil-tree');
    makeTree(tree);
    execFileSync('ln', ['-s', victim, join(tree, 'tmp')]);
    execFileSync('ln', ['-s', victimEtc, join(tree, 'etc')]);
    const tar = join(scratch, 'evil.tar');
    execFileSync('tar', ['-cf', tar, '-C', tree, '.']);
    await lab.importImage(tar, 'evil');
    expect(statSync(victim).mode & 0o7777).toBe(0o700);
    expect(readdirSync(victimEtc)).toEqual([]);
    await lab.removeImage('evil');
  });

  it('refuses a taken name, a missing source, a non-archive; refuses to remove an image in use', async () => {
    await expect(lab.importImage(join(scratch, 'tree-directory'), 'img-directory')).rejects.toMatchObject({
      code: 'IMAGE_EXISTS',
    });
    await expect(lab.importImage(join(scratch, 'nope'), 'x1')).rejects.toMatchObject({ code: 'BAD_INPUT' });
    writeFileSync(join(scratch, 'junk.tar'), 'not a tarball');
    await expect(lab.importImage(join(scratch, 'junk.tar'), 'x2')).rejects.toMatchObject({ code: 'BAD_IMAGE' });
    expect((await lab.images()).map((i) => i.name)).not.toContain('x2');
    await using box = await lab.create({ image: 'img-tar' });
    await expect(lab.removeImage('img-tar')).rejects.toMatchObject({ code: 'IMAGE_IN_USE' });
    await box.destroy();
    await lab.removeImage('img-tar');
    expect((await lab.images()).map((i) => i.name)).not.toContain('img-tar');
  });
});
