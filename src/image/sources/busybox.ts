import { existsSync } from 'node:fs';
import { chmod, copyFile, mkdir, symlink, writeFile } from 'node:fs/promises';
import { join, relative, resolve } from 'node:path';
import { SnaplabError } from '../../errors.js';
import { isDynamicElf } from '../../host/elf.js';
import type { Availability } from '../../host/probe-types.js';
import { run, which } from '../../host/run.js';
import { skeleton } from '../skeleton.js';
import type { ImagePlan, ImageSource, ProduceInto, Produced } from '../source.js';

export interface BusyboxInput {
  /** the busybox binary; the one on PATH (else /bin/busybox) unless told */
  binary?: string;
}

const FIX = 'apt-get install busybox-static';

/** Why `binary` cannot make the image, or undefined when it can. */
function unfit(binary: string): Availability | undefined {
  if (!existsSync(binary))
    return { ok: false, reason: `${binary} not found (the built-in image needs a static busybox)`, fix: FIX };
  if (isDynamicElf(binary))
    return { ok: false, reason: `${binary} is dynamically linked; the sandbox has no libc for it`, fix: FIX };
  return undefined;
}

const defaultBinary = async (): Promise<string> => (await which('busybox')) ?? '/bin/busybox';

/** Debian's static busybox and a symlink per applet: the built-in image. No network needed. */
async function produce(binary: string, into: ProduceInto): Promise<Produced> {
  const { root, signal } = into;
  into.onProgress?.(`copying ${binary}`);
  await skeleton(root);
  await copyFile(binary, join(root, 'bin/busybox'));
  await chmod(join(root, 'bin/busybox'), 0o755);
  const listed = await run(binary, ['--list-full'], { signal, allowFail: true });
  if (listed.code !== 0 || !listed.stdout.includes('bin/sh'))
    throw new SnaplabError(
      'IMAGE_NOT_FOUND',
      `${binary} --list-full did not list busybox's applets (exit ${listed.code}): is it busybox?`,
      FIX,
    );
  const applets = listed.stdout.split('\n').filter(Boolean);
  into.onProgress?.(`linking ${applets.length} applets`);
  for (const applet of applets) {
    signal?.throwIfAborted();
    const target = join(root, applet);
    if (applet === 'bin/busybox' || existsSync(target)) continue;
    await mkdir(join(target, '..'), { recursive: true });
    await symlink(relative(join(target, '..'), join(root, 'bin/busybox')), target);
  }
  await writeFile(join(root, 'etc/hostname'), 'busybox\n');
  return { provenance: { kind: 'builtin', source: binary, notes: [] } };
}

export const busyboxSource: ImageSource<BusyboxInput> = {
  kind: 'busybox',
  feature: 'busybox-image',
  async probe() {
    const binary = await defaultBinary();
    return unfit(binary) ?? { ok: true, reason: `static busybox at ${binary}` };
  },
  async plan(input: BusyboxInput): Promise<ImagePlan> {
    const binary = input.binary === undefined ? await defaultBinary() : resolve(input.binary);
    const no = unfit(binary);
    if (no) throw new SnaplabError('IMAGE_NOT_FOUND', no.reason, no.fix);
    return { source: `builtin:${binary}`, produce: (into) => produce(binary, into) };
  },
};
