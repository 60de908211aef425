import { randomInt } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, statSync, unlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { USERNS_SIZE, USERNS_SLOTS, slotBase, slotOf, tierSlots } from './id-ranges.js';
import {
  REGISTRY,
  claimEffort,
  claimRange,
  namedIn,
  rangesOf,
  registryNames,
  releaseRange,
  removeDeadClaimWrites,
  staleClaims,
} from './registry.js';

// The host-wide registry itself (/run/snaplab/userns, real files), in a window of a few slots of
// the high stretch picked at random (SNAPLAB_USERNS_IDS), where nothing else on the host claims.
const HOME = `/test/registry-${process.pid}`;
const LOW = 2569;
let claimed: [number, string, number][] = [];

function window(slots: number): number {
  const first = LOW + randomInt(USERNS_SLOTS - LOW - slots);
  const lo = slotBase(first);
  process.env.SNAPLAB_USERNS_IDS = `${lo}-${lo + slots * USERNS_SIZE - 1}`;
  return lo;
}
async function claim(id: string, size = USERNS_SIZE): Promise<number> {
  const base = await claimRange(HOME, id, size);
  claimed.push([base, id, size]);
  return base;
}
afterEach(async () => {
  delete process.env.SNAPLAB_USERNS_IDS;
  for (const [base, id, size] of claimed) await releaseRange(base, HOME, id, size);
  claimed = [];
});

