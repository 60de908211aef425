import { existsSync } from 'node:fs';
import { HostOps } from '../hostops.js';
import type { Availability } from '../probe-types.js';
import { slotBase } from './id-ranges.js';

const WHY: Record<number, Availability> = {
  10: {
    ok: false,
    reason: 'a user namespace cannot be made here',
    fix: 'sysctl -w user.max_user_namespaces=65536 (snaplab makes them holding CAP_SYS_ADMIN: the unprivileged_userns_clone and AppArmor restrictions do not apply)',
  },
  11: {
    ok: false,
    reason: 'a mount namespace cannot be made here',
    fix: 'run snaplab as root on the host, not in a container',
  },
  12: {
    ok: false,
    reason: 'this filesystem does not support idmapped mounts',
    fix: 'put the snaplab home on btrfs, ext4, xfs or tmpfs (kernel 5.12 or newer)',
  },
  13: { ok: false, reason: 'an idmapped mount failed', fix: 'a kernel of 5.19 or newer with idmapped mounts' },
};

/**
 * Can a sandbox whose root filesystem is under `dir` get a user namespace here: one made and
 * mapped, and `dir` cloned with an idmap through it (native/userns.c idmap_check)? A real try,
 * nothing left behind.
 */
export async function probeUserns(dir: string): Promise<Availability> {
  const ops = HostOps.get();
  if (!ops) return { ok: false, reason: 'the host helper is not built', fix: 'npm run build' };
  if (!existsSync(dir)) return { ok: false, reason: `${dir} does not exist yet (checked once it is made)` };
  const [code] = await ops.request('idmap-check', dir, String(slotBase(0)));
  const n = Number(code);
  if (n === 0) return { ok: true, reason: `a user namespace is made, and ${dir} idmapped through it` };
  return WHY[n] ?? { ok: false, reason: `the check could not run (code ${code})` };
}
