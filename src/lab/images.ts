import { existsSync } from 'node:fs';
import { chmod, lstat, mkdir, readdir, readlink, rename, symlink, writeFile, copyFile } from 'node:fs/promises';
import { pidAlive } from '../host/procs.js';
import { removeTree } from '../storage/tree.js';
import { join, relative, resolve } from 'node:path';
import { BUILTIN_IMAGE } from '../defaults.js';
import { SnaplabError } from '../errors.js';
import { isDynamicElf } from '../host/elf.js';
import { run, which } from '../host/run.js';
import type { Store } from '../store/store.js';
import type { ImageRecord } from '../store/records.js';
import type { Imported, ImportOptions, Provenance } from '../image/import.js';
import { checkName, newId } from './names.js';
import { noted, orElse } from '../cleanup.js';

/** Directories every image gets, so that the sandbox's mounts never have to write into it. */
const SKELETON = [
  'bin',
  'sbin',
  'usr',
  'usr/bin',
  'usr/sbin',
  'etc',
  'root',
  'tmp',
  'proc',
  'dev',
  'run',
  'var',
  'var/tmp',
  'home',
];

/**
 * Add what is missing of the skeleton without ever following a symlink of the image: an
 * imported tree is untrusted, and `tmp -> /etc` followed on the host would make the host's /etc
 * world-writable. A path that is a symlink (or under one) is left as the image has it.
 */
