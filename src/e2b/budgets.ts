/**
 * A budget per peer (a token bucket): `burst` at most, refilled `perSecond`. What a peer spends is
 * its own; at most `peers` are remembered (the oldest forgotten first: a full budget again).
 */
export class PeerBudgets {
  private readonly left = new Map<string, { tokens: number; at: number }>();

  constructor(
    private readonly burst: number,
    private readonly perSecond: number,
    private readonly peers = 10_000,
  ) {}

  /** Spend `n` of `peer`'s budget (0: only look); false when it has less than one left after. */
  take(peer: string, n: number, now = Date.now()): boolean {
    const b = this.left.get(peer) ?? { tokens: this.burst, at: now };
    b.tokens = Math.min(this.burst, b.tokens + ((now - b.at) / 1000) * this.perSecond) - n;
    b.at = now;
    this.left.delete(peer); // the newest last
    if (b.tokens < this.burst) this.left.set(peer, b);
    if (this.left.size > this.peers) this.left.delete(this.left.keys().next().value as string);
    return b.tokens >= 1;
  }
}

/** A peer as a budget knows it: an IPv4 address, or an IPv6 one's /64 (one host's to rotate through). */
export function peerOf(address: string | undefined): string {
  const a = address ?? '';
  if (!a.includes(':') || a.startsWith('::ffff:')) return a;
  const full = a.includes('::') ? expandV6(a) : a.split(':');
  return `${full.slice(0, 4).join(':')}::/64`;
}

function expandV6(a: string): string[] {
  const [head, tail] = a.split('::') as [string, string];
  const h = head ? head.split(':') : [];
  const t = tail ? tail.split(':') : [];
  return [...h, ...Array(Math.max(0, 8 - h.length - t.length)).fill('0'), ...t];
}
