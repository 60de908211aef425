import { existsSync } from 'node:fs';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

/**
 * KVM only where a test boot proves it: on some hosts /dev/kvm opens but guests hang (a
 * PVM-style nested hypervisor). The answer is kept in `<home>/qemu/accel.json`; delete the file to
 * probe again.
 */
export async function chooseAccel(home: string, testBoot: (accel: 'kvm') => Promise<boolean>): Promise<'kvm' | 'tcg'> {
  const file = join(home, 'qemu', 'accel.json');
  const known = await readFile(file, 'utf8').then((t) => JSON.parse(t) as { accel: 'kvm' | 'tcg' }, () => null);
  if (known) return known.accel;
  let accel: 'kvm' | 'tcg' = 'tcg';
  let reason = '/dev/kvm does not exist';
  if (existsSync('/dev/kvm')) {
    const t0 = Date.now();
    accel = (await testBoot('kvm')) ? 'kvm' : 'tcg';
    reason = accel === 'kvm' ? `a test boot under KVM reached the agent in ${Date.now() - t0} ms` : `/dev/kvm exists but a test boot under KVM did not reach the agent within its timeout (${Date.now() - t0} ms): emulating (TCG)`;
  }
  await mkdir(join(home, 'qemu'), { recursive: true });
  await writeFile(file, JSON.stringify({ accel, reason, decidedAt: new Date().toISOString() }));
  return accel;
}
