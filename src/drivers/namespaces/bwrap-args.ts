import { SANDBOX_CAPABILITIES, SYSTEM_CAPABILITIES } from './capabilities.js';

/** Where bwrap binds the agent in a sandbox's /dev for its start, before /run exists. */
export const AGENT_STAGE = '/dev/.snaplab-agent';
/**
 * fds the host's helper passes: the agent writes a byte to READY_FD once it serves; bwrap writes
 * JSON (the sandbox's pid) to INFO_FD; LISTEN_FD is the agent's listening socket, bound by the
 * host at a path the sandbox cannot see.
 */
export const READY_FD = 3;
export const INFO_FD = 4;
export const LISTEN_FD = 5;

/**
 * Where the launcher stages the root filesystem (idmapped) and the agent for a sandbox in a user
 * namespace: a tmpfs over /tmp in the launch's own mount namespace (native/userns.h).
 */
export const STAGED_ROOT = '/tmp/snaplab-root';
export const STAGED_AGENT = '/tmp/snaplab-agent';

export interface BwrapInput {
  rootfs: string;
  agentBinary: string;
  /** in a user namespace: bind the staged root and agent, not the host paths */
  staged?: boolean;
  hostname: string;
  /** the launcher already put the process in a network namespace snaplab made: do not make one */
  sharedNetns?: boolean;
}

/**
 * bubblewrap arguments for one sandbox: new pid, mount, uts, ipc, net and cgroup namespaces;
 * the host's run directory is not mounted inside (the agent's socket is handed over as an fd);
 * the agent is PID 1 (--as-pid-1, it reaps); only loopback networking; the documented
 * capability set; a clean environment.
 */
export function bwrapArgs(i: BwrapInput): string[] {
  const caps = SANDBOX_CAPABILITIES.flatMap((c) => ['--cap-add', c]);
  return [
    '--unshare-pid',
    '--unshare-ipc',
    '--unshare-uts',
    ...(i.sharedNetns ? [] : ['--unshare-net']),
    '--unshare-cgroup',
    '--as-pid-1',
    '--new-session',
    '--clearenv',
    '--hostname',
    i.hostname,
    '--bind',
    i.staged ? STAGED_ROOT : i.rootfs,
    '/',
    '--proc',
    '/proc',
    // a tmpfs with the host's harmless devices bound in, a devpts instance of its own, and /dev/shm,
    // a directory of that tmpfs: the agent binds it over itself (writable, mode 1777) before it makes
    // /dev read-only, and caps the tmpfs at 64 MiB (shm_in_dev, native/sandbox.c). Not a tmpfs of its
    // own: every superblock costs each memory cgroup on the host (SANDBOX_SUPERBLOCKS, host/limits.ts)
    '--dev',
    '/dev',
    // POSIX message queues of the sandbox's IPC namespace, visible so that a pool can check none is
    // left (no superblock added: the kernel makes the namespace's mqueue instance with it)
    '--mqueue',
    '/dev/mqueue',
    // (the agent makes the device nodes and /dev itself read-only, and masks /proc: harden_proc in
    // native/sandbox.c)
    // /run is a directory of /dev's tmpfs that the agent binds at /run (run_in_dev, native/sandbox.c),
    // as on a booted machine an in-memory one: nothing of snaplab's lands in the root filesystem, and
    // no superblock of its own. Until then the agent waits at AGENT_STAGE, in /dev
    '--ro-bind',
    i.staged ? STAGED_AGENT : i.agentBinary,
    AGENT_STAGE,
    '--chdir',
    '/',
    '--cap-drop',
    'ALL',
    ...caps,
    // for the agent alone, and only until it has made /proc/sys read-only (see harden_proc)
    '--cap-add',
    'CAP_SYS_ADMIN',
    '--info-fd',
    String(INFO_FD),
    AGENT_STAGE,
    'serve',
    '--listen-fd',
    String(LISTEN_FD),
    '--ready-fd',
    String(READY_FD),
    '--caps',
    SANDBOX_CAPABILITIES.join(','),
    '--harden-proc',
    '--run-in-dev',
    AGENT_STAGE,
  ];
}

/**
 * A system machine's launch (native/boot.c): no bubblewrap, whose no_new_privs and nosuid binds
 * would keep sudo from ever working. The agent binary itself, staged by the launcher, makes the
 * namespaces and mounts and execs the image's init as PID 1, the agent beside it.
 */
export function bootArgs(i: {
  hostname: string;
  sharedNetns: boolean;
  init: string[];
  cgroups: { payload: string; agent: string };
}): string[] {
  return [
    STAGED_AGENT,
    'boot',
    '--root',
    STAGED_ROOT,
    '--agent',
    STAGED_AGENT,
    '--hostname',
    i.hostname,
    ...(i.sharedNetns ? [] : ['--net']),
    '--caps',
    SYSTEM_CAPABILITIES.join(','),
    '--cgroup',
    i.cgroups.payload,
    '--agent-cgroup',
    i.cgroups.agent,
    '--',
    ...i.init,
  ];
}
