/**
 * Host uids (and gids) snaplab hands out, and to what. No account is needed for any of them.
 *
 * - 0x80000–0x6FFFFFFF: systemd's container range (nspawn, homed): left alone.
 * - VMs: one uid per QEMU process, VMM_UID_BASE + 0..VMM_UID_SPAN-1 (drivers/qemu/launch.ts).
 * - Namespace sandboxes: a user namespace each, USERNS_SIZE ids mapping 0..65535 inside, in slots
 *   from 0x70000000 up to the VMs' range and from above it up to 2^31 (ps and other tools print
 *   larger uids as negative numbers): 2569 slots; systemd's "foreign" range 0x7FFE0000-0x7FFEFFFF and ids that
 *   /etc/passwd or /etc/group name are skipped. Claimed host-wide (host/userns/registry.ts).
 */
export const VMM_UID_BASE = 2_000_000_000;
export const VMM_UID_SPAN = 100_000_000;
export const USERNS_SIZE = 65536;

const STRETCHES: [number, number][] = [
  [0x7000_0000, VMM_UID_BASE],
  [VMM_UID_BASE + VMM_UID_SPAN, 2 ** 31],
];
const slotsIn = ([lo, hi]: [number, number]): number => Math.floor((hi - lo) / USERNS_SIZE);
/** how many sandboxes can have a user namespace at once (2569) */
export const USERNS_SLOTS = STRETCHES.reduce((n, s) => n + slotsIn(s), 0);

/** The first host id of slot `n` (0 ≤ n < USERNS_SLOTS). */
export function slotBase(n: number): number {
  for (const s of STRETCHES) {
    if (n < slotsIn(s)) return s[0] + n * USERNS_SIZE;
    n -= slotsIn(s);
  }
  throw new RangeError(`no user namespace slot ${n}`);
}
