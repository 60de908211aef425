import { spawn } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import type { Readable } from 'node:stream';
import { agentBinaryPath } from '../../agent/binary.js';
import { SnaplabError } from '../../errors.js';
import { logTail, vmFiles } from './launch.js';

/**
 * Start the VM's relay (`snaplab-agent relay`, native/relay.c): it takes the VM's one chardev
 * connection, RESETs the guest's session and serves any number of host processes on
 * `relay.sock`. Started inside the sandbox's cgroup like QEMU (destroyed and collected with it),
 * detached so that it outlives this process; it exits when QEMU does. Resolves once the guest's
 * agent has answered through it.
 */
export async function startRelay(runDir: string, qemuPid: number, cgroupProcs: string[], timeoutMs: number): Promise<void> {
  const f = vmFiles(runDir);
  const log = openSync(f.relayLog, 'a');
  const joinCgroup = 'for f in $SNAPLAB_CGROUP_PROCS; do echo $$ > "$f" || exit 125; done; exec "$@"';
  const child = spawn('/bin/sh', ['-c', joinCgroup, 'snaplab-relay', agentBinaryPath(), 'relay', '--connect', f.chardev, '--listen', f.relay, '--pid', String(qemuPid), '--ready-fd', '3'], {
    stdio: ['ignore', log, log, 'pipe'],
    detached: true,
    env: { ...process.env, SNAPLAB_CGROUP_PROCS: cgroupProcs.join(' ') },
  });
  closeSync(log);
  const ready = child.stdio[3] as Readable;
  try {
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new SnaplabError('TIMEOUT', `the VM's agent did not answer within ${timeoutMs} ms`, 'see the guest console in the error, or raise the memory (--memory)')), timeoutMs);
      const done = (e?: Error): void => {
        clearTimeout(timer);
        if (e) reject(e);
        else resolve();
      };
      ready.once('data', () => done());
      child.once('error', (e) => done(new SnaplabError('LAUNCH_FAILED', `cannot start the VM's relay: ${e.message}`, 'make -C native')));
      child.once('exit', (code) =>
        done(
          code === 125
            ? new SnaplabError('CGROUP_FAILED', 'the VM\'s relay could not join the sandbox\'s cgroup', 'run `snaplab doctor`')
            : new SnaplabError('LAUNCH_FAILED', `the VM's relay exited ${code ?? 'on a signal'} before the agent answered`, 'check the VM settings (--memory at least 64M) and the image'),
        ),
      );
    });
  } catch (e) {
    try { if (child.pid) process.kill(child.pid, 'SIGKILL'); } catch { /* gone */ }
    const err = e as SnaplabError;
    throw new SnaplabError(err.code, `${err.message}:\n${await logTail(runDir)}`, err.hint);
  } finally {
    child.removeAllListeners('exit');
    ready.destroy();
    child.unref();
  }
}
