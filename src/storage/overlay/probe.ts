import { overlayOptions } from './layers.js';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { join } from 'node:path';
import type { Availability } from '../../host/probe-types.js';
import { run } from '../../host/run.js';
import { toolsVerdict } from '../../host/tools.js';
import { unmountAll } from '../mounts.js';
import { kernelHasFs } from '../tree.js';
import { noted } from '../../cleanup.js';

/** Overlay works here if the kernel has it and a test mount under `root` succeeds. Never throws. */
export async function probeOverlay(home: string, root: string): Promise<Availability> {
  let dir: string | undefined;
  try {
    if (/[,:\\]/.test(root)) {
      return {
        ok: false,
        reason: `home ${home} holds ',' ':' or '\\', which overlay options cannot carry`,
        fix: 'use a plain home path such as /var/lib/snaplab',
      };
    }
    const missing = await toolsVerdict('overlay', 'overlay storage');
    if (missing) return missing;
    if (!(await kernelHasFs('overlay'))) {
      return {
        ok: false,
        reason: 'the kernel has no overlay: not in /proc/filesystems, and `modprobe overlay` could not load it',
        fix: 'apt-get install kmod, or a kernel with overlayfs (CONFIG_OVERLAY_FS)',
      };
    }
    await mkdir(root, { recursive: true });
    dir = await mkdtemp(join(root, '.probe-'));
    for (const d of ['l', 'u', 'w', 'm']) await mkdir(join(dir, d));
    const opts = overlayOptions([`${dir}/l`], { upper: `${dir}/u`, work: `${dir}/w` });
    const r = await run('mount', ['-t', 'overlay', 'overlay', '-o', opts, `${dir}/m`], { allowFail: true });
    if (r.code !== 0) {
      return {
        ok: false,
        reason: `test overlay mount failed: ${r.stderr.trim()}`,
        fix: `put ${home} on ext4, xfs or btrfs (not overlay, nfs) and run as root`,
      };
    }
    await run('umount', [`${dir}/m`], { allowFail: true });
    return { ok: true, reason: `overlayfs mounts on ${root}` };
  } catch (e) {
    return { ok: false, reason: `probe failed: ${(e as Error).message}` };
  } finally {
    if (dir)
      await unmountAll(dir)
        .then(() => rm(dir!, { recursive: true, force: true }))
        .catch(noted(`remove probe ${dir}`, 'ENOENT'));
  }
}