export async function skeleton(root: string): Promise<void> {
  const isDir = async (rel: string): Promise<boolean> => {
    const st = await lstat(join(root, rel)).catch(orElse(undefined, `lstat ${join(root, rel)}`, 'ENOENT', 'ENOTDIR'));
    return st?.isDirectory() === true;
  };
  for (const d of SKELETON) {
    const parent = d.includes('/') ? d.slice(0, d.lastIndexOf('/')) : '';
    if (parent && !(await isDir(parent))) continue; // missing, or a symlink: do not go through it
    await mkdir(join(root, d)).catch((e: NodeJS.ErrnoException) => {
      if (e.code !== 'EEXIST') throw e;
    });
  }
  if (await isDir('tmp')) await chmod(join(root, 'tmp'), 0o1777);
  if (!(await isDir('etc'))) return;
  // O_CREAT|O_EXCL ('wx') never follows a symlink in the last component, and never overwrites
  const etc = (f: string, text: string): Promise<void> =>
    writeFile(join(root, 'etc', f), text, { flag: 'wx' }).catch((e: NodeJS.ErrnoException) => {
      if (e.code !== 'EEXIST') throw e;
    });
  await etc('passwd', 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n');
  await etc('group', 'root:x:0:\nnogroup:x:65534:\n');
  await etc('hosts', '127.0.0.1\tlocalhost\n::1\tlocalhost\n');
}

async function sizeOf(dir: string): Promise<number> {
  const r = await run('du', ['-sb', dir]);
  return Number(r.stdout.split(/\s/)[0]);
}

/**
 * The image's own init, when it is systemd: /sbin/init (or /usr/sbin/init) a link whose target is
 * named systemd. Read as strings, never followed (the tree is untrusted and a link may point at
 * the host's files). `create` boots it unless told `--init agent`.
 */
async function initOf(root: string): Promise<'systemd' | undefined> {
  for (const rel of ['usr/sbin/init', 'sbin/init']) {
    // a parent that is a link (sbin -> usr/sbin, or one pointing at the host) is not gone through
    const parents = rel
      .split('/')
      .slice(0, -1)
      .map((_, i, a) => a.slice(0, i + 1).join('/'));
    if (
      (
        await Promise.all(
          parents.map((p) =>
            lstat(join(root, p)).then(
              (st) => st.isDirectory(),
              () => false,
            ),
          ),
        )
      ).includes(false)
    )
      continue;
    const target = await readlink(join(root, rel)).catch(
      orElse(undefined, `readlink ${join(root, rel)}`, 'ENOENT', 'EINVAL', 'ENOTDIR'),
    );
    if (target && /(^|\/)systemd$/.test(target)) return 'systemd';
  }
  return undefined;
}

/** Image trees live in `${home}/images/<name>/rootfs`; storage backends import from there. */
export class Images {
  private building: Promise<ImageRecord> | undefined;

  constructor(
    private readonly home: string,
    private readonly store: Store,
  ) {}

  private dir(name: string): string {
    return join(this.home, 'images', name);
  }

  /** The image record, building the built-in busybox image on first use. */
  async resolve(name: string): Promise<ImageRecord> {
    const found = this.store.getImage(name);
    if (found) return found;
    if (name === BUILTIN_IMAGE) {
      // several machines of a scenario may ask at once: build it once
      this.building ??= this.buildBusybox().finally(() => (this.building = undefined));
      return this.building;
    }
    const known = this.store.listImages().map((i) => i.name);
    throw new SnaplabError(
      'IMAGE_NOT_FOUND',
      `no image named ${JSON.stringify(name)}`,
      `known images: ${[...new Set([BUILTIN_IMAGE, ...known])].join(', ')}; import one with \`snaplab image import <rootfs.tar|dir> --name ${name}\``,
    );
  }

  /** The built-in image: Debian's static busybox and a symlink per applet. No network needed. */
  async buildBusybox(): Promise<ImageRecord> {
    const busybox = (await which('busybox')) ?? '/bin/busybox';
    if (!existsSync(busybox)) {
      throw new SnaplabError(
        'IMAGE_NOT_FOUND',
        'the built-in busybox image needs a static busybox binary',
        'apt-get install busybox-static',
      );
    }
    if (isDynamicElf(busybox)) {
      throw new SnaplabError(
        'IMAGE_NOT_FOUND',
        `${busybox} is dynamically linked; the sandbox has no libc for it`,
        'apt-get install busybox-static',
      );
    }
    return this.create(BUILTIN_IMAGE, `builtin:${busybox}`, async (root) => {
      const provenance: Provenance = { kind: 'builtin', source: busybox, notes: [] };
      await skeleton(root);
      await copyFile(busybox, join(root, 'bin/busybox'));
      await chmod(join(root, 'bin/busybox'), 0o755);
      const { stdout } = await run(busybox, ['--list-full']);
      for (const applet of stdout.split('\n').filter(Boolean)) {
        const target = join(root, applet);
        if (applet === 'bin/busybox' || existsSync(target)) continue;
        await mkdir(join(target, '..'), { recursive: true });
        await symlink(relative(join(target, '..'), join(root, 'bin/busybox')), target);
      }
      await writeFile(join(root, 'etc/hostname'), 'busybox\n');
      return { provenance };
    });
  }

  /**
   * Import an image: a root filesystem (tarball or directory), a `docker save` tarball, or an OCI
   * image layout (directory or tarball). Archives are applied by the helper (native/unpack.c),
   * which resolves every path inside the new tree; see docs/architecture.md "Images".
   */
  async import(source: string, name: string, opts: ImportOptions = {}): Promise<ImageRecord> {
    checkName('image', name);
    if (this.store.getImage(name)) {
      throw new SnaplabError(
        'IMAGE_EXISTS',
        `an image named ${name} already exists`,
        `remove it first with \`snaplab image rm ${name}\`, or pick another --name`,
      );
    }
    return this.create(name, resolve(source), async (root, scratch) => {
      const { importInto } = await import('../image/import.js');
      const got = await importInto(root, source, scratch, opts);
      await skeleton(root);
      return got;
    });
  }

  /**
   * Build in a temporary directory, then rename into place and record: a crash or a failure
   * leaves no half image (gc removes a `.tmp-*` left by a process that died).
   */
  async create(
    name: string,
    source: string,
    build: (root: string, scratch: string) => Promise<Imported | undefined>,
    buildKey?: string,
    replace?: () => Promise<void>,
  ): Promise<ImageRecord> {
    const tmp = join(this.home, 'images', `.tmp-${process.pid}-${name}-${newId()}`);
    await mkdir(join(tmp, 'rootfs'), { recursive: true });
    await mkdir(join(tmp, 'scratch'));
    try {
      const got = await build(join(tmp, 'rootfs'), join(tmp, 'scratch'));
      await removeTree(join(tmp, 'scratch'));
      const init = await initOf(join(tmp, 'rootfs'));
      if (got && init) got.provenance.init = init;
      // measured before it is moved into place: from the rename to the record is a moment, not a
      // `du` of the tree (gc takes an unrecorded tree after a minute)
      const sizeBytes = await sizeOf(join(tmp, 'rootfs'));
      const dir = this.dir(name);
      // `image build --rebuild`: the old image goes now that the new one is whole
      await replace?.();
      const raced = this.store.getImage(name);
      if (raced) {
        // another process made and recorded an image of this name meanwhile: theirs stands
        await removeTree(tmp);
        return raced;
      }
      await removeTree(dir); // a tree no record names (a crash's)
      await rename(tmp, dir);
      const rec: ImageRecord = {
        name,
        source,
        path: join(dir, 'rootfs'),
        sizeBytes,
        createdAt: Date.now(),
        config: got?.config ?? null,
        provenance: got?.provenance ?? null,
        buildKey: buildKey ?? null,
      };
      if (this.store.putImage(rec)) return rec;
      // another process recorded the same image meanwhile: theirs stands
      const theirs = this.store.getImage(name);
      if (!theirs) throw new Error(`image ${name} was recorded by another process and then removed`);
      return theirs;
    } catch (e) {
      await removeTree(tmp).catch(noted(`remove ${tmp}`, 'ENOENT')); // (what is mounted there stays; gc tries again)
      throw e;
    }
  }

  /**
   * Image directories nothing owns: a build whose process died (`.tmp-PID-…`), and a tree that
   * was renamed into place by a process that died before recording it (after a grace period).
   */
  async collect(graceMs = 60_000): Promise<string[]> {
    const removed: string[] = [];
    const base = join(this.home, 'images');
    for (const d of await readdir(base).catch(orElse([] as string[], 'readdir', 'ENOENT'))) {
      const dir = join(base, d);
      const tmp = /^\.tmp-(\d+)-/.exec(d);
      if (tmp) {
        if (await pidAlive(Number(tmp[1]))) continue;
      } else if (d.startsWith('.') || this.store.getImage(d)) {
        continue;
      } else if (
        Date.now() - ((await lstat(dir).catch(orElse(undefined, `lstat ${dir}`, 'ENOENT')))?.ctimeMs ?? 0) <
        graceMs
      ) {
        continue;
      }
      // never through a mount a build left (mmdebstrap binds /proc, /sys and /dev into its tree)
      if (
        !(await removeTree(dir).then(
          () => true,
          () => false,
        ))
      )
        continue;
      removed.push(`image directory ${dir}${tmp ? ' (an import or build that did not finish)' : ' (no image record)'}`);
    }
    return removed;
  }

  async removeTree(name: string): Promise<void> {
    await removeTree(this.dir(name));
  }
}
