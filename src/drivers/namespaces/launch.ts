import { readFileSync } from 'node:fs';
import { SnaplabError } from '../../errors.js';
import { HostOpError, type HostOps } from '../../host/hostops.js';

/** A user namespace for the launch: ids 0..count-1 inside are base.. outside (native/userns.c). */
export interface UsernsLaunch {
  base: number;
  count: number;
  /** staged, idmapped, where bwrap finds it (bwrap-args.ts STAGED_ROOT) */
  rootfs: string;
  /** instead of rootfs: an overlay of these, mounted inside the namespace */
  stack?: { lowers: string[]; upper: string; work: string };
  agent: string;
  /** a system machine's tree: setuid works in it (its root is the namespace's) */
  allowSuid?: boolean;
}

export interface LaunchResult {
  /** host pid of the sandbox's PID 1 (the agent) */
  agentPid: number;
  /** monotonic ms when bwrap reported the namespaces made, and when the agent served */
  namespacesAt: number;
  readyAt: number;
}

const ETIMEDOUT = 110;

function logTail(file: string): string {
  try {
    return readFileSync(file, 'utf8').trim().split('\n').slice(-5).join('\n');
  } catch {
    return '';
  }
}

/**
 * Launch through the resident helper: it double-forks (the sandbox is nobody's child here), joins
 * the cgroups in the child and execs bwrap, then reports when bwrap made the namespaces and when
 * the agent listened, on the same monotonic clock as our traces.
 */
export async function launchNative(
  ops: HostOps,
  opts: {
    socket: string;
    netns?: string;
    userns?: UsernsLaunch;
    cgroupProcs: string[];
    argv: string[];
    logFile: string;
    timeoutMs: number;
    /** argv is bwrap's: let its monitor go once the agent serves (native/hostops.c drop_monitor) */
    dropMonitor?: boolean;
  },
): Promise<LaunchResult> {
  const { socket, cgroupProcs, argv, logFile, timeoutMs, userns } = opts;
  const root = userns?.stack
    ? ['overlay', String(userns.stack.lowers.length), ...userns.stack.lowers, userns.stack.upper, userns.stack.work]
    : [userns?.rootfs ?? ''];
  const us = userns
    ? [`${userns.base}:${userns.count}${userns.allowSuid ? ':suid' : ''}`, ...root, userns.agent]
    : ['-'];
  try {
    const [pid, tNs, tReady] = await ops.request(
      opts.dropMonitor ? 'launch-bwrap' : 'launch',
      logFile,
      String(timeoutMs),
      socket,
      opts.netns ?? '-',
      ...us,
      String(cgroupProcs.length),
      ...cgroupProcs,
      ...argv,
    );
    return { agentPid: Number(pid), namespacesAt: Number(BigInt(tNs!)) / 1e6, readyAt: Number(BigInt(tReady!)) / 1e6 };
  } catch (e) {
    if (!(e instanceof HostOpError)) throw e;
    if (e.errno === ETIMEDOUT)
      throw new SnaplabError('TIMEOUT', `the sandbox's agent did not start within ${timeoutMs} ms`, `see ${logFile}`, {
        cause: e,
      });
    const tail = logTail(logFile);
    // the step that failed is the last line the launcher, bwrap or the agent wrote
    // (native/userns.c, serve.c, boot.c: "snaplab-agent: harden /proc: remount … : EPERM")
    const step =
      tail
        .split('\n')
        .reverse()
        .find((l) => /^(snaplab-|bwrap:)/.test(l)) ?? tail;
    const hint = /user namespace/.test(tail)
      ? '`snaplab doctor` checks user namespaces and idmapped mounts on each storage backend; `--no-userns` runs without one (root inside is then host root)'
      : 'run `snaplab doctor`: it starts a sandbox as a create does and reports what fails';
    throw new SnaplabError(
      'LAUNCH_FAILED',
      `${e.message}: ${step || 'no output'}`,
      `${hint}; the sandbox's log: ${logFile}`,
      { cause: e },
    );
  }
}