describe('uid ranges', () => {
  it('use the whole uid space: below 2^31 first, then up to 2^32-2, never (uid_t)-1', () => {
    expect(USERNS_SLOTS).toBe(2569 + 32767);
    expect(slotBase(LOW - 1) + USERNS_SIZE).toBeLessThanOrEqual(2 ** 31);
    expect(slotBase(LOW)).toBe(2 ** 31);
    expect(slotBase(USERNS_SLOTS - 1) + USERNS_SIZE - 1).toBeLessThan(2 ** 32 - 1);
    expect(slotOf(slotBase(LOW) + 4096)).toBe(2 ** 31);
    expect(slotOf(2 ** 32 - 1)).toBeUndefined();
    expect(tierSlots()).toEqual([
      [0, LOW],
      [LOW, USERNS_SLOTS],
    ]);
    process.env.SNAPLAB_USERNS_IDS = `${2 ** 31}-${2 ** 31 + 2 * USERNS_SIZE - 1}`;
    expect(tierSlots()).toEqual([[LOW, LOW + 2]]);
  });

  it("never hands out systemd's foreign range (0x7ffe0000-0x7ffeffff, nspawn's --private-users=managed)", async () => {
    // the range falls across two slots (the second stretch starts at 2 100 000 000, not on a
    // multiple of 65 536): both are barred, so a window of those two alone has no room at all
    const [a, b] = [slotOf(0x7ffe_0000)!, slotOf(0x7ffe_ffff)!];
    expect(b - a).toBe(USERNS_SIZE);
    expect(a).toBeLessThan(0x7ffe_0000);
    process.env.SNAPLAB_USERNS_IDS = `${a}-${b + USERNS_SIZE - 1}`;
    // (claim(): were the bar ever gone, what it claimed would still be released after the test)
    await expect(claim('foreign-a')).rejects.toMatchObject({ code: 'NO_USERNS_SLOT' });
    await expect(claim('foreign-b', 1024)).rejects.toMatchObject({ code: 'NO_USERNS_SLOT' });
  });

  it('a tier found full is passed over for a while, the last one never: past ~2 600 sandboxes a create tries no slot below 2^31', async () => {
    // the low tier's last six slots (the two highest are systemd's foreign range) and the high
    // tier's first three
    process.env.SNAPLAB_USERNS_IDS = `${slotBase(LOW - 6)}-${slotBase(LOW + 2) + USERNS_SIZE - 1}`;
    expect(tierSlots()).toEqual([
      [LOW - 6, LOW],
      [LOW, LOW + 3],
    ]);
    // claimed until one goes above 2^31: the low four are then held, by these or by a sandbox of
    // this host, and this process's scan found the low tier full
    const bases: number[] = [];
    while (!bases.some((b) => b >= 2 ** 31)) {
      expect(bases.length).toBeLessThan(5);
      bases.push(await claim(`fill-${bases.length}`));
    }
    const low = bases.filter((b) => b < 2 ** 31);
    expect(low.length).toBeGreaterThan(0); // (all four held by sandboxes of the host: rerun)
    // one freed behind this process's back, as another process's rm frees it: the next claim does
    // not look below 2^31 (before, every claim tried the low tier first: ~50 failed links each
    // with it full), and a failed link is no part of it
    unlinkSync(join(REGISTRY, String(low[0])));
    const before = { ...claimEffort };
    expect(await claim('past-full')).toBeGreaterThanOrEqual(2 ** 31);
    expect(claimEffort.scans).toBe(before.scans);
    // but once the high tier is full too, the low one is looked at again before a create fails
    let next = await claim('high-or-back');
    for (let i = 0; next >= 2 ** 31; i++) {
      expect(i).toBeLessThan(3);
      next = await claim(`high-or-back-${i}`);
    }
    expect(next).toBe(low[0]);
    // where the low tier is the last, it is always looked at: a slot freed there is found
    unlinkSync(join(REGISTRY, String(low[0])));
    process.env.SNAPLAB_USERNS_IDS = `${slotBase(LOW - 6)}-${slotBase(LOW - 1) + USERNS_SIZE - 1}`;
    expect(tierSlots()).toEqual([[LOW - 6, LOW]]);
    expect(await claim('last-tier')).toBe(low[0]);
  });

  it('a split slot holds ranges of one size; a whole claim and a split slot exclude each other', async () => {
    const lo = window(1);
    const a = await claim('small-a', 1024);
    const b = await claim('small-b', 1024);
    expect(slotOf(a)).toBe(lo);
    expect(new Set([a, b]).size).toBe(2);
    expect([a % 1024, b % 1024]).toEqual([lo % 1024, lo % 1024]);
    expect(statSync(join(REGISTRY, String(lo))).isDirectory()).toBe(true);
    expect(readdirSync(join(REGISTRY, String(lo))).sort()).toEqual([`${a}.1024`, `${b}.1024`].sort());
    // the one slot is split for 1024: neither a whole range nor one of 4096 may be had in it
    await expect(claimRange(HOME, 'whole')).rejects.toMatchObject({ code: 'NO_USERNS_SLOT' });
    await expect(claimRange(HOME, 'mid', 4096)).rejects.toMatchObject({ code: 'NO_USERNS_SLOT' });
    expect((await rangesOf(HOME)).get(a)).toBe('small-a');
    // given back: the slot, empty, is removed with its last range, and whole again
    await releaseRange(a, HOME, 'small-a', 1024);
    await releaseRange(b, HOME, 'small-b', 1024);
    claimed = [];
    expect(existsSync(join(REGISTRY, String(lo)))).toBe(false);
    expect(await claim('whole')).toBe(lo);
    await expect(claimRange(HOME, 'small-c', 1024)).rejects.toMatchObject({ code: 'NO_USERNS_SLOT' });
  });

  it('fills a slot exactly: 64 ranges of 1024 claimed at once, none shared, then full', async () => {
    const lo = window(1);
    const bases = await Promise.all(Array.from({ length: 64 }, (_, i) => claim(`s${i}`, 1024)));
    expect(new Set(bases).size).toBe(64);
    expect(Math.min(...bases)).toBe(lo);
    expect(Math.max(...bases)).toBe(lo + USERNS_SIZE - 1024);
    await expect(claimRange(HOME, 'one-more', 1024)).rejects.toMatchObject({ code: 'NO_USERNS_SLOT' });
  });

  it('an empty split slot left by a crash is taken by a whole claim, and removed by gc', async () => {
    const lo = window(2);
    mkdirSync(join(REGISTRY, String(lo)));
    mkdirSync(join(REGISTRY, String(lo + USERNS_SIZE)));
    expect(await removeDeadClaimWrites(await registryNames())).toContain(join(REGISTRY, String(lo)));
    expect(existsSync(join(REGISTRY, String(lo)))).toBe(false);
    expect(existsSync(join(REGISTRY, String(lo + USERNS_SIZE)))).toBe(false);
    mkdirSync(join(REGISTRY, String(lo)));
    mkdirSync(join(REGISTRY, String(lo + USERNS_SIZE)));
    const bases = [await claim('w1'), await claim('w2')];
    expect(bases.sort()).toEqual([lo, lo + USERNS_SIZE]);
  });

  it("gc reads no claim of a range its home's records hold (by name), and finds one none holds", async () => {
    window(4);
    const held = await claim('held', 4096);
    const lost = await claim('lost');
    const names = await registryNames();
    expect(names.claims.filter((c) => c.base === held || c.base === lost).map((c) => c.size)).toEqual(
      expect.arrayContaining([4096, USERNS_SIZE]),
    );
    // every holder denied, no grace: a claim read is a claim given back; the recorded one is not read
    const recorded = (base: number, size: number): boolean => base === held && size === 4096;
    const stale = await staleClaims(
      HOME,
      names,
      recorded,
      () => false,
      async () => true,
      0,
    );
    expect(stale.filter((c) => c.home === HOME).map((c) => c.id)).toEqual(['lost']);
    const all = await staleClaims(
      HOME,
      names,
      () => false,
      () => false,
      async () => true,
      0,
    );
    expect(
      all
        .filter((c) => c.home === HOME)
        .map((c) => c.id)
        .sort(),
    ).toEqual(['held', 'lost']);
  });

  it('a claim file of another (older) version in a slot is never shared', async () => {
    const lo = window(1);
    writeFileSync(join(REGISTRY, String(lo)), JSON.stringify({ home: HOME, id: 'older' }), { flag: 'wx' });
    claimed.push([lo, 'older', USERNS_SIZE]);
    await expect(claimRange(HOME, 'small', 2048)).rejects.toMatchObject({ code: 'NO_USERNS_SLOT' });
    await expect(claimRange(HOME, 'whole')).rejects.toMatchObject({ code: 'NO_USERNS_SLOT' });
  });

  it('refuses a size that is not a power of two from 1024 to 65536', async () => {
    for (const n of [512, 1000, 3000, 131072, Number.NaN])
      await expect(claimRange(HOME, 'bad', n)).rejects.toMatchObject({ code: 'BAD_INPUT', hint: /power of two/ });
  });
});

describe('the ids the host names', () => {
  it('reads accounts at or above 0x70000000 as single ids, and subordinate ranges (subuid, subgid) whole', () => {
    const passwd = 'root:x:0:0::/root:/bin/sh\nhigh:x:1879048300:1879048300::/:/bin/false\nbad:x:nope:0::/:/bin/sh\n';
    expect(namedIn('/etc/passwd', passwd)).toEqual([[1879048300, 1879048300]]);
    // a user's rootless containers' ids: a sandbox sharing them would share host ids with them
    const subuid = 'alice:100000:65536\nbob:1879000000:100000\n1000:4000000000:65536\nbroken:12\nzero:1879048192:0\n';
    expect(namedIn('/etc/subuid', subuid)).toEqual([
      [1879000000, 1879099999],
      [4000000000, 4000065535],
    ]);
    expect(namedIn('/etc/subgid', '')).toEqual([]);
  });
});
