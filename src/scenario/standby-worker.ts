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
import { processStartTime, sameProcess } from '../host/procs.js';
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
  if (
    !ctx.store.updateScenarioStandby(name, (now) => now === null || now.state === 'failed', {
      state: 'queued',
      snapshot,
      owner: null,
    })
  )
    return; // one is there, or being raised
  const log = openSync(join(ownerDir(ctx.home, scn.id), 'standby.log'), 'a');
  try {
    const child = spawn(process.execPath, [cliEntry(), 'standby', name, '--worker', scn.id], {
      detached: true,
      stdio: ['ignore', log, log],
      env: { ...process.env, SNAPLAB_HOME: ctx.home },
    });
    child.unref();
    if (child.pid === undefined) throw new Error('the worker did not start');
    // its start time as the kernel has it: a pid reused later is not taken for it
    const pid = child.pid;
    ctx.store.updateScenarioStandby(name, (now) => now?.state === 'queued' && now.owner === null, {
      state: 'queued',
      snapshot,
      owner: { pid, start: (await processStartTime(pid)) ?? null, op: 'create' },
    });
  } catch (e) {
    ctx.store.setScenarioStandby(name, { state: 'failed', snapshot, owner: null, reason: (e as Error).message });
  } finally {
    closeSync(log);
  }
}

/**
 * Stop a worker raising the standby (SIGTERM to its process group, SIGKILL after 5 s) and
 * remove what it made: before a down, a snapshot, or a reset that will not use it.
 */
export async function cancelStandby(ctx: LabContext, name: string): Promise<void> {
  const scn = getScenario(ctx, name);
  const st = scn.standby;
  if (!st) return;
  const o = st.owner;
  if ((st.state === 'queued' || st.state === 'raising') && o?.pid && (await ownerAlive(o))) {
    signal(o.pid, 'SIGTERM');
    const end = Date.now() + 5000;
    while ((await ownerAlive(o)) && Date.now() < end) await new Promise((r) => setTimeout(r, 50));
    if (await ownerAlive(o)) signal(o.pid, 'SIGKILL');
    while (o.start !== null && (await sameProcess(o.pid, o.start))) await new Promise((r) => setTimeout(r, 20));
  }
  await removeStandby(ctx, getScenario(ctx, name));
}

function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(-pid, sig);
  } catch (e) {
    noted(`signal the standby worker ${pid}`, 'ESRCH')(e);
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
