/**
 * The commands envd calls started, by sandbox and pid: a command outlives the stream that started
 * it (a background command, a client gone), so a kill, an input or a reattach finds it here. Each
 * is a `spawn` of the Lab API; its output goes to whoever listens now (nothing is replayed).
 */
import { Underway, forgottenMeanwhile } from './underway.js';
import type { ProcessApi, SandboxApi } from '../sdk/api.js';
import type { ExecResult } from '../lab/io/sandbox-ops.js';
import { failureMeans } from '../cleanup.js';
import { OneAtATime } from '../concurrency.js';

/** A process event as envd's `ProcessEvent` (JSON), bytes in base64. */
export type ProcessEvent =
  | { start: { pid: number } }
  | { data: { stdout: string } | { stderr: string } | { pty: string } }
  | { end: { exitCode: number; exited: boolean; status: string; error?: string } }
  | { keepalive: Record<string, never> };

export interface ProcessConfig {
  cmd: string;
  args: string[];
  envs: Record<string, string>;
  cwd?: string;
}

export interface StartSpec {
  config: ProcessConfig;
  /** the config as its Start sent it, which List gives back (config: what it runs with) */
  shown?: ProcessConfig;
  tag?: string;
  user?: string;
  /** what runs E2B's `/bin/bash` here (EnvdUser.shell) */
  shell: string;
  stdin: boolean;
  timeoutMs?: number;
  /** a terminal of this size: its output comes as `pty` data, input goes to it */
  tty?: { cols: number; rows: number };
}

export class Proc {
  readonly listeners = new Set<(e: ProcessEvent) => void>();
  ended = false;
  /**
   * Its end is not known (its sandbox killed, paused without memory or gone; the daemon closing):
   * its streams are cut, not ended, as envd's are when its machine goes, so that E2B's SDK asks the
   * sandbox's health and says it ended (TimeoutError), not that the command failed.
   */
  cut = false;
  pid = 0;
  timedOut = false;
  handle!: ProcessApi<ExecResult>;
  /** how many of its listeners hold its output now (a client behind: envd.ts) */
  private holders = 0;

  /** One listener more (true) or less holding its output: held at its source while any does. */
  hold(on: boolean): void {
    const before = this.holders > 0;
    this.holders = Math.max(0, this.holders + (on ? 1 : -1));
    if (before !== this.holders > 0) this.handle.hold?.(this.holders > 0);
  }

  /** Can its output be held at its source (a namespace machine's agent; not a VM's relay)? */
  get holdable(): boolean {
    return this.handle.hold !== undefined;
  }

  constructor(
    readonly sandbox: string,
    readonly spec: StartSpec,
  ) {}

  emit(e: ProcessEvent): void {
    for (const fn of this.listeners) fn(e);
  }
}

/**
 * E2B runs `/bin/bash -l -c CMD`; a machine without bash (the built-in busybox) runs it with sh:
 * `shell`, what the machine has (users.ts), which saves a shell's exec on every command.
 */
export function argvOf(c: ProcessConfig, shell: string): string[] {
  return [c.cmd === '/bin/bash' ? shell : c.cmd, ...c.args];
}

type EndEvent = Extract<ProcessEvent, { end: unknown }>['end'];

/** How long a command's end is kept for a Connect that comes after it (envd ≥ 0.6.12: 30 s). */
const RETAIN_MS = 30_000;
/** The most ends kept a sandbox (the oldest go first): a loop of short commands holds no more. */
const RETAIN_MAX = 1000;

/** A command that ended in the last RETAIN_MS: what a late Connect is told of it. */
export interface Ended {
  pid: number;
  tag?: string;
  end: EndEvent;
  at: number;
}

export class Processes {
  private readonly bySandbox = new Map<string, Map<number, Proc>>();
  private readonly endedBy = new Map<string, Map<number, Ended>>();
  private readonly underway = new Underway();

