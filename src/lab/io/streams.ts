/**
 * Streams into and out of an exec with flow control both ways: the two halves every copy,
 * forwarded port and terminal is made of.
 */
import type { Readable, Writable } from 'node:stream';
import type { AgentClient } from '../../agent/client.js';

/** What feeds a command's stdin: an exec handle's input side. */
export interface ExecInput {
  write(b: Buffer): boolean;
  drained(): Promise<void>;
  end(): void;
}

/**
 * Feeds data, or a stream, to a command's stdin: the stream is paused while the exec's window
 * is full, and its end is the command's end of input, also when that came before this was called.
 * Its failure, or its going without an end, is `broken` (default: the end of input too; a file
 * write stops its writer instead, so the part that came is not kept).
 */
export function feedInput(h: ExecInput, input: string | Buffer | Readable, broken: () => void = () => h.end()): void {
  if (typeof input === 'string' || Buffer.isBuffer(input)) {
    if (input.length) h.write(Buffer.from(input));
    h.end();
    return;
  }
  let ended = false;
  input.on('data', (b: Buffer | string) => {
    if (h.write(Buffer.from(b))) return;
    input.pause();
    void h.drained().then(() => input.resume());
  });
  input.on('end', () => {
    ended = true;
    h.end();
  });
  const broke = (): void => {
    if (!ended) broken();
  };
  input.on('error', broke);
  input.on('close', broke);
  if (input.readableEnded) h.end();
  else if (input.destroyed) broke();
}

/**
 * An onStdout that writes a command's output into `sink`, pausing the agent connection while the
 * sink is full. When the sink fails or goes, reading resumes (else the EXIT would wait behind a
 * pause that no 'drain' will lift) and `gone` runs, once.
 */
export function outputTo(agent: AgentClient, sink: Writable, gone: () => void): (b: Buffer) => void {
  let lost = false;
  const lose = (): void => {
    if (lost) return;
    lost = true;
    agent.pauseOutput(false);
    gone();
  };
  sink.on('error', lose);
  sink.on('close', lose);
  return (b) => {
    if (lost || sink.destroyed) return lose();
    if (sink.write(b)) return;
    agent.pauseOutput(true);
    sink.once('drain', () => agent.pauseOutput(false));
  };
}
