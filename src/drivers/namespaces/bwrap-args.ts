import { SANDBOX_CAPABILITIES } from './capabilities.js';

/** Where the host's per-sandbox run directory appears inside the sandbox. */
export const GUEST_RUN_DIR = '/run/snaplab';
export const GUEST_AGENT = `${GUEST_RUN_DIR}/agent`;
export const GUEST_SOCKET = `${GUEST_RUN_DIR}/agent.sock`;
/** fds the host passes: the agent writes a byte to READY_FD once it listens; bwrap writes JSON to INFO_FD. */
export const READY_FD = 3;
export const INFO_FD = 4;

export interface BwrapInput {
  rootfs: string;
  runDir: string;
  agentBinary: string;
  hostname: string;
}

/**
 * bubblewrap arguments for one sandbox: new pid, mount, uts, ipc, net and cgroup namespaces;
 * the agent is PID 1 (--as-pid-1, it reaps); only loopback networking; the documented
 * capability set; a clean environment.
 */
export function bwrapArgs(i: BwrapInput): string[] {
  const caps = SANDBOX_CAPABILITIES.flatMap((c) => ['--cap-add', c]);
  return [
    '--unshare-pid',
    '--unshare-ipc',
    '--unshare-uts',
    '--unshare-net',
    '--unshare-cgroup',
    '--as-pid-1',
    '--new-session',
    '--clearenv',
    '--hostname', i.hostname,
    '--bind', i.rootfs, '/',
    '--proc', '/proc',
    '--dev', '/dev',
    '--bind', i.runDir, GUEST_RUN_DIR,
    '--ro-bind', i.agentBinary, GUEST_AGENT,
    '--chdir', '/',
    '--cap-drop', 'ALL',
    ...caps,
    '--info-fd', String(INFO_FD),
    GUEST_AGENT, 'serve',
    '--socket', GUEST_SOCKET,
    '--ready-fd', String(READY_FD),
    '--caps', SANDBOX_CAPABILITIES.join(','),
  ];
}
