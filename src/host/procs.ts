import { readFileSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { SnaplabError } from '../errors.js';

export interface ProcStat {
  pid: number;
  comm: string;
  /** R running, S sleeping, D disk sleep, T stopped, Z zombie, X dead, ... */
  state: string;
  ppid: number;
  /** field 22: start time in clock ticks after boot; with the pid it names one process for good */
  startTime: number;
}

/** Parse /proc/PID/stat. comm may hold spaces and parentheses, so split after the last ')'. */
export function parseStat(text: string): ProcStat | undefined {
  const open = text.indexOf('(');
  const close = text.lastIndexOf(')');
  if (open < 0 || close < open) return undefined;
  const rest = text.slice(close + 2).split(' ');
  // rest[0] is field 3 (state); field N is rest[N - 3]
  const state = rest[0];
  const ppid = Number(rest[1]);
  const startTime = Number(rest[19]);
  if (!state || !Number.isFinite(ppid) || !Number.isFinite(startTime)) return undefined;
  return { pid: Number(text.slice(0, open).trim()), comm: text.slice(open + 1, close), state, ppid, startTime };
}

/**
 * Errors that are evidence a process is gone: its /proc entry does not exist (ENOENT), or it
 * exited while being read (ESRCH). Any other failure (EMFILE when this process is out of file
 * descriptors, ENFILE, EACCES under hidepid, EIO) says nothing about the process.
 */
const GONE_CODES = new Set(['ENOENT', 'ESRCH']);

/**
 * Read /proc/PID/stat: undefined only when there is no such process. Any other failure throws:
 * EMFILE must never read as "gone" (a daemon at its fd limit once declared every machine on the
 * host dead and removed a running VM's RAM file). Read synchronously: a /proc read takes
 * microseconds, a thread-pool round trip far longer.
 */
export async function readStat(pid: number): Promise<ProcStat | undefined> {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch (e) {
    if (GONE_CODES.has((e as NodeJS.ErrnoException).code ?? '')) return undefined;
    throw new SnaplabError(
      'HOST_UNREADABLE',
      `cannot tell whether process ${pid} runs: /proc/${pid}/stat could not be read (${(e as Error).message})`,
      'nothing was removed; this is tried again later (EMFILE: the process is out of file descriptors)',
      { cause: e },
    );
  }
  return parseStat(text);
}

/**
 * What can be said of a process: 'alive'; 'gone' only on evidence (no /proc entry, ESRCH, a
 * zombie, or another process now on its pid: a start time other than `startTime`); 'unknown'
 * when /proc could not be read, with why. Unknown is never gone: nothing may be removed on it.
 */
export type Liveness = { state: 'alive' } | { state: 'gone' } | { state: 'unknown'; cause: SnaplabError };

export async function liveness(pid: number, startTime?: number | null): Promise<Liveness> {
  let st: ProcStat | undefined;
  try {
    st = await readStat(pid);
  } catch (e) {
    if (e instanceof SnaplabError) return { state: 'unknown', cause: e };
    throw e;
  }
  if (st === undefined || st.state === 'Z' || st.state === 'X') return { state: 'gone' };
  if (startTime !== undefined && startTime !== null && st.startTime !== startTime) return { state: 'gone' };
  return { state: 'alive' };
}

let ownStart: number | undefined;

/** This process's own start time (read once: it cannot change); a record's owner is pid and this. */
export function ownStartTime(): number {
  if (ownStart === undefined) {
    const st = parseStat(readFileSync('/proc/self/stat', 'utf8'));
    if (!st) throw new Error('/proc/self/stat could not be parsed');
    ownStart = st.startTime;
  }
  return ownStart;
}

/**
 * May `pid` still run? False only on evidence that it is gone (see liveness); true when /proc
 * cannot be read, so that nothing is removed on a failed read. Zombies count as gone: they run
 * nothing, they only await a reaper. To signal a process, ask liveness for 'alive' instead.
 */
export async function pidAlive(pid: number): Promise<boolean> {
  return (await liveness(pid)).state !== 'gone';
}

/** Start time of `pid` (clock ticks after boot), undefined when there is no such process. */
export async function processStartTime(pid: number): Promise<number | undefined> {
  return (await readStat(pid))?.startTime;
}

/**
 * May `pid` still be the very process recorded earlier with `startTime` (not a reuse of its pid)?
 * As pidAlive: false only on evidence, true when /proc cannot be read.
 */
export async function sameProcess(pid: number, startTime: number): Promise<boolean> {
  return (await liveness(pid, startTime)).state !== 'gone';
}

/** Poll until `pid` is gone (or a zombie). Returns false if it still lives after `timeoutMs`. */
export async function waitGone(pid: number, timeoutMs: number): Promise<boolean> {
  const deadline = performance.now() + timeoutMs;
  let delay = 1;
  for (;;) {
    if (!(await pidAlive(pid))) return true;
    if (performance.now() >= deadline) return false;
    await new Promise((r) => setTimeout(r, delay));
    delay = Math.min(delay * 2, 50);
  }
}

/**
 * Is there a process with this pid (any: its start time is not read)? One kill(pid, 0), no
 * /proc read: false only when the kernel says there is none (ESRCH). A zombie or a reuse of the
 * pid is "there": what tells those apart is liveness.
 */
export function pidThere(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code !== 'ESRCH';
  }
}

