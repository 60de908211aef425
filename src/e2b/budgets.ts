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
