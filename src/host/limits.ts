import { readFileSync } from 'node:fs';
import type { Availability } from './probe-types.js';
import { fdLimit, tcpRoom } from './procs.js';
import {
  KERNEL_SHRINKERS,
  SANDBOX_SUPERBLOCKS,
  type ShrinkerHost,
  shrinkerBytesAt,
  shrinkerHost,
  shrinkerIdsAt,
} from './shrinkers.js';
import { USERNS_MIN_SIZE, USERNS_SIZE, USERNS_SLOTS } from './userns/id-ranges.js';

/**
 * Host-wide kernel limits that many sandboxes meet, each with what one idle namespace sandbox
 * takes of it (counted on this host: a busybox sandbox holds 1 host pid, its agent: bwrap's
 * monitor is let go once the agent serves, and with it the launch's private mount namespace;
 * docs/architecture.md "Density"). Limits counted per uid (inotify, user namespaces, a machine's
 * own namespaces) are each sandbox's alone: its user namespace is owned by its base uid (the user
 * namespace policy check says those).
 */
export const HOST_LIMITS: readonly { sysctl: string; perSandbox: number; raiseTo: number; why: string }[] = [
  {
    sysctl: 'kernel.pid_max',
    perSandbox: 1,
    raiseTo: 4_194_304,
    why: 'every process on the host has a pid: 1 per idle sandbox, and each command adds its own',
  },
  { sysctl: 'kernel.threads-max', perSandbox: 1, raiseTo: 4_194_304, why: 'every process is a thread' },
];

/**
 * What an idle busybox sandbox holds of the host's memory besides its memory cgroup's shrinker maps
 * (shrinkers.ts, added by count): 400–560 KiB of kernel and process memory measured at 200–1000
 * idle ones on a host whose peak was then a few thousand sandboxes, so that up to ~200 KiB of those
 * figures was already the maps (docs/benchmarks.md "Density"); rounded up.
 */
export const IDLE_SANDBOX_BYTES = 0.5 * 2 ** 20;

/** What one idle sandbox holds on a host holding `count`: its own memory and its shrinker maps. */
export function sandboxBytesAt(host: ShrinkerHost, count: number): number {
  return IDLE_SANDBOX_BYTES + shrinkerBytesAt(host, count);
}

/**
 * How many idle sandboxes `memBytes` holds, each paying for the shrinker ids of all of them
 * (sandboxBytesAt grows with the count: the largest count that fits, by bisection).
 */
export function memoryRoom(memBytes: number, host: ShrinkerHost): number {
  let lo = 0;
  let hi = Math.floor(memBytes / IDLE_SANDBOX_BYTES) + 1;
  while (hi - lo > 1) {
    const mid = Math.floor((lo + hi) / 2);
    if (mid * sandboxBytesAt(host, mid) <= memBytes) lo = mid;
    else hi = mid;
  }
  return lo;
}

/**
 * Memory cgroup ids: the kernel numbers every memory cgroup in 16 bits (MEM_CGROUP_ID_MAX), on
 * cgroup v1 and v2 alike, and a removed one keeps its id while pages are still charged to it (a
 * dying cgroup). Each sandbox has one. No sysctl raises it.
 */
export const MEMCG_ID_MAX = 65_535;

/** Memory cgroups on this host, live and dying (/proc/cgroups), or undefined without the controller. */
export function memoryCgroups(text = readFileSync('/proc/cgroups', 'utf8')): number | undefined {
  const row = text.split('\n').find((l) => l.split(/\s+/)[0] === 'memory');
  const v = Number(row?.split(/\s+/)[2]);
  return row && Number.isFinite(v) ? v : undefined;
}

/**
 * Open files: a daemon keeps one descriptor per sandbox it has served (its agent connection, until
 * the sandbox goes), beside its TCP connections at their default cap (4 096, kept below the limit
 * less its reserve: tcpRoom) and its own few (the store, the Unix socket, pipes, /proc reads:
 * DAEMON_OWN_FILES). Node raises the soft limit to the hard one at start, so the hard one is what a
 * daemon started from here gets; a systemd unit sets its own (deploy/systemd/snaplab.service:
 * LimitNOFILE=1048576).
 */
export const DAEMON_OWN_FILES = 256;
const DEFAULT_TCP_CAP = 4096;

/** How many sandboxes a daemon under the open-file limit `hard` can serve at once, its TCP connections all open. */
export function filesRoom(hard: number): number {
  return Math.max(0, hard - Math.max(0, tcpRoom(hard, DEFAULT_TCP_CAP).room) - DAEMON_OWN_FILES);
}

/** A sysctl's value on this host, or undefined where the kernel has none. */
export function readSysctl(name: string): number | undefined {
  try {
    const v = Number(readFileSync(`/proc/sys/${name.replaceAll('.', '/')}`, 'utf8').trim());
    return Number.isFinite(v) ? v : undefined;
  } catch {
    return undefined; // absent on this kernel: it limits nothing
  }
}

const n = (x: number): string => Math.floor(x).toLocaleString('en-US');

const inKiB = (bytes: number): string => n(bytes / 1024);

