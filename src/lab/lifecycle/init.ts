import { findDriverInfo } from '../../drivers/registry.js';

/**
 * A machine's init once its image is known: as asked, else the image's own systemd where a system
 * machine can run (a driver that needs no user namespace for it, or one in a user namespace),
 * else the agent (undefined). One rule for a create and for a pool's standbys.
 */
export function initFor(
  c: { driver?: string; userns?: boolean | null; init?: 'systemd' | 'agent' },
  imageInit?: string,
): 'systemd' | undefined {
  const fromImage =
    findDriverInfo(c.driver)?.capabilities.hostRootWithoutUserns !== true || c.userns !== false ? imageInit : undefined;
  return (c.init ?? fromImage) === 'systemd' ? 'systemd' : undefined;
}
