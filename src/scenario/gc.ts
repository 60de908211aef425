import { existsSync } from 'node:fs';
import { readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { deleteNetns, listSnaplabNetns } from '../host/net/netns.js';
import { ownerAlive } from '../lab/lifecycle/owner.js';
import type { LabContext } from '../lab/context.js';
import { teardownScenario } from './down.js';
import { ownerDir } from './names.js';
import { orElse } from '../cleanup.js';

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
  const live = new Set(ctx.store.listScenarios().map((s) => s.id));
  for (const ns of await listSnaplabNetns()) {
    const sid = /^snaplab-([0-9a-f]{6})-[nm]\d+$/.exec(ns)?.[1];
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
