import { describe, expect, it } from 'vitest';
import {
  checkCeilings,
  egressRefused,
  heldBy,
  limitsUnder,
  NO_CEILINGS,
  resolveCeilings,
  type Ceilings,
} from './ceilings.js';
import { withDefaults } from './lifecycle/limits.js';
import { DEFAULT_DISK_BYTES } from '../defaults.js';

const GiB = 1024 ** 3;
const none = { memoryBytes: 0, diskBytes: 0 };
const c = (x: Partial<Ceilings>): Ceilings => ({ ...NO_CEILINGS, ...x });

describe('ceilings', () => {
  it('refuses what is asked above a ceiling, naming it, and lowers defaults to it', () => {
    const e = (() => {
      try {
        limitsUnder('k', c({ memoryBytes: 2 * GiB }), { memoryBytes: 64 * GiB }, { memoryBytes: GiB }, true, none);
      } catch (err) {
        return err as { code: string; limit: string; message: string };
      }
    })();
    expect([e?.code, e?.limit]).toEqual(['ABOVE_CEILING', 'memoryBytes']);
    expect(e?.message).toBe("memory 64.0 GiB is above key k's ceiling of 2.0 GiB per sandbox");
    expect(() => limitsUnder('k', c({ pids: 100 }), { pids: 4_000_000 }, {}, true, none)).toThrow(/pids 4000000/);
    // what was not asked: the default, lowered to the ceiling
    expect(
      limitsUnder('k', c({ memoryBytes: GiB / 2 }), undefined, { memoryBytes: GiB, pids: 1024 }, false, none),
    ).toEqual({ memoryBytes: GiB / 2, pids: 1024 });
  });

  it('caps the disk wherever a cap holds, and refuses no cap under a disk ceiling', () => {
    expect(limitsUnder('k', NO_CEILINGS, undefined, {}, true, none).diskBytes).toBe(DEFAULT_DISK_BYTES);
    expect(limitsUnder('k', c({ diskBytes: GiB }), undefined, {}, true, none).diskBytes).toBe(GiB);
    expect(limitsUnder('k', c({ diskBytes: GiB }), { diskBytes: GiB / 2 }, {}, true, none).diskBytes).toBe(GiB / 2);
    expect(() => limitsUnder('k', c({ diskBytes: GiB }), { diskBytes: 0 }, {}, true, none)).toThrow(/without a cap/);
    // a VM's disk is its image: no cap is asked of its storage
    expect(limitsUnder('k', c({ diskBytes: GiB }), undefined, {}, false, none).diskBytes).toBeUndefined();
  });

  it('counts the totals with what the key holds', () => {
    const ceil = c({ totalMemoryBytes: 3 * GiB });
    expect(limitsUnder('k', ceil, { memoryBytes: GiB }, {}, false, { memoryBytes: 2 * GiB, diskBytes: 0 })).toEqual({
      memoryBytes: GiB,
    });
    const over = () =>
      limitsUnder('k', ceil, { memoryBytes: GiB }, {}, false, { memoryBytes: 2.5 * GiB, diskBytes: 0 });
    expect(over).toThrow(expect.objectContaining({ code: 'QUOTA_EXCEEDED', limit: 'totalMemoryBytes' }));
    expect(over).toThrow("key k's sandboxes hold 2.5 GiB of memory; 1.0 GiB more is over its total of 3.0 GiB");
  });

  it('takes the defaults for what a key does not name, and checks what it names', () => {
    const r = resolveCeilings({ memoryBytes: null, pids: 10 });
    expect([r.memoryBytes, r.pids, r.diskBytes]).toEqual([null, 10, 16 * GiB]);
    expect(resolveCeilings(null).memoryBytes).toBe(4 * GiB);
    expect(() => checkCeilings({ memoryBytes: -1 })).toThrow(/invalid memoryBytes ceiling/);
    expect(() => checkCeilings({ bogus: 1 } as never)).toThrow(/unknown ceiling "bogus"/);
    expect(checkCeilings({ cpus: 0.5, diskBytes: null })).toEqual({ cpus: 0.5, diskBytes: null });
  });

  it('allows egress unless the key was made without it (true or false, nothing else)', () => {
    expect(resolveCeilings({}).egress).toBe(true);
    expect(NO_CEILINGS.egress).toBe(true);
    expect(resolveCeilings(checkCeilings({ egress: false })).egress).toBe(false);
    expect(() => checkCeilings({ egress: null } as never)).toThrow(/invalid egress ceiling null/);
    expect(() => checkCeilings({ egress: 0 } as never)).toThrow(/invalid egress ceiling 0/);
    const e = egressRefused('k', 'a sandbox with egress');
    expect(e.toJSON()).toMatchObject({ code: 'FORBIDDEN', hint: expect.stringContaining('leave out egress') });
    expect([e.limit, e.message]).toEqual([
      'egress',
      'a sandbox with egress refused: key k may not have egress (it was made with --no-egress)',
    ]);
  });
});

describe('heldBy', () => {
  it('counts every recorded sandbox toward the quota, and the limits of those that hold room toward the totals', () => {
    const row = (holdsRoom: boolean, memoryBytes?: number, count = 1) => ({
      driver: 'namespaces',
      limits: memoryBytes === undefined ? {} : { memoryBytes },
      holdsRoom,
      count,
    });
    const held = heldBy([
      row(true, GiB),
      // a stopped one holds its room, one dead otherwise none (Store.ownedLimits tells which)
      row(true, 2 * GiB),
      row(false, 4 * GiB),
      // no limit asked: the driver's default counts
      row(true),
      // a row stands for `count` alike
      row(true, GiB, 3),
      row(false, GiB, 2),
    ]);
    const fallback = withDefaults({}, 'namespaces');
    expect(held.sandboxes).toBe(9);
    expect(held.memoryBytes).toBe(6 * GiB + (fallback.memoryBytes ?? 0));
    expect(held.diskBytes).toBe(6 * (fallback.diskBytes ?? 0));
    expect(heldBy([])).toEqual({ sandboxes: 0, memoryBytes: 0, diskBytes: 0 });
  });
});
