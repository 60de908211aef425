import { mountsUnder, unmount, type MountEntry } from '../host/mounts.js';
import { noted } from '../cleanup.js';

export { listMounts as readMounts, mountsUnder, isMountPoint } from '../host/mounts.js';

/**
 * Unmount everything at or below `dir`. A busy mount (a process still has a file open in it) is
 * detached lazily: it disappears from the namespace now and the kernel frees it when the last
 * user goes, which is what a delete wants.
 */
export async function unmountAll(dir: string): Promise<string[]> {
  const done: string[] = [];
  // A path can be mounted several times over (stacked mounts): loop until none is left.
  for (let round = 0; round < 8; round++) {
    const mounts = await mountsUnder(dir);
    if (mounts.length === 0) break;
    for (const m of mounts) {
      await unmount(m.target).catch(() => unmount(m.target, { lazy: true }).catch(noted(`unmount ${m.target}`)));
      done.push(m.target);
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
