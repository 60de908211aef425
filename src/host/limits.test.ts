import { describe, expect, it } from 'vitest';
import { HOST_LIMITS, hostLimits, hostLimitsVerdict, readSysctl } from './limits.js';

describe('host limits (doctor)', () => {
  it("reads this host's limits and says how many idle sandboxes each allows", () => {
    const v = hostLimits();
    const pidMax = readSysctl('kernel.pid_max')!;
    expect(pidMax).toBeGreaterThan(0);
    expect(v.reason).toContain(`kernel.pid_max=${pidMax} `);
    expect(v.reason).toMatch(/uid ranges 35,336 of 65536 ids, 2,261,504 of 1024/);
    if (!v.ok) expect(v.fix).toMatch(/^sysctl -w /);
  });

  it('says which limit stops creates before memory does, with the sysctl that raises it', () => {
    const gib = 2 ** 30;
    const low = { 'kernel.pid_max': 32768, 'kernel.threads-max': 192738 };
    // 24 GiB: 32 768 by memory; pid_max 32768 less 500 running allows 32 268
    const v = hostLimitsVerdict(low, 24 * gib, 500);
    expect(v).toMatchObject({ ok: false, reason: expect.stringMatching(/kernel\.pid_max=32768 32,268/) });
    expect(v.fix).toMatch(/^sysctl -w kernel\.pid_max=4194304 /);
    expect(v.fix).not.toMatch(/threads-max/);
    expect(hostLimitsVerdict({ ...low, 'kernel.pid_max': 4194304 }, 24 * gib, 500).ok).toBe(true);
    expect(hostLimitsVerdict(low, 8 * gib, 500).ok).toBe(true); // memory is the lower bound there
    expect(HOST_LIMITS.every((l) => l.raiseTo > 0 && l.why.length > 0)).toBe(true);
  });
});
