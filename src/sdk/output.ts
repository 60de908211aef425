/**
 * What `exec` and `run` give back: stdout and stderr as strings (UTF-8) by default, as execa,
 * E2B and Testcontainers do, or as Buffers with `encoding: 'buffer'` — in the embedded and the
 * remote library alike. (The layers below keep bytes; the conversion is made here, once.)
 */
import type { ExecResult } from '../lab/io/sandbox-ops.js';

export type Encoding = 'utf8' | 'buffer';

/** A result with its output as text. */
export type Text<R extends { stdout: Buffer; stderr: Buffer }> = Omit<R, 'stdout' | 'stderr'> & {
  stdout: string;
  stderr: string;
};

export type ExecText = Text<ExecResult>;

export function encoded<R extends { stdout: Buffer; stderr: Buffer }>(
  r: R,
  encoding: Encoding | undefined,
): R | Text<R> {
  if (encoding === 'buffer') return r;
  return { ...r, stdout: r.stdout.toString('utf8'), stderr: r.stderr.toString('utf8') };
}