/** The memory room, with what each sandbox holds there and the shrinker ids it is paid for. */
function memoryPart(memory: number, host: ShrinkerHost): string {
  const maps = shrinkerBytesAt(host, memory);
  const ids = shrinkerIdsAt(host, memory);
  return (
    `memory ${n(memory)} (at ${inKiB(IDLE_SANDBOX_BYTES + maps)} KiB each there: ${inKiB(IDLE_SANDBOX_BYTES)} of its own ` +
    `and ${inKiB(maps)} of shrinker maps for ~${n(ids)} superblocks, ${n(host.mounted)} in the host's mount table, ` +
    `${KERNEL_SHRINKERS} the kernel's and ${SANDBOX_SUPERBLOCKS} per sandbox; a host that held more since boot pays more)`
  );
}

/**
 * How many idle sandboxes each limit allows beside `used` processes already running, against what
 * memory allows (`memBytes`): ok while every limit allows at least that many, else the limits that
 * stop short with the sysctl that raises them. The uid ranges are said too (full and smallest).
 */
export function hostLimitsVerdict(
  values: Record<string, number | undefined>,
  memBytes: number,
  used: number,
  memcgs?: number,
  shrinkers: ShrinkerHost = shrinkerHost(),
  files?: { hard: number; nrOpen?: number },
): Availability {
  const memory = memoryRoom(memBytes, shrinkers);
  const parts: string[] = [memoryPart(memory, shrinkers)];
  const short: string[] = [];
  const rooms: [string, number][] = [['memory', memory]];
  for (const l of HOST_LIMITS) {
    const v = values[l.sysctl];
    if (v === undefined) continue;
    const room = Math.max(0, (v - used) / l.perSandbox);
    parts.push(`${l.sysctl}=${v} ${n(room)}`);
    rooms.push([l.sysctl, room]);
    if (room < memory) short.push(`sysctl -w ${l.sysctl}=${l.raiseTo} (${l.why})`);
  }
  if (files !== undefined) {
    const room = filesRoom(files.hard);
    parts.push(`open files ${n(room)} (a daemon's hard limit ${n(files.hard)}: one descriptor a sandbox it serves)`);
    rooms.push(['open files', room]);
    if (room < memory) {
      const to = Math.min(1_048_576, files.nrOpen ?? 1_048_576);
      short.push(
        `ulimit -Hn ${to} in the shell that starts snaplab serve, or LimitNOFILE=${to} in its unit (deploy/systemd/snaplab.service has it; fs.nr_open bounds it)`,
      );
    }
  }
  if (memcgs !== undefined) {
    const room = Math.max(0, MEMCG_ID_MAX - memcgs);
    parts.push(
      `memory cgroup ids ${n(room)} (${n(memcgs)} of ${n(MEMCG_ID_MAX)} taken, dying ones too; no sysctl raises it)`,
    );
    rooms.push(['memory cgroup ids', room]);
    // the kernel's count, no sysctl's: only worth a fix when what holds them is more than half of it
    if (room < memory && room < MEMCG_ID_MAX / 2)
      short.push(
        `free memory cgroup ids: ${n(memcgs)} are taken, dying ones (removed, their cache pages still charged) among them; \`sync; echo 3 > /proc/sys/vm/drop_caches\` lets those go, a reboot frees all`,
      );
  }
  parts.push(
    `uid ranges ${n(USERNS_SLOTS)} of ${USERNS_SIZE} ids, ${n((USERNS_SLOTS * USERNS_SIZE) / USERNS_MIN_SIZE)} of ${USERNS_MIN_SIZE} (--ids)`,
  );
  rooms.push([`uid ranges of ${USERNS_SIZE}`, USERNS_SLOTS]);
  const [by, ceiling] = rooms.reduce((a, b) => (b[1] < a[1] ? b : a));
  const reason = `idle sandboxes this host allows: ${n(ceiling)}, by ${by} (${parts.join('; ')})`;
  // the ranges' count is a ceiling, not a fault: said with what lifts it (smaller ranges)
  if (!short.length && by.startsWith('uid ranges'))
    return {
      ok: true,
      reason,
      fix: `sandboxes that need fewer ids get more ranges: \`create --ids ${USERNS_MIN_SIZE}\` (a busybox one needs no more; ids beyond show as nobody inside)`,
    };
  if (!short.length) return { ok: true, reason };
  return {
    ok: false,
    reason: `${reason}: a create fails past the lowest`,
    fix: `${short.join('; ')}${short.some((s) => s.startsWith('sysctl')) ? '; keep sysctls in /etc/sysctl.d/' : ''}`,
  };
}

/** This host's limits, memory, process count and memory cgroups, judged (doctor's "host limits"). */
export function hostLimits(): Availability {
  const values = Object.fromEntries(HOST_LIMITS.map((l) => [l.sysctl, readSysctl(l.sysctl)]));
  const kib = Number(/^MemTotal:\s+(\d+)/m.exec(readFileSync('/proc/meminfo', 'utf8'))?.[1] ?? 0);
  // /proc/loadavg's 4th field: running/existing threads (each holds a pid)
  const used = Number(readFileSync('/proc/loadavg', 'utf8').split(' ')[3]?.split('/')[1]);
  const files = { hard: fdLimit().hard, nrOpen: readSysctl('fs.nr_open') };
  return hostLimitsVerdict(
    values,
    kib * 1024,
    Number.isFinite(used) ? used : 0,
    memoryCgroups(),
    shrinkerHost(),
    files,
  );
}
