import { describe, expect, it } from 'vitest';
import { readFileSync } from 'node:fs';
import { HOST_LIMITS, hostLimits, hostLimitsVerdict, MEMCG_ID_MAX, memoryCgroups, readSysctl } from './limits.js';

describe('host limits (doctor)', () => {
  it("reads this host's limits and says how many idle sandboxes each allows", () => {
    const v = hostLimits();
    const pidMax = readSysctl('kernel.pid_max')!;
    expect(pidMax).toBeGreaterThan(0);
    expect(v.reason).toContain(`kernel.pid_max=${pidMax} `);
    expect(v.reason).toMatch(/uid ranges 35,336 of 65536 ids, 2,261,504 of 1024/);
    if (!v.ok) expect(v.fix).toMatch(/^sysctl -w /);
    // the memory controller's cgroups, live and dying, as /proc/cgroups counts them
    const memcgs = memoryCgroups()!;
    expect(memcgs).toBeGreaterThan(0);
    expect(v.reason).toContain(`(${memcgs.toLocaleString('en-US')} of 65,535 taken`);
    expect(readFileSync('/proc/cgroups', 'utf8')).toMatch(new RegExp(`^memory\\s+\\d+\\s+${memcgs}\\s`, 'm'));
  });

  it('says the ceiling and what sets it, memory cgroup ids included (no sysctl raises those)', () => {
    const gib = 2 ** 30;
    const high = { 'kernel.pid_max': 4194304, 'kernel.threads-max': 4194304 };
    expect(hostLimitsVerdict(high, 24 * gib, 500, 100).reason).toMatch(/allows: 32,768, by memory \(/);
    // 256 GiB: memory allows 349 525, the memory cgroup ids 65 435: the ceiling, not a failure
    const big = hostLimitsVerdict(high, 256 * gib, 500, 100);
    expect(big).toMatchObject({ ok: true, reason: expect.stringMatching(/allows: 35,336, by uid ranges of 65536/) });
    const dying = hostLimitsVerdict(high, 256 * gib, 500, MEMCG_ID_MAX - 20_000);
    expect(dying.reason).toMatch(/allows: 20,000, by memory cgroup ids \(.*45,535 of 65,535 taken/);
    expect(memoryCgroups('#subsys_name\thierarchy\tnum_cgroups\tenabled\nmemory\t0\t42\t1\n')).toBe(42);
    expect(memoryCgroups('#subsys_name\thierarchy\tnum_cgroups\tenabled\npids\t0\t42\t1\n')).toBeUndefined();
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
