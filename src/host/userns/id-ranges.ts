/**
 * Host uids (and gids) snaplab hands out, and to what. No account is needed for any of them.
 *
 * - 0x80000–0x6FFFFFFF: systemd's container range (nspawn, homed): left alone.
 * - VMs: one uid per QEMU process, VMM_UID_BASE + 0..VMM_UID_SPAN-1 (drivers/qemu/launch.ts).
 * - Namespace sandboxes: a user namespace each, in slots of USERNS_SIZE ids: first the low
 *   stretches, from 0x70000000 up to the VMs' range and from above it up to 2^31 (2569 slots), then,
 *   once those are full, the high one from 2^31 up to 2^32−2 (32767 slots; (uid_t)-1 is never in
 *   a range). Low first because procps prints a uid ≥ 2^31 as a negative number (`ps -o uid`), so a
 *   host with fewer than ~2500 sandboxes never shows one. systemd's "foreign" range
 *   0x7FFE0000-0x7FFEFFFF and ids that /etc/passwd or /etc/group name are skipped. A slot is
 *   claimed whole, or split into ranges of one smaller size (host/userns/registry.ts).
 */
export const VMM_UID_BASE = 2_000_000_000;
export const VMM_UID_SPAN = 100_000_000;
/** ids in a slot: the largest range, and a create's default */
export const USERNS_SIZE = 65536;
/** the smallest range a create may ask for (`ids`): root, the system accounts and uid 1000 */
export const USERNS_MIN_SIZE = 1024;

type Stretch = [number, number];
/** [first id, end) of each stretch, in the order they are used: a tier is used when those before it are full */
export const TIERS: Stretch[][] = [
  [
    [0x7000_0000, VMM_UID_BASE],
    [VMM_UID_BASE + VMM_UID_SPAN, 2 ** 31],
  ],
  [[2 ** 31, 2 ** 32 - 1]],
];
const STRETCHES = TIERS.flat();
const slotsIn = ([lo, hi]: Stretch): number => Math.floor((hi - lo) / USERNS_SIZE);
/** how many full-size ranges there can be at once (35 336) */
export const USERNS_SLOTS = STRETCHES.reduce((n, s) => n + slotsIn(s), 0);

/** The first host id of slot `n` (0 ≤ n < USERNS_SLOTS). */
export function slotBase(n: number): number {
  for (const s of STRETCHES) {
    if (n < slotsIn(s)) return s[0] + n * USERNS_SIZE;
    n -= slotsIn(s);
  }
  throw new RangeError(`no user namespace slot ${n}`);
}

/** The first id of the slot that holds host id `id`, or undefined where no slot is. */
export function slotOf(id: number): number | undefined {
  for (const s of STRETCHES) {
    const k = Math.floor((id - s[0]) / USERNS_SIZE);
    if (id >= s[0] && k < slotsIn(s)) return s[0] + k * USERNS_SIZE;
  }
  return undefined;
}

/**
 * Slot numbers [from, to) of each tier, in order. SNAPLAB_USERNS_IDS=LO-HI (tests: a sandbox above
 * 2^31, a registry made full with a few files) keeps only the slots wholly within LO..HI.
 */
export function tierSlots(): [number, number][] {
  const m = /^(\d+)-(\d+)$/.exec(process.env.SNAPLAB_USERNS_IDS ?? '');
  const [lo, hi] = m ? [Number(m[1]), Number(m[2])] : [0, 2 ** 32];
  const out: [number, number][] = [];
  let n = 0;
  for (const tier of TIERS) {
    let from = -1;
    let to = -1;
    for (const s of tier) {
      // the slots of s within lo..hi: a contiguous run of slot numbers
      const first = Math.max(0, Math.ceil((lo - s[0]) / USERNS_SIZE));
      const last = Math.min(slotsIn(s), Math.floor((hi + 1 - s[0]) / USERNS_SIZE)); // exclusive
      if (first < last && from < 0) from = n + first;
      if (first < last) to = n + last;
      n += slotsIn(s);
    }
    if (from >= 0) out.push([from, to]);
  }
  return out;
}