  /**
   * Start a command; `listen` gets its events from the first (`start`) to the last (`end`).
   * Output that comes before the pid is known is held until the start event is out.
   */
  async start(
    box: SandboxApi,
    spec: StartSpec,
    listen: (e: ProcessEvent) => void,
    made?: (p: Proc) => void,
  ): Promise<Proc> {
    const p = new Proc(box.id, spec);
    made?.(p); // before any wait: its listener may need it at once (an end that comes early: Proc.cut)
    const held: ProcessEvent[] = [];
    let started = false;
    const out = (e: ProcessEvent): void => {
      if (started) p.emit(e);
      else held.push(e);
    };
    const { forgotten } = await this.underway.run(box.id, async () => {
      p.handle = await box.spawn(argvOf(spec.config, spec.shell), {
        env: spec.config.envs,
        cwd: spec.config.cwd,
        user: spec.user,
        timeoutMs: spec.timeoutMs,
        ...(spec.stdin || spec.tty ? { stdin: true as const } : {}),
        tty: spec.tty,
        // as envd's: its end waits for its output's, so what it left in the background and still
        // writes there is read (`(sleep 1; echo late) &`), and a server started with & and not redirected is waited for, as there
        waitOutput: true,
        ...outputTo(spec, out),
        encoding: 'buffer',
        // it outlives the daemon, as a command outlives envd's clients (a machine that cannot keep it runs it as without)
        keep: true,
        tag: tagOf(spec),
      });
      p.pid = await p.handle.pid;
    });
    if (forgotten) {
      // its sandbox was killed or stopped while it started: nothing is kept of it (forget)
      p.handle.disconnect?.();
      throw forgottenMeanwhile(box.id, 'the command started');
    }
    p.listeners.add(listen);
    p.emit({ start: { pid: p.pid } });
    started = true;
    for (const e of held) p.emit(e);
    this.runs(p);
    return p;
  }

  /** A command of this front's from now on: listed by pid until its end, which is told to its listeners. */
  private runs(p: Proc): void {
    // (one found by adopt while this front's own start of it was under way runs on beside it, for
    // whoever listens to it already, to the command's end: this one is the one listed)
    this.add(p);
    void p.handle.result.then(
      (r) => {
        p.timedOut = r.timedOut;
        this.finish(p, endOf(r));
      },
      (e: unknown) => {
        p.cut = true;
        this.finish(p, { exitCode: -1, exited: false, status: 'error', error: (e as Error).message ?? String(e) });
      },
    );
  }

  private readonly finding = new OneAtATime(FIND_MS);

  /**
   * The commands a previous daemon started through this front and the machine kept (the Lab's
   * `kept()`), taken on (one look at a time a sandbox): listed, reattached, signalled and fed as
   * before, their output from now on. Asked on every List, and by any call for a pid or tag this
   * front does not know; a caller waits at most 10 s, then goes on with what is known.
   */
  adopt(box: SandboxApi): Promise<void> {
    return this.finding.run(box.id, () => this.find(box));
  }

  private async find(box: SandboxApi): Promise<void> {
    const kept = await box.kept().catch(failureMeans(null));
    if (!kept) return; // paused, gone, or a key that may not list processes: as known
    for (const k of kept) {
      const config = this.get(box.id, k.pid) ? null : configOf(k.tag);
      if (!config) continue;
      const spec: StartSpec = {
        config: config.config,
        tag: config.tag,
        shell: '',
        stdin: k.stdin,
        ...(k.tty ? { tty: { cols: 80, rows: 24 } } : {}),
      };
      const p = new Proc(box.id, spec);
      try {
        p.handle = await box.attach(
          k.pid,
          outputTo(spec, (e) => p.emit(e)),
        );
      } catch {
        continue; // ended meanwhile
      }
      p.pid = k.pid;
      // started by this front meanwhile (its start was under way): that one is it
      if (this.get(box.id, k.pid)) {
        p.handle.disconnect?.();
        continue;
      }
      this.runs(p);
    }
  }

