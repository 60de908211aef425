import { readdir, readFile } from 'node:fs/promises';
import { resolve } from 'node:path';
import { SnaplabError } from '../errors.js';
import { run } from './run.js';

export interface LoopDevice {
  /** /dev/loopN */
  device: string;
  /** the file behind it, as the kernel recorded it at attach time */
  backingFile: string;
  /** the backing file was deleted after attaching (kernel appends " (deleted)") */
  deleted: boolean;
}

const DELETED = ' (deleted)';

/** Every attached loop device, read from sysfs (no losetup process). */
export async function listLoopDevices(): Promise<LoopDevice[]> {
  const names = (await readdir('/sys/block')).filter((n) => /^loop\d+$/.test(n));
  const found = await Promise.all(
    names.map(async (n): Promise<LoopDevice | undefined> => {
      let raw: string;
      try {
        // the loop/ directory exists only while a file is attached
        raw = (await readFile(`/sys/block/${n}/loop/backing_file`, 'utf8')).replace(/\n$/, '');
      } catch {
        return undefined;
      }
      const deleted = raw.endsWith(DELETED);
      return {
        device: `/dev/${n}`,
        backingFile: deleted ? raw.slice(0, -DELETED.length) : raw,
        deleted,
      };
    }),
  );
  return found.filter((d): d is LoopDevice => d !== undefined);
}

/** Loop devices whose backing file is at or below `prefix` (the gc finds leaked ones this way). */
export async function loopDevicesBackedUnder(prefix: string): Promise<LoopDevice[]> {
  const p = resolve(prefix);
  return (await listLoopDevices()).filter(
    (d) => d.backingFile === p || d.backingFile.startsWith(p === '/' ? '/' : `${p}/`),
  );
}

/** Attach `file` to a free loop device; returns /dev/loopN. */
export async function attachLoop(file: string, opts: { readOnly?: boolean } = {}): Promise<string> {
  const args = ['-f', '--show', ...(opts.readOnly ? ['-r'] : []), resolve(file)];
  return (await run('losetup', args)).stdout.trim();
}

/** Detach a loop device. Idempotent: a device with nothing attached is fine. */
export async function detachLoop(device: string): Promise<void> {
  const name = device.replace(/^\/dev\//, '');
  if (!/^loop\d+$/.test(name)) {
    throw new SnaplabError('BAD_INPUT', `not a loop device: ${device}`, 'pass /dev/loopN');
  }
  const r = await run('losetup', ['-d', `/dev/${name}`], { allowFail: true });
  if (r.code === 0 || /No such device or address/i.test(r.stderr)) return;
  throw new SnaplabError(
    'HOST_COMMAND_FAILED',
    `losetup -d /dev/${name} failed: ${r.stderr.trim()}`,
    `unmount whatever is mounted from it first (see: findmnt /dev/${name})`,
  );
}
