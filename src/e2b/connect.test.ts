import { describe, expect, it } from 'vitest';
import { deadlineOf, keepaliveMs } from './connect.js';

describe("a client's timers", () => {
  it('take a Connect-Timeout-Ms a timer can hold, rounded up; none past ~25 days (Node would fire it at once)', () => {
    expect(deadlineOf('1500.2')).toBe(1501);
    expect(deadlineOf(['60000', '1'])).toBe(60000);
    expect([deadlineOf(undefined), deadlineOf('0'), deadlineOf('-5'), deadlineOf('soon')]).toEqual([
      undefined,
      undefined,
      undefined,
      undefined,
    ]);
    expect(deadlineOf(String(2 ** 31 - 1))).toBe(2 ** 31 - 1);
    expect(deadlineOf('3000000000')).toBeUndefined();
  });

  it('send keepalives at most once a second, at least once a timer can hold', () => {
    expect(keepaliveMs('50')).toBe(50_000);
    expect([keepaliveMs('0'), keepaliveMs('-3')]).toEqual([1000, 1000]);
    expect(keepaliveMs('3000000')).toBe(2 ** 31 - 1);
    // as envd: none asked, or none it can read, is every 90 s
    expect([keepaliveMs(undefined), keepaliveMs('0.2'), keepaliveMs('junk'), keepaliveMs('')]).toEqual([
      90_000, 90_000, 90_000, 90_000,
    ]);
  });
});
