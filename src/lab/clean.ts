import { readdir, readFile } from 'node:fs/promises';
import type { AgentClient } from '../agent/client.js';
import { cgroupFor, oomKills } from '../host/cgroups.js';
import { pids } from '../host/cgroups-destroy.js';
import type { CleanBaseline, SandboxRecord } from '../store/records.js';
import type { LabContext } from './context.js';

/**
 * Reuse fails closed (principle 4). A standby goes back into its pool only when everything that
 * could carry state from one execution to the next is as it was when the standby was made:
 * - no process left but the agent (inside the pid namespace) and bwrap's monitor (outside);
 * - no System V IPC object in its IPC namespace;
 * - its root filesystem unchanged (the backend's change marker; none on dir storage);
 * - /dev, /dev/shm, /dev/mqueue and /run holding exactly the entries they started with;
 * - no OOM kill and no fork refused at the pids limit since.
 * Anything else, or anything that cannot be checked, is dirty.
 * The allowlist of what may persist is therefore: the agent process, the namespaces themselves
 * (hostname, loopback: unchangeable without the capabilities the sandbox lacks), the cgroup and
 * its limits, page cache and memory accounting, pid numbering.
 */
const DEV_DIRS = ['dev', 'dev/shm', 'dev/mqueue', 'run', 'run/snaplab'];

async function devEntries(agentPid: number): Promise<string[]> {
  const out: string[] = [];
  for (const d of DEV_DIRS) {
    // the sandbox's own mount namespace, seen through its init's root
    const names = await readdir(`/proc/${agentPid}/root/${d}`).catch(() => null);
    out.push(`${d}:${names === null ? '(none)' : names.sort().join(',')}`);
  }
  return out;
}

async function pidsMaxEvents(s: SandboxRecord): Promise<number> {
  const dir = cgroupFor(s.id).controllerDirs.pids;
  if (!dir) return 0;
  const text = await readFile(`${dir}/pids.events`, 'utf8').catch(() => '');
  return Number(/^max (\d+)/m.exec(text)?.[1] ?? 0);
}

/** What clean looks like for this sandbox, taken right after it became usable. Null: cannot recycle it. */
export async function captureBaseline(ctx: LabContext, s: SandboxRecord): Promise<CleanBaseline | null> {
  if (!s.volume || !s.pid) return null;
  const marker = await (await ctx.readyBackend(s.storage)).changeMarker(s.volume);
  if (marker === null) return null;
  return {
    fsGeneration: marker,
    devEntries: await devEntries(s.pid),
    oomKills: await oomKills(cgroupFor(s.id)).catch(() => -1),
    pidsMax: await pidsMaxEvents(s),
  };
}

/** Reasons the sandbox is not back in its clean state; empty means it may be handed out again. */
export async function dirtReasons(ctx: LabContext, s: SandboxRecord, agent: AgentClient): Promise<string[]> {
  const base = s.baseline;
  if (!base || !s.volume || !s.pid) return ['no clean baseline recorded'];
  const reasons: string[] = [];
  const st = await agent.status().catch((e: Error) => ({ error: e.message }) as Record<string, unknown>);
  if ('error' in st) return [`agent status: ${String(st.error)}`];
  for (const k of ['processes', 'shm', 'sem', 'msg']) if (st[k] !== 0) reasons.push(`${k}: ${String(st[k])} left`);
  const inCgroup = await pids(cgroupFor(s.id)).catch(() => [] as number[]);
  if (inCgroup.length > 2) reasons.push(`${inCgroup.length - 2} extra process(es) in the cgroup`);
  const marker = await (await ctx.readyBackend(s.storage)).changeMarker(s.volume).catch(() => null);
  if (marker !== base.fsGeneration) reasons.push('root filesystem changed');
  const dev = await devEntries(s.pid);
  dev.forEach((d, i) => {
    if (d !== base.devEntries[i]) reasons.push(`${DEV_DIRS[i]} changed`);
  });
  if ((await oomKills(cgroupFor(s.id)).catch(() => -1)) !== base.oomKills) reasons.push('an OOM kill happened');
  if ((await pidsMaxEvents(s)) !== base.pidsMax) reasons.push('a fork hit the pids limit');
  return reasons;
}
