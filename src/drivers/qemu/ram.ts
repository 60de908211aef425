/**
 * Guest RAM in a file. A booted VM's RAM is a tmpfs file of its own (`share=on`), so that a
 * memory snapshot copies it (holes stay holes) and migrates only the device state
 * (`x-ignore-shared`); a restore maps the snapshot's copy private (`share=off`): pages are read
 * on demand, and every restore of one snapshot shares them in the page cache until it writes.
 */
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { readdir, rm, stat, statfs } from 'node:fs/promises';
import { join } from 'node:path';
import { SnaplabError } from '../../errors.js';
import { run } from '../../host/run.js';
import { orElse } from '../../cleanup.js';

const SHM = '/dev/shm';

/** One home's prefix: several snaplab homes may share /dev/shm, and gc must keep to its own. */
export const ramPrefix = (home: string): string =>
  `snaplab-${createHash('sha256').update(home).digest('hex').slice(0, 8)}-`;

/**
 * Where a booted VM keeps its RAM; undefined (anonymous RAM then) when the host has no /dev/shm or
 * it has less room than the guest's memory once every VM's RAM file is counted whole: a tmpfs that
 * fills up would kill a VM (SIGBUS) when its guest touches a page, not fail its start. (Two VMs
 * starting at the same instant can both count the same room.)
 */
export async function vmRamPath(home: string, id: string, bytes: number): Promise<string | undefined> {
  if (!existsSync(SHM)) return undefined;
  const fs = await statfs(SHM).catch(orElse(null, 'statfs', 'ENOENT'));
  if (!fs) return undefined;
  // the RAM files are sparse: what the running VMs have not touched yet is promised, not free
  let promised = 0;
  for (const n of await readdir(SHM).catch(orElse([] as string[], 'readdir', 'ENOENT'))) {
    if (!n.startsWith('snaplab-') || !n.endsWith('.ram')) continue;
    const st = await stat(join(SHM, n)).catch(orElse(null, 'stat', 'ENOENT'));
    if (st) promised += Math.max(0, st.size - st.blocks * 512);
  }
  if (fs.bavail * fs.bsize - promised < bytes) return undefined;
  return join(SHM, `${ramPrefix(home)}${id}.ram`);
}

/** Copy a stopped VM's RAM file; zero pages become holes. Resolves with the bytes it takes on disk. */
export async function copyRam(from: string, to: string): Promise<number> {
  const r = await run('cp', ['--sparse=always', from, to], { allowFail: true });
  if (r.code !== 0)
    throw new SnaplabError(
      'HOST_COMMAND_FAILED',
      `cannot copy the VM's RAM to ${to}: ${r.stderr.trim()}`,
      'is there space under the snaplab home?',
    );
  return (await stat(to)).blocks * 512;
}

export async function removeRam(home: string, id: string): Promise<void> {
  await rm(join(SHM, `${ramPrefix(home)}${id}.ram`), { force: true });
}

/** RAM files of this home whose VM is not live (QEMU killed, host process crashed). */
export async function gcRam(home: string, isLive: (id: string) => boolean): Promise<string[]> {
  const mine = ramPrefix(home);
  const removed: string[] = [];
  for (const n of await readdir(SHM).catch(orElse([] as string[], 'readdir', 'ENOENT'))) {
    if (!n.startsWith(mine) || !n.endsWith('.ram')) continue;
    if (isLive(n.slice(mine.length, -'.ram'.length))) continue;
    await rm(join(SHM, n), { force: true });
    removed.push(`VM RAM file ${join(SHM, n)}`);
  }
  return removed;
}
