import { loopActivity, type LoopResult } from './loop.js';

const now = (): number => Number(process.hrtime.bigint()) / 1e6;

export interface StepLabel {
  concurrency: number;
  rungIndex: number;
  rungs: number;
  rep: number;
  reps: number;
  arm: string;
}

/**
 * The progress line on stderr (stdout carries only the result): on a terminal one line redrawn
 * in place with the current rate; otherwise one line per finished step, for logs.
 */
export class Progress {
  private timer: NodeJS.Timeout | undefined;
  private label = '';
  private t0 = 0;
  private ops0 = 0;
  private readonly started = now();

  constructor(
    private readonly out: NodeJS.WritableStream & { isTTY?: boolean } = process.stderr,
    private readonly enabled = true,
  ) {}

  private get tty(): boolean {
    return !!this.out.isTTY;
  }

  private text(label: StepLabel): string {
    return `rung ${label.concurrency} (${label.rungIndex + 1}/${label.rungs}) rep ${label.rep}/${label.reps} ${label.arm}`;
  }

  private draw(): void {
    const s = (now() - this.t0) / 1000;
    const rate = s > 0 ? Math.round((loopActivity.ops - this.ops0) / s) : 0;
    this.out.write(`\r\x1b[K… ${this.label}: ${s.toFixed(1)} s, ${rate}/s (total ${this.elapsed()})`);
  }

  private elapsed(): string {
    return `${((now() - this.started) / 1000).toFixed(0)} s`;
  }

  /** A step begins: the rate counts the loops' completed operations from here. */
  start(label: StepLabel): void {
    if (!this.enabled) return;
    this.label = this.text(label);
    this.t0 = now();
    this.ops0 = loopActivity.ops;
    if (this.tty) {
      this.draw();
      this.timer = setInterval(() => this.draw(), 250);
      this.timer.unref();
    }
  }

  /** A step ended: its own rate (ops over its loop's wall time, setup excluded). */
  end(r: LoopResult | undefined, failure?: string): void {
    if (!this.enabled) return;
    clearInterval(this.timer);
    this.timer = undefined;
    const what = failure
      ? `failed: ${failure}`
      : r
        ? `${Math.round((r.latenciesMs.length / r.wallMs) * 1000)}/s over ${r.latenciesMs.length} ops in ${(r.wallMs / 1000).toFixed(1)} s`
        : 'done';
    const line = `… ${this.label}: ${what} (total ${this.elapsed()})`;
    this.out.write(this.tty ? `\r\x1b[K${line}` : `${line}\n`);
  }

  /** A free-standing message (setup, skipped baselines). */
  note(text: string): void {
    if (!this.enabled) return;
    this.out.write(this.tty ? `\r\x1b[K… ${text}` : `… ${text}\n`);
  }

  /** Leave the terminal on a fresh line. */
  done(): void {
    if (!this.enabled) return;
    clearInterval(this.timer);
    if (this.tty) this.out.write('\r\x1b[K');
  }
}
