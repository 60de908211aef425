import { readFileSync } from 'node:fs';
import { readdir } from 'node:fs/promises';

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

/** Read synchronously: a /proc read takes microseconds, a thread-pool round trip far longer. */
export async function readStat(pid: number): Promise<ProcStat | undefined> {
  try {
    return parseStat(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return undefined;
  }
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

/** Is `pid` a live process? Zombies count as gone: they run nothing, they only await a reaper. */
export async function pidAlive(pid: number): Promise<boolean> {
  const st = await readStat(pid);
  return st !== undefined && st.state !== 'Z' && st.state !== 'X';
}

/** Start time of `pid` (clock ticks after boot), undefined when there is no such process. */
export async function processStartTime(pid: number): Promise<number | undefined> {
  return (await readStat(pid))?.startTime;
}

/** Is `pid` still the very process recorded earlier with `startTime` (not a reuse of its pid)? */
export async function sameProcess(pid: number, startTime: number): Promise<boolean> {
  const st = await readStat(pid);
  return st !== undefined && st.startTime === startTime && st.state !== 'Z' && st.state !== 'X';
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
