import { SnaplabError } from '../errors.js';

/**
 * Calls under way for a sandbox (a command's start, a watcher's), so that one whose sandbox the
 * front forgot while it ran (killed, stopped, gone) is seen when it returns: what it made is then
 * let go, not kept under a sandbox nothing will forget again.
 */
/**
 * What a call answers when its sandbox was forgotten while it ran: stopped, not "not found" (a
 * pause that keeps its files forgets too, and its session stays); the front answers it 502.
 */
export const forgottenMeanwhile = (sandbox: string, what: string): SnaplabError =>
  new SnaplabError('SANDBOX_STOPPED', `sandbox ${sandbox} ended or stopped while ${what}`, 'connect to it again');

export class Underway {
  private readonly bySandbox = new Map<string, Set<{ forgotten: boolean }>>();

  /** `f`'s value, and whether `sandbox` was forgotten while it ran. */
  async run<T>(sandbox: string, f: () => Promise<T>): Promise<{ value: T; forgotten: boolean }> {
    const call = { forgotten: false };
    let calls = this.bySandbox.get(sandbox);
    if (!calls) this.bySandbox.set(sandbox, (calls = new Set()));
    calls.add(call);
    try {
      const value = await f();
      return { value, forgotten: call.forgotten };
    } finally {
      calls.delete(call);
      if (!calls.size && this.bySandbox.get(sandbox) === calls) this.bySandbox.delete(sandbox);
    }
  }

  forget(sandbox: string): void {
    for (const call of this.bySandbox.get(sandbox) ?? []) call.forgotten = true;
  }
}
