import { spawn } from 'node:child_process';
import { closeSync, existsSync, openSync } from 'node:fs';
import { readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import { hostAgentBinaryPath } from '../../agent/binary.js';
import { SnaplabError } from '../../errors.js';
import { deadline } from '../../timing/deadline.js';
import { logTail, vmFiles } from './launch.js';
import { orElse } from '../../cleanup.js';

/**
 * Start the VM's relay (`snaplab-agent relay`, native/relay.c): it takes the VM's one chardev
 * connection, RESETs the guest's session and serves any number of host processes on
 * `relay.sock`. Started inside the sandbox's cgroup like QEMU (destroyed and collected with it),
 * detached so that it outlives this process; it exits when QEMU does. Resolves once the guest's
 * agent has answered through it.
 */
export async function startRelay(
  runDir: string,
  qemuPid: number,
  cgroupProcs: string[],
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<void> {
  signal?.throwIfAborted();
  const f = vmFiles(runDir);
  const relay = hostAgentBinaryPath(); // (before the log is opened: a missing build throws)
  const log = openSync(f.relayLog, 'a');
  const joinCgroup = 'for f in $SNAPLAB_CGROUP_PROCS; do echo $$ > "$f" || exit 125; done; exec "$@"';
  const child = spawn(
    '/bin/sh',
    [
      '-c',
      joinCgroup,
      'snaplab-relay',
      relay,
      'relay',
      '--connect',
      f.chardev,
      '--listen',
      f.relay,
      '--pid',
      String(qemuPid),
      '--ready-fd',
      '3',
    ],
    {
      stdio: ['ignore', log, log, 'pipe'],
      detached: true,
      env: { ...process.env, SNAPLAB_CGROUP_PROCS: cgroupProcs.join(' ') },
    },
  );
  closeSync(log);
  const ready = child.stdio[3] as Readable;
  try {
    await new Promise<void>((resolve, reject) => {
      const timer = deadline(timeoutMs, () =>
        reject(
          new SnaplabError(
            'TIMEOUT',
            `the VM's agent did not answer within ${timeoutMs} ms`,
            'see the guest console in the error, or raise the memory (--memory)',
          ),
        ),
      );
      // an abort ends the wait at once: the caller's destroy kills QEMU, this relay is killed below
      const aborted = (): void => done(signal?.reason as Error);
      const done = (e?: Error): void => {
        timer.clear();
        signal?.removeEventListener('abort', aborted);
        if (e) reject(e);
        else resolve();
      };
      signal?.addEventListener('abort', aborted, { once: true });
      ready.once('data', () => done());
      child.once('error', (e) =>
        done(
          new SnaplabError('LAUNCH_FAILED', `cannot start the VM's relay: ${e.message}`, 'make -C native', {
            cause: e,
          }),
        ),
      );
      child.once('exit', (code) =>
        done(
          code === 125
            ? new SnaplabError(
                'CGROUP_FAILED',
                "the VM's relay could not join the sandbox's cgroup",
                'run `snaplab doctor`',
              )
            : new SnaplabError(
                'LAUNCH_FAILED',
                `the VM's relay exited ${code ?? 'on a signal'} before the agent answered`,
                'check the VM settings and the image (the guest console above says why it stopped)',
              ),
        ),
      );
    });
  } catch (e) {
    try {
      if (child.pid) process.kill(child.pid, 'SIGKILL');
    } catch {
      /* gone */
    }
    if (signal?.aborted && e === signal.reason) throw e;
    const err = e as SnaplabError;
    throw new SnaplabError(err.code, `${err.message}:\n${await logTail(runDir)}`, err.hint, { cause: e });
  } finally {
    child.removeAllListeners('exit');
    ready.destroy();
    child.unref();
  }
  // the shell exec'd the relay: same pid. Recorded so that pause and resume can signal it.
  await writeFile(relayPidFile(runDir), String(child.pid));
}

const relayPidFile = (runDir: string): string => join(runDir, 'relay.pid');

/** The VM's relay's pid, if it is running (checked by its command line, not just the number). */
async function relayPid(runDir: string): Promise<number | undefined> {
  const pid = Number(await readFile(relayPidFile(runDir), 'utf8').catch(orElse('', 'readFile', 'ENOENT')));
  if (!pid) return undefined;
  const cmd = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(orElse('', 'readFile', 'ENOENT', 'ESRCH'));
  return cmd.includes('\0relay\0') && cmd.includes(vmFiles(runDir).relay) ? pid : undefined;
}

/**
 * Hold what the relay sends to the VM (and what it reads from it), and wait until QEMU has taken
 * what was already sent: then nothing from the host moves into the guest's memory while it is
 * stopped, and a memory snapshot's RAM copy agrees with its device state. The hold is a file the
 * relay reads on SIGUSR1 (a state, not a signal pair: signals merge and reorder). Throws when the
 * relay does not confirm in time.
 */
export async function holdRelay(runDir: string, timeoutMs = 2000): Promise<void> {
  const f = vmFiles(runDir);
  await writeFile(`${f.relay}.hold`, '');
  const pid = await relayPid(runDir);
  if (!pid) return; // no relay: nothing writes to the VM (a new one starts held)
  process.kill(pid, 'SIGUSR1');
  const end = Date.now() + timeoutMs;
  while (!existsSync(`${f.relay}.held`)) {
    if (Date.now() > end) {
      await releaseRelay(runDir);
      throw new SnaplabError(
        'VM_ERROR',
        `the VM's relay did not stop its traffic within ${timeoutMs} ms`,
        "retry; if it persists, see relay.log in the VM's run directory",
      );
    }
    await new Promise((r) => setTimeout(r, 2));
  }
}

/** Let the relay write to the VM again. */
export async function releaseRelay(runDir: string): Promise<void> {
  await rm(`${vmFiles(runDir).relay}.hold`, { force: true });
  const pid = await relayPid(runDir);
  if (pid) process.kill(pid, 'SIGUSR1');
}
