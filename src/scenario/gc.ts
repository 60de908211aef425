import { existsSync } from 'node:fs';
import { readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { deleteNetns, listSnaplabNetns } from '../host/net/netns.js';
import { ownerAlive } from '../lab/lifecycle/owner.js';
import type { LabContext } from '../lab/context.js';
import { getScenario, teardownScenario } from './down.js';
import { finishSwap, removeSetAside, removeStandby } from './standby-swap.js';
import { withLock } from '../host/lock.js';
import { ownerDir, SCENARIO_NETNS } from './names.js';
import { noted, orElse } from '../cleanup.js';

/**
 * Scenarios left half-made or half-removed by a process that exited are taken down; network
 * namespaces of this home (their id has an owner directory here) that no scenario record names
 * are deleted, with the veths and bridges in them.
 */
export async function collectScenarios(ctx: LabContext): Promise<string[]> {
  const removed: string[] = [];
  for (const s of ctx.store.listScenarios()) {
    if (s.state !== 'creating' && s.state !== 'removing') continue;
    if (await ownerAlive(s.owner)) continue;
    await teardownScenario(ctx, s.name);
    removed.push(
      `scenario ${s.name} (${s.state === 'creating' ? 'its up was interrupted' : 'its down was interrupted'})`,
    );
  }
  removed.push(...(await collectStandbys(ctx)));
  const live = new Set(ctx.store.listScenarios().map((s) => s.id));
  for (const ns of await listSnaplabNetns()) {
    const sid = SCENARIO_NETNS.exec(ns)?.[1];
    if (!sid || live.has(sid) || !existsSync(ownerDir(ctx.home, sid))) continue;
    await deleteNetns(ns);
    removed.push(`network namespace ${ns}`);
  }
  for (const sid of await readdir(join(ctx.home, 'run', 'net')).catch(orElse([] as string[], 'readdir', 'ENOENT'))) {
    if (live.has(sid)) continue;
    await rm(ownerDir(ctx.home, sid), { recursive: true, force: true });
  }
  return removed;
}

/**
 * Under each scenario's lock (skipped while another operation holds it: that one tidies up), and
 * on the state read there: a standby whose raiser died is removed (a queued one whose worker never
 * started, after a minute); a swap a killed reset left half done is finished, and the copy it
 * set aside removed.
 */
async function collectStandbys(ctx: LabContext): Promise<string[]> {
  const removed: string[] = [];
  for (const s of ctx.store.listScenarios()) {
    if (s.state !== 'up') continue;
    const aside = (): boolean => ctx.store.scenarioMachines(s.name).some((r) => /~[0-9a-f]+$/.test(r.name));
    if (!s.standby && !aside()) continue;
    await withLock(
      join(ownerDir(ctx.home, s.id), 'op.lock'),
      async () => {
        const now = getScenario(ctx, s.name);
        if (now.id !== s.id) return;
        const st = now.standby;
        const raising = st?.state === 'raising' || st?.state === 'queued';
        const orphan = st?.owner ? !(await ownerAlive(st.owner)) : Date.now() - (st?.at ?? 0) > 60_000;
        if (raising && orphan) {
          await removeStandby(ctx, now);
          removed.push(`the standby of scenario ${s.name} (its raise was interrupted)`);
        }
        if (getScenario(ctx, s.name).standby?.state === 'swapping' || aside()) {
          await finishSwap(ctx, s.name);
          await removeSetAside(ctx, getScenario(ctx, s.name));
          removed.push(`the machines of scenario ${s.name} a reset set aside`);
        }
      },
      1000,
    ).catch(noted(`tidy the standby of scenario ${s.name} (another operation holds it)`));
  }
  return removed;
}