  private add(p: Proc): void {
    let m = this.bySandbox.get(p.sandbox);
    if (!m) this.bySandbox.set(p.sandbox, (m = new Map()));
    m.set(p.pid, p);
  }

  private finish(p: Proc, end: EndEvent): void {
    p.ended = true;
    p.emit({ end: end });
    p.listeners.clear();
    const m = this.bySandbox.get(p.sandbox);
    if (m?.get(p.pid) !== p) return; // its sandbox forgotten (killed, stopped): nothing kept of it
    m.delete(p.pid);
    if (p.cut) return; // no end known: none is kept for a late Connect (one that runs on is found again: adopt)
    this.retain(p.sandbox, {
      pid: p.pid,
      ...(p.spec.tag !== undefined ? { tag: p.spec.tag } : {}),
      end,
      at: Date.now(),
    });
  }

  /**
   * Keep a command's end for a late Connect, as envd does (RETAIN_MS, at most RETAIN_MAX a sandbox;
   * those past their time go at the next end, or with the sandbox: no timer a command).
   */
  private retain(sandbox: string, e: Ended): void {
    let m = this.endedBy.get(sandbox);
    if (!m) this.endedBy.set(sandbox, (m = new Map()));
    m.delete(e.pid);
    m.set(e.pid, e);
    // oldest first: those past their time, then any past the most
    for (const [pid, old] of m) {
      if (old.at > Date.now() - RETAIN_MS && m.size <= RETAIN_MAX) break;
      m.delete(pid);
    }
  }

  /** A command of this sandbox that ended in the last 30 s, by pid or by tag (the latest). */
  ended(sandbox: string, pid: unknown, tag: unknown): Ended | undefined {
    const since = Date.now() - RETAIN_MS;
    const m = [...(this.endedBy.get(sandbox)?.values() ?? [])].filter((e) => e.at > since);
    if (typeof pid === 'number') return m.find((e) => e.pid === pid);
    return m.reverse().find((e) => e.tag !== undefined && e.tag === tag);
  }

  get(sandbox: string, pid: number): Proc | undefined {
    return this.bySandbox.get(sandbox)?.get(pid);
  }

  list(sandbox: string): Proc[] {
    return [...(this.bySandbox.get(sandbox)?.values() ?? [])];
  }

  /** A sandbox killed: its commands' streams are cut (their ends come from the lost connection). */
  forget(sandbox: string): void {
    this.underway.forget(sandbox);
    for (const p of this.list(sandbox)) p.handle.disconnect?.();
    this.bySandbox.delete(sandbox);
    this.endedBy.delete(sandbox);
  }

  close(): void {
    for (const id of [...this.bySandbox.keys()]) this.forget(id);
  }
}

/** Where a command's output goes: envd's data events (a terminal's as `pty`). */
function outputTo(
  spec: StartSpec,
  out: (e: ProcessEvent) => void,
): { onStdout: (b: Buffer) => void; onStderr: (b: Buffer) => void } {
  return {
    onStdout: (b) => out({ data: spec.tty ? { pty: b.toString('base64') } : { stdout: b.toString('base64') } }),
    onStderr: (b) => out({ data: { stderr: b.toString('base64') } }),
  };
}

/** the most a kept command's tag may hold (the daemon's ProcessBody: characters) */
const TAG_MAX = 1024;
/**
 * its bytes once escaped again: the daemon's tag (src/server/kept.ts) holds this, its own ~100
 * bytes and the command's first 256 characters (at most 1 536 bytes escaped) in 4 093
 */
const TAG_BYTES = 2400;
/** how long a call waits for the commands kept in a machine to be found */
const FIND_MS = 10_000;

/**
 * What the front keeps with a command so that it lists it after a daemon restart (List's config and
 * tag): its envs left out if they do not fit, then its args.
 */
