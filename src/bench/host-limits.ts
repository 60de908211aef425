import { availableParallelism } from 'node:os';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { bootTimeoutMs } from '../drivers/qemu/driver.js';
import type { HostLimits } from './options.js';

/**
 * Core-seconds an emulated (TCG) VM start may take, with room to spare. Measured on a 2-core host:
 * 1, 2, 4 and 8 boots at once took 3.4, 3.4, 6.9 and 13.6 s each (p50): about 3.5 core-seconds a
 * boot, so 8 s is more than twice that.
 */
const TCG_CORE_SECONDS_PER_START = 8;

/**
 * How many VMs this host can start at once with every agent answering within the boot timeout.
 * Under emulation a start is CPU-bound: cores × timeout / TCG_CORE_SECONDS_PER_START (on 2 cores
 * with the default 60 s: 15, so the default ladder stops at 8). Under KVM starts take a fraction
 * of a second: no limit beyond the ladder's.
 */
export async function hostLimits(home: string): Promise<HostLimits> {
  const forced = process.env.SNAPLAB_QEMU_ACCEL;
  const decided = await readFile(join(home, 'qemu', 'accel.json'), 'utf8').then(
    (t) => (JSON.parse(t) as { accel?: string }).accel,
    () => undefined,
  );
  const accel = forced ?? decided;
  if (accel === 'kvm') return { vms: { max: Infinity, why: '' } };
  const cores = availableParallelism();
  const timeoutS = bootTimeoutMs() / 1000;
  const max = Math.max(1, Math.floor((cores * timeoutS) / TCG_CORE_SECONDS_PER_START));
  const under =
    accel === 'tcg' ? 'VMs are emulated here (TCG)' : 'VM acceleration is not decided yet (emulation assumed)';
  return {
    vms: {
      max,
      why: `${under}: an emulated VM start takes up to ${TCG_CORE_SECONDS_PER_START} core-seconds, so ${cores} cores start at most ${max} within the ${timeoutS} s boot timeout`,
    },
  };
}
