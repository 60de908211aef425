import type { AgentClient } from '../../agent/client.js';
import { recordFailure } from '../../cleanup.js';
import type { SandboxRecord } from '../../store/records.js';
import type { LabContext } from '../context.js';
import { execIn } from '../io/sandbox-ops.js';

/**
 * What a standby runs once before it is ready: the image's shells, `sh` and `bash` where it has
 * one. A sandbox's root is a clone of its image's volume, and a btrfs clone shares the image's
 * blocks but not its page cache (its files are inodes of their own), so the first command in a
 * fresh clone reads the loader, libc and the shell from disk: ~1.6 ms more than the second on a
 * busybox sandbox here. A standby that ran them once hands its taker that cache (docs/pools.md
 * "Warm shells"). Not login shells: a profile could start a process, write a file or reach the
 * network, and all of that would be the taker's; the shells' binaries and libraries are what costs.
 */
const WARM_SHELL = ['/bin/sh', '-c', '[ ! -x /bin/bash ] || /bin/bash -c :'];
const WARM_SHELL_TIMEOUT_MS = 5_000;
/** the exit code of a command that is not there: an image without /bin/sh (distroless) has nothing to warm */
const NOT_FOUND = 127;

/**
 * Run WARM_SHELL in a standby. A failure to run it at all (the agent gone, the machine dead)
 * throws, as any step of a raise does, and the standby is dropped; a shell that fails or outlasts
 * its time leaves a standby that is fine but cold, recorded (a refill's trace: on stderr).
 */
export async function warmShell(ctx: LabContext, record: SandboxRecord, agent: AgentClient): Promise<void> {
  const r = await execIn(ctx, record, agent, WARM_SHELL, { timeoutMs: WARM_SHELL_TIMEOUT_MS });
  if (r.exitCode === 0 || (r.exitCode === NOT_FOUND && !r.timedOut)) return;
  const said = r.timedOut ? `timed out after ${WARM_SHELL_TIMEOUT_MS} ms` : `exit ${r.exitCode}`;
  recordFailure(`warm the shells of standby ${record.name}`, new Error(`${said}: ${r.stderr.toString().trim()}`));
}
