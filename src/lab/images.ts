import { existsSync } from 'node:fs';
import { chmod, lstat, mkdir, rename, rm, stat, symlink, writeFile, copyFile } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { SnaplabError } from '../errors.js';
import { isDynamicElf } from '../host/elf.js';
import { run, which } from '../host/run.js';
import type { Store } from '../store/store.js';
import type { ImageRecord } from '../store/records.js';
import { checkName, newId } from './names.js';

export const BUILTIN_BUSYBOX = 'busybox';

/** Directories every image gets, so that the sandbox's mounts never have to write into it. */
const SKELETON = ['bin', 'sbin', 'usr', 'usr/bin', 'usr/sbin', 'etc', 'root', 'tmp', 'proc', 'dev', 'run', 'var', 'var/tmp', 'home'];

/**
 * Add what is missing of the skeleton without ever following a symlink of the image: an
 * imported tree is untrusted, and `tmp -> /etc` followed on the host would make the host's /etc
 * world-writable. A path that is a symlink (or under one) is left as the image has it.
 */
async function skeleton(root: string): Promise<void> {
  const isDir = async (rel: string): Promise<boolean> => {
    const st = await lstat(join(root, rel)).catch(() => undefined);
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

/** Image trees live in `${home}/images/<name>/rootfs`; storage backends import from there. */
export class Images {
  private building: Promise<ImageRecord> | undefined;

  constructor(private readonly home: string, private readonly store: Store) {}

  private dir(name: string): string {
    return join(this.home, 'images', name);
  }

  /** The image record, building the built-in busybox image on first use. */
  async resolve(name: string): Promise<ImageRecord> {
    const found = this.store.getImage(name);
    if (found) return found;
    if (name === BUILTIN_BUSYBOX) {
      // several machines of a scenario may ask at once: build it once
      this.building ??= this.buildBusybox().finally(() => (this.building = undefined));
      return this.building;
    }
    const known = this.store.listImages().map((i) => i.name);
    throw new SnaplabError(
      'IMAGE_NOT_FOUND',
      `no image named ${JSON.stringify(name)}`,
      `known images: ${[...new Set([BUILTIN_BUSYBOX, ...known])].join(', ')}; import one with \`snaplab image import <rootfs.tar|dir> --name ${name}\``,
    );
  }

  /** The built-in image: Debian's static busybox and a symlink per applet. No network needed. */
  async buildBusybox(): Promise<ImageRecord> {
    const busybox = (await which('busybox')) ?? '/bin/busybox';
    if (!existsSync(busybox)) {
      throw new SnaplabError('IMAGE_NOT_FOUND', 'the built-in busybox image needs a static busybox binary', 'apt-get install busybox-static');
    }
    if (isDynamicElf(busybox)) {
      throw new SnaplabError('IMAGE_NOT_FOUND', `${busybox} is dynamically linked; the sandbox has no libc for it`, 'apt-get install busybox-static');
    }
    return this.create(BUILTIN_BUSYBOX, `builtin:${busybox}`, async (root) => {
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
    });
  }

  /** Import a root filesystem from a tarball (.tar, .tar.gz, .tar.zst, .tar.xz) or a directory. */
  async import(source: string, name: string): Promise<ImageRecord> {
    checkName('image', name);
    if (this.store.getImage(name)) {
      throw new SnaplabError('IMAGE_EXISTS', `an image named ${name} already exists`, `remove it first with \`snaplab image rm ${name}\`, or pick another --name`);
    }
    const st = await stat(source).catch(() => undefined);
    if (!st) throw new SnaplabError('BAD_INPUT', `no such file or directory: ${source}`, 'give a rootfs tarball or a directory');
    return this.create(name, source, async (root) => {
      if (st.isDirectory()) await run('cp', ['-a', '--', `${source}/.`, root]);
      else if (st.isFile()) {
        const args = ['-xf', source, '-C', root, '--numeric-owner', '--xattrs', '--xattrs-include=*'];
        if (/\.zst$/.test(source)) args.push('--zstd');
        await run('tar', args).catch((e: Error) => {
          throw new SnaplabError('BAD_INPUT', `cannot unpack ${source}: ${e.message}`, 'give a tar archive (plain, gzip, xz or zstd); for .zst install zstd');
        });
      } else throw new SnaplabError('BAD_INPUT', `${source} is neither a file nor a directory`, 'give a rootfs tarball or a directory');
      await skeleton(root);
    });
  }

  /** Build in a temporary directory, then rename into place and record: a crash leaves no half image. */
  private async create(name: string, source: string, build: (root: string) => Promise<void>): Promise<ImageRecord> {
    const tmp = join(this.home, 'images', `.tmp-${name}-${newId()}`);
    await mkdir(join(tmp, 'rootfs'), { recursive: true });
    try {
      await build(join(tmp, 'rootfs'));
      const dir = this.dir(name);
      await rm(dir, { recursive: true, force: true });
      await rename(tmp, dir);
      const rec: ImageRecord = { name, source, path: join(dir, 'rootfs'), sizeBytes: await sizeOf(join(dir, 'rootfs')), createdAt: Date.now() };
      try {
        this.store.putImage(rec);
      } catch (e) {
        // another process recorded the same image meanwhile: theirs stands
        const theirs = this.store.getImage(name);
        if (theirs && /UNIQUE/.test(String(e))) return theirs;
        throw e;
      }
      return rec;
    } catch (e) {
      await rm(tmp, { recursive: true, force: true });
      throw e;
    }
  }

  async removeTree(name: string): Promise<void> {
    await rm(this.dir(name), { recursive: true, force: true });
  }
}
