import { chmod, lstat, mkdir, readlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { orElse } from '../cleanup.js';

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

/** The skeleton's directories (the contract suite checks every source's tree has them). */
export const SKELETON_DIRS: readonly string[] = SKELETON;

/**
 * The image's own init, when it is systemd: /sbin/init (or /usr/sbin/init) a link whose target is
 * named systemd. Read as strings, never followed (the tree is untrusted and a link may point at
 * the host's files). `create` boots it unless told `--init agent`.
 */
export async function initOf(root: string): Promise<'systemd' | undefined> {
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
