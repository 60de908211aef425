import { readFile } from 'node:fs/promises';
import { run } from '../host/run.js';

export interface MountEntry {
  mountPoint: string;
  fsType: string;
  source: string;
  /** per-superblock options, e.g. overlay's lowerdir=...,upperdir=... */
  superOptions: string;
}

// mountinfo escapes space, tab, newline and backslash as \ooo octal.
const unescape = (s: string): string =>
  s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));

/** Parse /proc/self/mountinfo (see proc(5)): fields after the " - " separator are fs-specific. */
export async function readMounts(): Promise<MountEntry[]> {
  const text = await readFile('/proc/self/mountinfo', 'utf8');
  const out: MountEntry[] = [];
  for (const line of text.split('\n')) {
    const sep = line.indexOf(' - ');
    if (sep < 0) continue;
    const left = line.slice(0, sep).split(' ');
    const right = line.slice(sep + 3).split(' ');
    out.push({
      mountPoint: unescape(left[4] ?? ''),
      fsType: right[0] ?? '',
      source: unescape(right[1] ?? ''),
      superOptions: unescape(right[2] ?? ''),
    });
  }
  return out;
}

/** Mount points at or below `dir`, deepest first (the order they must be unmounted in). */
export async function mountsUnder(dir: string): Promise<MountEntry[]> {
  const prefix = dir.endsWith('/') ? dir : `${dir}/`;
  const all = await readMounts();
  return all
    .filter((m) => m.mountPoint === dir || m.mountPoint.startsWith(prefix))
    .sort((a, b) => b.mountPoint.length - a.mountPoint.length);
}

export async function isMountPoint(path: string): Promise<boolean> {
  return (await readMounts()).some((m) => m.mountPoint === path);
}

/**
 * Unmount everything at or below `dir`. A busy mount (a process still has a file open in it) is
 * detached lazily (`umount -l`): it disappears from the namespace now and the kernel frees it when
 * the last user goes, which is what a delete wants.
 */
export async function unmountAll(dir: string): Promise<string[]> {
  const done: string[] = [];
  // A path can be mounted several times over (stacked mounts): loop until none is left.
  for (let round = 0; round < 8; round++) {
    const mounts = await mountsUnder(dir);
    if (mounts.length === 0) break;
    for (const m of mounts) {
      const r = await run('umount', [m.mountPoint], { allowFail: true });
      if (r.code !== 0) await run('umount', ['-l', m.mountPoint], { allowFail: true });
      done.push(m.mountPoint);
    }
  }
  return done;
}

/** Lowerdir layers of an overlay mount, from its super options. */
export function overlayLowerDirs(m: MountEntry): string[] {
  const layers: string[] = [];
  for (const opt of m.superOptions.split(',')) {
    if (opt.startsWith('lowerdir=')) layers.push(...opt.slice('lowerdir='.length).split(':'));
    // kernels >= 6.8 show layers added one by one (fsconfig lowerdir+) as repeated options
    else if (opt.startsWith('lowerdir+=')) layers.push(opt.slice('lowerdir+='.length));
  }
  return layers;
}
