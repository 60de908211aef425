import { spawn } from 'node:child_process';
import { closeSync, openSync, readFileSync } from 'node:fs';
import type { Readable } from 'node:stream';
import { SnaplabError } from '../../errors.js';
import { INFO_FD, READY_FD } from './bwrap-args.js';

export interface LaunchResult {
  /** host pid of the sandbox's PID 1 (the agent) */
  agentPid: number;
  /** monotonic ms when bwrap reported the namespaces made, and when the agent listened */
  namespacesAt: number;
  readyAt: number;
}

const now = (): number => Number(process.hrtime.bigint()) / 1e6;

/**
 * Start the launcher (which joins the cgroups, then execs bwrap, which execs the agent) detached
 * from this process, and wait until the agent listens. The sandbox outlives the CLI that made it.
 */
export function launch(argv: string[], logFile: string, timeoutMs: number, signal?: AbortSignal): Promise<LaunchResult> {
  const log = openSync(logFile, 'a');
  const child = spawn(argv[0]!, argv.slice(1), {
    detached: true,
    stdio: ['ignore', log, log, 'pipe', 'pipe'],
    env: {},
  });
  closeSync(log);
  const ready = child.stdio[READY_FD] as Readable;
  const info = child.stdio[INFO_FD] as Readable;

  return new Promise<LaunchResult>((resolve, reject) => {
    let infoText = '';
    let agentPid = 0;
    let namespacesAt = 0;
    let done = false;
    const finish = (err?: Error, res?: LaunchResult): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      ready.destroy();
      info.destroy();
      child.removeAllListeners('exit');
      child.unref();
      if (err) {
        if (child.pid) try { process.kill(-child.pid, 'SIGKILL'); } catch { /* gone already */ }
        reject(err);
      } else resolve(res!);
    };
    const logTail = (): string => {
      try {
        return readFileSync(logFile, 'utf8').trim().split('\n').slice(-5).join('\n');
      } catch {
        return '';
      }
    };
    const onAbort = (): void => finish(new SnaplabError('ABORTED', 'raise aborted'));
    signal?.addEventListener('abort', onAbort);
    const timer = setTimeout(
      () => finish(new SnaplabError('TIMEOUT', `the sandbox's agent did not start within ${timeoutMs} ms`, `see ${logFile}`)),
      timeoutMs,
    );
    info.on('data', (b: Buffer) => {
      infoText += b.toString();
      const m = /"child-pid"\s*:\s*(\d+)/.exec(infoText);
      if (m && !agentPid) {
        agentPid = Number(m[1]);
        namespacesAt = now();
      }
    });
    ready.once('data', () => {
      const readyAt = now();
      if (!agentPid) {
        finish(new SnaplabError('LAUNCH_FAILED', 'bwrap did not report the sandbox pid', `see ${logFile}`));
        return;
      }
      finish(undefined, { agentPid, namespacesAt: namespacesAt || readyAt, readyAt });
    });
    child.on('error', (e) => finish(new SnaplabError('LAUNCH_FAILED', `cannot start the launcher: ${e.message}`, 'run `snaplab doctor`')));
    child.on('exit', (code, sig) => {
      const why = sig ? `killed by ${sig}` : `exited with ${code}`;
      finish(new SnaplabError('LAUNCH_FAILED', `the sandbox launcher ${why}: ${logTail() || 'no output'}`, 'run `snaplab doctor` to check bubblewrap and cgroups'));
    });
  });
}