/** Send `signal`, ignoring a process that is already gone. */
export function signal(pid: number, sig: NodeJS.Signals | number): boolean {
  try {
    process.kill(pid, sig);
    return true;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ESRCH') return false;
    throw e;
  }
}

/** All descendants of `pid` (children first, then theirs), from a scan of /proc. */
export async function descendants(pid: number): Promise<number[]> {
  const entries = (await readdir('/proc')).filter((n) => /^\d+$/.test(n));
  const stats = await Promise.all(entries.map((n) => readStat(Number(n))));
  const kids = new Map<number, number[]>();
  for (const st of stats) {
    if (!st) continue;
    const list = kids.get(st.ppid) ?? [];
    list.push(st.pid);
    kids.set(st.ppid, list);
  }
  const out: number[] = [];
  const queue = [pid];
  while (queue.length) {
    for (const k of kids.get(queue.shift()!) ?? []) {
      out.push(k);
      queue.push(k);
    }
  }
  return out;
}

/**
 * Stop `pid` and its descendants: SIGTERM, then SIGKILL to whatever remains after `graceMs`.
 * Returns true when all are gone. (Processes in a cgroup are better killed via the cgroup.)
 */
export async function killTree(pid: number, graceMs = 2000, waitMs = 2000): Promise<boolean> {
  const all = [pid, ...(await descendants(pid))];
  for (const p of all) signal(p, 'SIGTERM');
  const gone = await Promise.all(all.map((p) => waitGone(p, graceMs)));
  const left = all.filter((_, i) => !gone[i]);
  for (const p of left) signal(p, 'SIGKILL');
  return (await Promise.all(left.map((p) => waitGone(p, waitMs)))).every(Boolean);
}

/** A daemon's TCP connections at most: its cap, kept `fdReserve` (default a quarter, ≥ 64) below its open-file limit. */
export function tcpRoom(fds: number, maxConnections: number, fdReserve?: number): { fdReserve: number; room: number } {
  const reserve = fdReserve ?? Math.max(64, Math.floor(fds / 4));
  return { fdReserve: reserve, room: Math.min(maxConnections, fds - reserve) };
}

/** The process's open-file limit now (soft, hard), from /proc/self/limits. */
export function fdLimit(): { soft: number; hard: number } {
  const line = readFileSync('/proc/self/limits', 'utf8')
    .split('\n')
    .find((l) => l.startsWith('Max open files'));
  const [soft, hard] = (line ?? '').split(/\s+/).slice(3, 5);
  const n = (v: string | undefined): number => (v === 'unlimited' || !v ? Number.MAX_SAFE_INTEGER : Number(v));
  return { soft: n(soft), hard: n(hard) };
}
