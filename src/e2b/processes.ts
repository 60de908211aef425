/**
 * The commands envd calls started, by sandbox and pid: a command outlives the stream that started
 * it (a background command, a client gone), so a kill, an input or a reattach finds it here. Each
 * is a `spawn` of the Lab API; its output goes to whoever listens now (nothing is replayed).
 */
import type { ProcessApi, SandboxApi } from '../sdk/api.js';
import type { ExecResult } from '../lab/io/sandbox-ops.js';

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
  pid = 0;
  timedOut = false;
  handle!: ProcessApi<ExecResult>;

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

export class Processes {
  private readonly bySandbox = new Map<string, Map<number, Proc>>();

  /**
   * Start a command; `listen` gets its events from the first (`start`) to the last (`end`).
   * Output that comes before the pid is known is held until the start event is out.
   */
  async start(box: SandboxApi, spec: StartSpec, listen: (e: ProcessEvent) => void): Promise<Proc> {
    const p = new Proc(box.id, spec);
    const held: ProcessEvent[] = [];
    let started = false;
    const out = (e: ProcessEvent): void => {
      if (started) p.emit(e);
      else held.push(e);
    };
    p.handle = await box.spawn(argvOf(spec.config, spec.shell), {
      env: spec.config.envs,
      cwd: spec.config.cwd,
      user: spec.user,
      timeoutMs: spec.timeoutMs,
      ...(spec.stdin || spec.tty ? { stdin: true as const } : {}),
      tty: spec.tty,
      onStdout: (b) => out({ data: spec.tty ? { pty: b.toString('base64') } : { stdout: b.toString('base64') } }),
      onStderr: (b) => out({ data: { stderr: b.toString('base64') } }),
      encoding: 'buffer',
    });
    p.pid = await p.handle.pid;
    p.listeners.add(listen);
    p.emit({ start: { pid: p.pid } });
    started = true;
    for (const e of held) p.emit(e);
    this.add(p);
    void p.handle.result.then(
      (r) => {
        p.timedOut = r.timedOut;
        this.finish(p, endOf(r));
      },
      (e: unknown) =>
        this.finish(p, { exitCode: -1, exited: false, status: 'error', error: (e as Error).message ?? String(e) }),
    );
    return p;
  }

  private add(p: Proc): void {
    let m = this.bySandbox.get(p.sandbox);
    if (!m) this.bySandbox.set(p.sandbox, (m = new Map()));
    m.set(p.pid, p);
  }

  private finish(p: Proc, end: Extract<ProcessEvent, { end: unknown }>['end']): void {
    p.ended = true;
    p.emit({ end: end });
    p.listeners.clear();
    this.bySandbox.get(p.sandbox)?.delete(p.pid);
  }

  get(sandbox: string, pid: number): Proc | undefined {
    return this.bySandbox.get(sandbox)?.get(pid);
  }

  list(sandbox: string): Proc[] {
    return [...(this.bySandbox.get(sandbox)?.values() ?? [])];
  }

  /** A sandbox killed: its commands' streams are cut (their ends come from the lost connection). */
  forget(sandbox: string): void {
    for (const p of this.list(sandbox)) p.handle.disconnect?.();
    this.bySandbox.delete(sandbox);
  }

  close(): void {
    for (const id of [...this.bySandbox.keys()]) this.forget(id);
  }
}

/** A snaplab exec result as envd's end event (a signal's death as Go says it: exit code -1). */
function endOf(r: ExecResult): { exitCode: number; exited: boolean; status: string; error?: string } {
  if (r.timedOut) return { exitCode: -1, exited: false, status: 'signal: killed', error: 'deadline exceeded' };
  if (r.signal !== null) {
    const name = r.signal === 9 ? 'killed' : r.signal === 15 ? 'terminated' : `signal ${r.signal}`;
    return { exitCode: -1, exited: false, status: `signal: ${name}` };
  }
  return { exitCode: r.exitCode, exited: true, status: `exit status ${r.exitCode}` };
}
