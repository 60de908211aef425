import { SnaplabError } from './errors.js';
import { Trace } from './timing/trace.js';

/**
 * Best-effort steps: cleanup that must not fail the operation, and reads whose failure has a
 * meaning. None of these throws. A failure that is an expected outcome (the codes a caller
 * names, e.g. ENOENT for something that may already be gone) is the answer and is not recorded;
 * any other is recorded, never swallowed: as a mark in the trace of the operation running now
 * (Trace.current(): a phase, or the whole of `Lab.context.traced`), which is stored with the
 * operation, or, outside one, as a line on stderr, `snaplab: cleanup: <what>: <message>` (the
 * daemon's stderr is its log). Biome's plugin lint/no-silent-catch.grit flags a bare `.catch(() => undefined)`.
 */

/** What a failure said: a SnaplabError's code and message, an errno error's message. */
export function describeFailure(e: unknown): string {
  if (e instanceof SnaplabError) return `${e.code}: ${e.message}`;
  return e instanceof Error ? e.message : String(e);
}

/** Whether `e`, or an error it was made from (a cgroup error made from ENOENT), has one of `codes`. */
function expected(e: unknown, codes: readonly string[]): boolean {
  for (let x = e, depth = 0; x instanceof Error && depth < 4; x = x.cause, depth++) {
    const code = (x as { code?: unknown }).code;
    if (typeof code === 'string' && codes.includes(code)) return true;
  }
  return false;
}

/** Record that the best-effort step `what` failed with `e` (see above for where). */
export function recordFailure(what: string, e: unknown, trace: Trace | undefined = Trace.current()): void {
  const failed = describeFailure(e);
  if (trace?.note(what, failed)) return;
  process.stderr.write(`snaplab: cleanup: ${what}: ${failed}\n`);
}

/**
 * Write on stderr the failures recorded in a trace that is not stored (a pool's background
 * refill): recorded there, they were lost. The trace is finished first, so that a later record
 * goes to stderr at once.
 */
export function tellUnkept(trace: Trace): void {
  for (const p of trace.finish().phases)
    if (p.failed && p.name.startsWith('cleanup: ')) process.stderr.write(`snaplab: ${p.name}: ${p.failed}\n`);
}

/** A `.catch` callback for a cleanup step: `rm(x).catch(noted('remove x', 'ENOENT'))`. */
export function noted(what: string, ...expectedCodes: string[]): (e: unknown) => void {
  const trace = Trace.current();
  return (e) => {
    if (!expected(e, expectedCodes)) recordFailure(what, e, trace ?? Trace.current());
  };
}

/** Run a cleanup step that must not fail the caller: `await bestEffort('remove x', () => rm(x))`. */
export async function bestEffort(what: string, fn: () => unknown, ...expectedCodes: string[]): Promise<void> {
  try {
    await fn();
  } catch (e) {
    if (!expected(e, expectedCodes)) recordFailure(what, e);
  }
}

/**
 * A `.catch` callback for a read whose expected failure has a meaning: `value` for the codes
 * named (`readdir(d).catch(orElse([], 'list d', 'ENOENT'))`: no directory, no entries); any other
 * failure is recorded and answers `value` too, as it did before it was recorded.
 */
export function orElse<T>(value: T, what: string, ...expectedCodes: string[]): (e: unknown) => T {
  const trace = Trace.current();
  return (e) => {
    if (!expected(e, expectedCodes)) recordFailure(what, e, trace ?? Trace.current());
    return value;
  };
}

/**
 * A `.catch` callback for a probe whose every failure is an answer (`isFrozen(cg)` failing means
 * not frozen): nothing to record. Use `orElse` when only some failures are.
 */
export function failureMeans<T>(value: T): () => T {
  return () => value;
}

/**
 * A `.catch` callback for a promise whose failure is reported by its owner (who awaits it
 * elsewhere): attached so that a rejection before then is not an unhandled one that ends the
 * process, or awaited here only to wait until it has settled.
 */
export function handledElsewhere(): void {}
