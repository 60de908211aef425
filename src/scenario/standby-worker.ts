/**
 * The process that raises a scenario's standby in the background: `snaplab standby NAME --worker
 * ID`, started detached by a snapshot or a reset (so the command that asked returns at once, and a
 * library user's process need not stay), its output in the scenario's run directory.
 */
import { spawn } from 'node:child_process';
import { openSync, closeSync } from 'node:fs';
import { join } from 'node:path';
import { packageRoot } from '../agent/binary.js';
import { noted } from '../cleanup.js';
import { processStartTime } from '../host/procs.js';
import { SnaplabError } from '../errors.js';
import type { LabContext } from '../lab/context.js';
import { ownerAlive } from '../lab/lifecycle/owner.js';
import { getScenario } from './down.js';
import { ownerDir } from './names.js';
import { removeStandby } from './standby-swap.js';

/** The Node CLI's entry (the bundle): the worker is the snaplab command itself. */
const cliEntry = (): string => join(packageRoot(), 'dist', 'bin', 'snaplab.js');

/**
 * Start the worker that raises the standby of `name` from its latest snapshot, and record it as
 * queued. It is the caller's to know the scenario wants one (standbyWanted).
 */
export async function queueStandby(ctx: LabContext, name: string, snapshot: string): Promise<void> {
  const scn = getScenario(ctx, name);
  const queued = { state: 'queued' as const, snapshot, owner: null, worker: true, at: Date.now() };
  if (!ctx.store.updateScenarioStandby(name, (now) => now === null || now.state === 'failed', queued)) return; // one is there, or being raised
  let log: number | undefined;
  try {
    log = openSync(join(ownerDir(ctx.home, scn.id), 'standby.log'), 'a');
    // the standby command needs the embedded lab: never a daemon's (SNAPLAB_HOST)
    const { SNAPLAB_HOST: _daemon, ...env } = process.env;
    const child = spawn(process.execPath, [cliEntry(), 'standby', name, '--worker', scn.id], {
      detached: true,
      stdio: ['ignore', log, log],
      env: { ...env, SNAPLAB_HOME: ctx.home },
    });
    child.unref();
    if (child.pid === undefined) throw new Error('the worker did not start');
    // its start time as the kernel has it: a pid reused later is not taken for it
    const pid = child.pid;
    const owner = { pid, start: (await processStartTime(pid)) ?? null, op: 'create' as const };
    ctx.store.updateScenarioStandby(name, (now) => now?.state === 'queued' && now.owner === null, { ...queued, owner });
  } catch (e) {
    ctx.store.updateScenarioStandby(name, (now) => now?.state === 'queued', {
      state: 'failed',
      snapshot,
      owner: null,
      reason: `its worker could not be started: ${(e as Error).message}`,
      at: Date.now(),
    });
  } finally {
    if (log !== undefined) closeSync(log);
  }
}

/**
 * Stop a worker raising the standby (SIGTERM to its process group, SIGKILL after 5 s) and
 * remove what it made: before a down, a snapshot, or a reset that will not use it.
 */
export async function cancelStandby(ctx: LabContext, name: string): Promise<void> {
  const st = getScenario(ctx, name).standby;
  if (!st) return;
  const o = st.owner;
  if ((st.state === 'queued' || st.state === 'raising') && o?.pid) {
    if (o.pid === process.pid)
      throw new SnaplabError(
        'SCENARIO_FAILED',
        `this process is raising the standby of ${name}`,
        'wait for its raise to end, then try again',
      );
    // a worker leads its own process group (its helpers go with it); any other raiser alone
    const target = st.worker ? -o.pid : o.pid;
    if (await ownerAlive(o)) signal(target, 'SIGTERM');
    const end = Date.now() + 5000;
    while ((await ownerAlive(o)) && Date.now() < end) await new Promise((r) => setTimeout(r, 50));
    if (await ownerAlive(o)) signal(target, 'SIGKILL');
    const killed = Date.now() + 10_000;
    while ((await ownerAlive(o)) && Date.now() < killed) await new Promise((r) => setTimeout(r, 20));
    if (await ownerAlive(o))
      throw new SnaplabError(
        'SCENARIO_FAILED',
        `the process ${o.pid} raising the standby of ${name} does not end`,
        `see \`ps -o stat,wchan -p ${o.pid}\`; \`snaplab gc\` removes its standby once it is gone`,
      );
  }
  await removeStandby(ctx, getScenario(ctx, name));
}

/** Signal a process (a negative pid: its group); one already gone is no failure. */
function signal(target: number, sig: NodeJS.Signals): void {
  try {
    process.kill(target, sig);
  } catch (e) {
    noted(`signal the standby's raiser ${target}`, 'ESRCH')(e);
  }
}

/**
 * Wait while the standby of `snapshot` is being raised by a live worker (it needs no lock the
 * caller holds), up to `timeoutMs`. A queued one is not waited for: its worker may be waiting for
 * the caller's lock.
 */
export async function waitForRaise(
  ctx: LabContext,
  name: string,
  snapshot: string,
  timeoutMs = 600_000,
): Promise<void> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const st = getScenario(ctx, name).standby;
    if (st?.state !== 'raising' || st.snapshot !== snapshot || !(await ownerAlive(st.owner))) return;
    if (Date.now() > end) return;
    await new Promise((r) => setTimeout(r, 25));
  }
}
