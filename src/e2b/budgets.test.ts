import { describe, expect, it } from 'vitest';
import { PeerBudgets, peerOf } from './budgets.js';

describe('PeerBudgets', () => {
  it("spends a peer's burst, refills it with time, and keeps peers apart", () => {
    const b = new PeerBudgets(3, 2);
    expect(b.take('a', 0, 0)).toBe(true);
    expect([b.take('a', 1, 0), b.take('a', 1, 0), b.take('a', 1, 0)]).toEqual([true, true, false]);
    expect(b.take('a', 0, 0)).toBe(false); // spent: looking says so
    expect(b.take('b', 0, 0)).toBe(true); // another peer's is whole
    expect(b.take('a', 0, 500)).toBe(true); // half a second: one more
    expect(b.take('a', 0, 60_000)).toBe(true);
  });

  it('remembers at most `peers`, the oldest forgotten first', () => {
    const b = new PeerBudgets(1, 0, 2);
    b.take('a', 1, 0);
    b.take('b', 1, 0);
    expect(b.take('a', 0, 0)).toBe(false);
    b.take('c', 1, 0); // 'b' is now the oldest (a looked again, last)
    expect(b.take('b', 0, 0)).toBe(true);
  });

  it('knows an IPv4 peer by its address, an IPv6 one by its /64', () => {
    expect(peerOf('127.0.0.1')).toBe('127.0.0.1');
    expect(peerOf('::ffff:10.0.0.1')).toBe('::ffff:10.0.0.1');
    expect(peerOf('2001:db8:1:2:aaaa:bbbb:cccc:dddd')).toBe('2001:db8:1:2::/64');
    expect(peerOf('2001:db8:1:2::9')).toBe('2001:db8:1:2::/64');
    expect(peerOf('::1')).toBe('0:0:0:0::/64');
    expect(peerOf(undefined)).toBe('');
  });
});
