export const STDIN_CHUNK = 1024 * 1024;
/**
 * Flow control of stdin (protocol 1.2): at most this much of an exec's stdin may be sent ahead of
 * the agent's STDIN_ACKs; write() says "wait" at it and drained() resolves below half of it. With
 * an older agent (no ACKs) the socket's own queue stands in for it.
 */
export const STDIN_WINDOW = 4 * 1024 * 1024;

/**
 * One exec's stdin under protocol 1.2 credits: what was sent and not yet acknowledged, what waits
 * on the host for room in the window (and goes as ACKs come), and who waits for it to fall.
 */
export class StdinWindow {
  private unacked = 0;
  private readonly backlog: Buffer[] = [];
  private backlogBytes = 0;
  private endPending = false;
  private waiters: (() => void)[] = [];

  constructor(
    /** sends one STDIN frame (empty: end of input) */
    private readonly sendFrame: (b: Buffer) => void,
    /** the exec has ended: nothing more is sent from the backlog */
    private readonly settled: () => boolean,
  ) {}

  /** Queues `buf`; false once the window is full (wait for drained()). */
  write(buf: Buffer): boolean {
    if (buf.length) this.backlog.push(buf);
    this.backlogBytes += buf.length;
    this.pump();
    return this.unacked + this.backlogBytes < STDIN_WINDOW;
  }

  /** End of input, after what still waits for the window. */
  end(): void {
    this.endPending = true;
    this.pump();
  }

  /** The agent took `n` bytes. */
  ack(n: number): void {
    this.unacked = Math.max(0, this.unacked - n);
    this.pump();
    if (this.belowHalf()) this.wake();
  }

  drained(settledOrClosed: boolean): Promise<void> {
    if (settledOrClosed || this.belowHalf()) return Promise.resolve();
    return new Promise<void>((resolve) => this.waiters.push(resolve));
  }

  wake(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  private belowHalf(): boolean {
    return this.unacked + this.backlogBytes < STDIN_WINDOW / 2;
  }

  /** Sends what the window has room for, in frames of at most STDIN_CHUNK; then a pending end. */
  private pump(): void {
    while (this.backlog.length && this.unacked < STDIN_WINDOW && !this.settled()) {
      const room = Math.min(STDIN_CHUNK, STDIN_WINDOW - this.unacked);
      const head = this.backlog[0]!;
      const part = head.length <= room ? head : head.subarray(0, room);
      if (part.length === head.length) this.backlog.shift();
      else this.backlog[0] = head.subarray(room);
      this.backlogBytes -= part.length;
      this.unacked += part.length;
      this.sendFrame(part);
    }
    if (this.endPending && !this.backlog.length) {
      this.endPending = false;
      this.sendFrame(Buffer.alloc(0));
    }
  }
}