function tagOf(spec: StartSpec): string {
  const c = spec.shown ?? spec.config;
  const tries = [
    { c: c.cmd, a: c.args, e: c.envs, w: c.cwd, t: spec.tag },
    { c: c.cmd, a: c.args, w: c.cwd, t: spec.tag },
    { c: c.cmd, a: [], w: c.cwd, t: spec.tag },
    { c: c.cmd.slice(0, 64), a: [] },
  ];
  for (const t of tries) {
    const s = JSON.stringify(t);
    // the daemon's limit in characters, and room in the machine's 4 KiB once the daemon writes it
    // down again (escaped, beside its own words): never a reason to refuse the command
    if ([...s].length <= TAG_MAX && Buffer.byteLength(JSON.stringify(s)) <= TAG_BYTES) return s;
  }
  return JSON.stringify({ c: '', a: [] });
}

/** A kept command's tag as tagOf wrote it (the machine's root could have changed it: checked), or null. */
function configOf(tag: string | null): { config: ProcessConfig; tag?: string } | null {
  if (tag === null) return null;
  let o: { c?: unknown; a?: unknown; e?: unknown; w?: unknown; t?: unknown };
  try {
    o = JSON.parse(tag) as typeof o;
  } catch {
    return null;
  }
  const strs = (v: unknown): v is string[] => Array.isArray(v) && v.every((x) => typeof x === 'string');
  const envs =
    typeof o.e === 'object' && o.e !== null && Object.values(o.e).every((v) => typeof v === 'string')
      ? (o.e as Record<string, string>)
      : {};
  if (typeof o !== 'object' || o === null || typeof o.c !== 'string' || !strs(o.a)) return null;
  return {
    config: { cmd: o.c, args: o.a, envs, ...(typeof o.w === 'string' ? { cwd: o.w } : {}) },
    ...(typeof o.t === 'string' ? { tag: o.t } : {}),
  };
}

/** Go's names of the signals (syscall.Signal's String), as envd's status and error say them. */
const GO_SIGNALS: Record<number, string> = {
  1: 'hangup',
  2: 'interrupt',
  3: 'quit',
  4: 'illegal instruction',
  5: 'trace/breakpoint trap',
  6: 'aborted',
  7: 'bus error',
  8: 'floating point exception',
  9: 'killed',
  10: 'user defined signal 1',
  11: 'segmentation fault',
  12: 'user defined signal 2',
  13: 'broken pipe',
  14: 'alarm clock',
  15: 'terminated',
  16: 'stack fault',
  17: 'child exited',
  18: 'continued',
  19: 'stopped (signal)',
  20: 'stopped',
  21: 'stopped (tty input)',
  22: 'stopped (tty output)',
  23: 'urgent I/O condition',
  24: 'CPU time limit exceeded',
  25: 'file size limit exceeded',
  26: 'virtual timer expired',
  27: 'profiling timer expired',
  28: 'window changed',
  29: 'I/O possible',
  30: 'power failure',
  31: 'bad system call',
};

/**
 * A snaplab exec result as envd's end event: a signal's death as Go says it (exit code -1); a
 * command that did not exit 0 has its wait's error, the same words (`exit status 3`, `signal:
 * killed`), which E2B's SDK makes CommandExitError's message.
 */
function endOf(r: ExecResult): { exitCode: number; exited: boolean; status: string; error?: string } {
  if (r.timedOut) return { exitCode: -1, exited: false, status: 'signal: killed', error: 'deadline exceeded' };
  if (r.signal !== null) {
    const status = `signal: ${GO_SIGNALS[r.signal] ?? `signal ${r.signal}`}`;
    return { exitCode: -1, exited: false, status, error: status };
  }
  const status = `exit status ${r.exitCode}`;
  return { exitCode: r.exitCode, exited: true, status, ...(r.exitCode !== 0 ? { error: status } : {}) };
}
