import type { AgentClient } from '../../agent/client.js';
import { SnaplabError } from '../../errors.js';
import { DEFAULT_ENV } from '../io/exec.js';

/** Where an image's systemd is, relative to its tree (Debian's, merged /usr or not). */
export const SYSTEMD_PATHS = ['lib/systemd/systemd', 'usr/lib/systemd/systemd'];

/** How long a system machine's systemd may take to come up (emulated or loaded hosts are slow). */
export const SYSTEM_BOOT_TIMEOUT_MS = 120_000;

export interface SystemState {
  /** systemctl is-system-running: running or degraded */
  state: 'running' | 'degraded';
  /** the units that failed, when degraded */
  failed: string[];
}

async function inMachine(
  agent: AgentClient,
  argv: string[],
  timeoutMs: number,
): Promise<{ code: number; out: string }> {
  const r = await agent.exec({ argv, env: DEFAULT_ENV, timeoutMs }).result;
  return { code: r.exitCode, out: `${r.stdout.toString()}${r.stderr.toString()}`.trim() };
}

/**
 * A system machine is usable once its systemd says the system is up: `systemctl
 * is-system-running --wait` answers running or degraded (then with the failed units' names).
 * Anything else (maintenance, stopping, no answer in time) fails the raise with the journal's end.
 */
export async function waitSystemRunning(agent: AgentClient, timeoutMs = SYSTEM_BOOT_TIMEOUT_MS): Promise<SystemState> {
  // until systemd's private socket exists, systemctl answers "offline" at once, --wait or not
  // ("Failed to connect to bus" before systemd 257, "… to system scope bus via local transport" from it)
  const deadline = Date.now() + timeoutMs;
  let r: { code: number; out: string };
  let state: string;
  for (;;) {
    r = await inMachine(agent, ['systemctl', 'is-system-running', '--wait'], Math.max(1, deadline - Date.now()));
    state = r.out.split('\n').pop() ?? '';
    if (!/^offline$|Failed to connect to (system scope )?bus/.test(state) || Date.now() > deadline) break;
    await new Promise((done) => setTimeout(done, 20));
  }
  if (state === 'running') return { state, failed: [] };
  if (state === 'degraded') {
    const failed = await inMachine(agent, ['systemctl', '--failed', '--plain', '--no-legend', '--no-pager'], 10_000);
    return {
      state,
      failed: failed.out
        .split('\n')
        .map((l) => l.trim().split(/\s+/)[0]!)
        .filter(Boolean),
    };
  }
  const journal = await inMachine(
    agent,
    ['sh', '-c', 'echo "PID 1: $(cat /proc/1/comm)"; journalctl -b -n 15 --no-pager -o cat'],
    10_000,
  ).catch(() => ({ out: '' }));
  throw new SnaplabError(
    'LAUNCH_FAILED',
    `the machine's systemd did not come up (${state || (r.code === 124 ? `no answer in ${timeoutMs / 1000} s` : `exit ${r.code}`)}); the journal's end:\n${journal.out}`,
    'does the image have systemd (image build debian --packages systemd,systemd-sysv)? the machine was removed; `snaplab trace` shows where its time went (scenarios: `up --keep-on-failure` keeps it)',
  );
}
