import type { AgentClient } from '../../agent/client.js';
import { bestEffort } from '../../cleanup.js';
import type { SandboxRecord } from '../../store/records.js';
import type { LabContext } from '../context.js';
import { execIn } from '../io/sandbox-ops.js';

/**
 * What a standby runs once before it is ready: the image's login shells, `sh` and `bash` where it
 * has one. A sandbox's root is a clone of its image's volume, and a btrfs clone shares the image's
 * blocks but not its page cache (its files are inodes of their own), so the first command in a
 * fresh clone reads the shell, the loader and libc from disk: ~1.7 ms more than the second on a
 * busybox sandbox here, ~2 ms for Debian's `bash -l`. A standby that ran them once hands its taker
 * that cache: the first command of every front (E2B's `/bin/bash -l -c`, a CLI exec) runs as the
 * second would. docs/pools.md "Warm shells".
 */
export const WARM_SHELL = ['/bin/sh', '-l', '-c', '[ ! -x /bin/bash ] || /bin/bash -l -c :'];
const WARM_SHELL_TIMEOUT_MS = 10_000;

/**
 * Run WARM_SHELL in a standby. Best effort: an image without /bin/sh, a profile that fails or
 * outlasts its time, is a standby as it was (the failure is noted in the refill's trace).
 */
export async function warmShell(ctx: LabContext, record: SandboxRecord, agent: AgentClient): Promise<void> {
  await bestEffort(`warm the shells of standby ${record.name}`, () =>
    execIn(ctx, record, agent, WARM_SHELL, { timeoutMs: WARM_SHELL_TIMEOUT_MS }),
  );
}
