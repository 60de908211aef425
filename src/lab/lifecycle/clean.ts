import { readFile } from 'node:fs/promises';
import type { AgentClient, AgentStatus } from '../../agent/client.js';
import { cgroupFor, oomKills } from '../../host/cgroups/cgroups.js';
import type { CleanBaseline, SandboxRecord } from '../../store/records.js';
import type { LabContext } from '../context.js';
import { orElse } from '../../cleanup.js';

/**
 * Reuse fails closed (principle 4). A standby goes back into its pool only when everything that
 * could carry state from one execution to the next is as it was when the standby was made:
 * - no more processes in its cgroup than at the start (the agent alone: bwrap's monitor is let go at launch);
 * - no System V IPC object in its IPC namespace;
 * - its root filesystem unchanged (the backend's change marker; none on dir storage);
 * - /dev, /dev/shm, /dev/mqueue, /run and /run/snaplab holding exactly the entries they started with;
 * - no OOM kill and no fork refused at the pids limit since.
 * Anything else, or anything that cannot be checked, is dirty.
 * The allowlist of what may persist is therefore: the agent process, the namespaces themselves
 * (hostname, loopback: unchangeable without the capabilities the sandbox lacks), the cgroup and
 * its limits, page cache and memory accounting, pid numbering.
 */
const COUNTS = ['processes', 'shm', 'sem', 'msg'];

const entriesOf = (st: AgentStatus): string[] =>
  Object.entries(st.entries)
    .map(([d, e]) => `${d}:${e}`)
    .sort();

async function cgroupCounters(s: SandboxRecord): Promise<{ oomKills: number; pidsMax: number; procs: number }> {
  const cg = cgroupFor(s.id);
  const dir = cg.controllerDirs.pids;
  let oom = -1; // -1: not read
  try {
    oom = oomKills(cg);
  } catch {
    // unreadable (a cgroup gone reads as 0)
  }
  const [events, procs] = await Promise.all([
    dir ? readFile(`${dir}/pids.events`, 'utf8').catch(orElse('', 'readFile', 'ENOENT')) : Promise.resolve(''),
    dir ? readFile(`${dir}/cgroup.procs`, 'utf8').catch(orElse('', 'readFile', 'ENOENT')) : Promise.resolve(''),
  ]);
  return {
    oomKills: oom,
    pidsMax: Number(/^max (\d+)/m.exec(events)?.[1] ?? 0),
    procs: procs.split('\n').filter(Boolean).length,
  };
}

/** What clean looks like for this sandbox, taken right after it became usable. Null: cannot recycle it. */
export async function captureBaseline(
  ctx: LabContext,
  s: SandboxRecord,
  agent: AgentClient,
): Promise<CleanBaseline | null> {
  if (!s.volume) return null;
  const marker = await (await ctx.readyBackend(s.storage)).changeMarker(s.volume);
  if (marker === null) return null;
  const [st, counters] = await Promise.all([agent.status(), cgroupCounters(s)]);
  return {
    fsGeneration: marker,
    devEntries: entriesOf(st),
    oomKills: counters.oomKills,
    pidsMax: counters.pidsMax,
    procs: counters.procs,
  };
}

/** Reasons the sandbox is not back in its clean state; empty means it may be handed out again. */
export async function dirtReasons(ctx: LabContext, s: SandboxRecord, agent: AgentClient): Promise<string[]> {
  const base = s.baseline;
  if (!base || !s.volume) return ['no clean baseline recorded'];
  const backend = await ctx.readyBackend(s.storage);
  const [st, marker, counters] = await Promise.all([
    agent.status().catch((e: Error) => e),
    backend.changeMarker(s.volume).catch(orElse(null, `read the change marker of ${s.name}`)),
    cgroupCounters(s),
  ]);
  if (st instanceof Error) return [`agent status: ${st.message}`];
  const reasons: string[] = [];
  for (const k of COUNTS) if (st.counts[k] !== 0) reasons.push(`${k}: ${String(st.counts[k])} left`);
  // never more than the agent and a monitor: a machine that started with more (a system machine's
  // services) is not judged clean by its count alone
  const procs = Math.min(base.procs ?? 2, 2);
  if (counters.procs > procs) reasons.push(`${counters.procs - procs} extra process(es) in the cgroup`);
  if (marker !== base.fsGeneration) reasons.push('root filesystem changed');
  const now = entriesOf(st);
  for (const line of now)
    if (!base.devEntries.includes(line)) reasons.push(`${line.slice(0, line.indexOf(':'))} changed`);
  if (now.length !== base.devEntries.length) reasons.push('in-memory directories changed');
  if (counters.oomKills !== base.oomKills) reasons.push('an OOM kill happened');
  if (counters.pidsMax !== base.pidsMax) reasons.push('a fork hit the pids limit');
  return reasons;
}
