import { existsSync } from 'node:fs';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SnaplabError } from '../../errors.js';

/**
 * KVM only where a test boot proves it: on some hosts /dev/kvm opens but guests hang (a
 * PVM-style nested hypervisor). The answer is kept in `<home>/qemu/accel.json`; delete the file to
 * probe again. SNAPLAB_QEMU_ACCEL=kvm|tcg overrides both.
 */
export async function chooseAccel(home: string, testBoot: (accel: 'kvm') => Promise<boolean>): Promise<'kvm' | 'tcg'> {
  // an operator who knows better (a host whose KVM boots slowly, or a CI box to keep on TCG)
  const forced = process.env.SNAPLAB_QEMU_ACCEL;
  if (forced !== undefined) {
    if (forced !== 'kvm' && forced !== 'tcg')
      throw new SnaplabError(
        'BAD_INPUT',
        `SNAPLAB_QEMU_ACCEL=${JSON.stringify(forced)}`,
        'set it to kvm or tcg, or unset it to let a test boot decide',
      );
    return forced;
  }
  const file = join(home, 'qemu', 'accel.json');
  const known = await readFile(file, 'utf8').then(
    (t) => JSON.parse(t) as { accel: 'kvm' | 'tcg' },
    () => null,
  );
  if (known) return known.accel;
  let accel: 'kvm' | 'tcg' = 'tcg';
  let reason = '/dev/kvm does not exist';
  if (existsSync('/dev/kvm')) {
    const t0 = Date.now();
    accel = (await testBoot('kvm')) ? 'kvm' : 'tcg';
    reason =
      accel === 'kvm'
        ? `a test boot under KVM reached the agent in ${Date.now() - t0} ms`
        : `/dev/kvm exists but a test boot under KVM did not reach the agent within its timeout (${Date.now() - t0} ms): emulating (TCG)`;
  }
  await mkdir(join(home, 'qemu'), { recursive: true });
  await writeFile(file, JSON.stringify({ accel, reason, decidedAt: new Date().toISOString() }));
  return accel;
}
