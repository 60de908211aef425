/**
 * Processes that outlive the daemon. A background process (and a command its caller asks to keep)
 * is kept by the machine's agent past the connection it came on (agent protocol 1.5), with a tag
 * that says which process of the daemon's it is. A daemon started later finds them the first time
 * a sandbox's processes are asked for, and takes each on under its old id: its output from then on
 * (what it wrote while no daemon held it is gone), its input, signals and end.
 */
import { isSnaplabError } from '../errors.js';
import type { ExecResult } from '../lab/io/sandbox-ops.js';
import type { KeptProcess, ProcessApi, SandboxApi, SpawnOptions } from '../sdk/api.js';
import type { Daemon, ProcessSpec } from './daemon.js';
import { Process } from './processes.js';

/** What the daemon tells the agent of a process it keeps: enough to list it and take it on again. */
interface KeptTag {
  d: 1;
  id: string;
  tag: string | null;
  argv: string[];
  tty: boolean;
  /** its start, ms since the epoch */
  at: number;
}

/** the room for the daemon's tag in a kept command's (the Lab takes up to 4 KiB) */
const TAG_ROOM = 3072;

/** The tag of a process to keep, its argv cut to its first word if the whole does not fit; undefined if even that does not. */
function tagOf(p: Process): string | undefined {
  const t: KeptTag = { d: 1, id: p.id, tag: p.tag, argv: p.argv, tty: p.tty, at: p.startedAt };
  for (const argv of [p.argv, [(p.argv[0] ?? '').slice(0, 256)]]) {
    const s = JSON.stringify({ ...t, argv });
    if (Buffer.byteLength(s) <= TAG_ROOM) return s;
  }
  return undefined;
}

/**
 * A kept command's tag as a daemon wrote it, or null. The machine's root could have changed it (it
 * can write the agent's memory): it names a process of that sandbox only, and is checked field by field.
 */
function parseTag(s: string | null): KeptTag | null {
  if (s === null) return null;
  let o: Partial<KeptTag>;
  try {
    o = JSON.parse(s) as Partial<KeptTag>;
  } catch {
    return null;
  }
  const ok =
    typeof o === 'object' &&
    o !== null &&
    o.d === 1 &&
    typeof o.id === 'string' &&
    /^[0-9a-f]{16}$/.test(o.id) &&
    (o.tag === null || (typeof o.tag === 'string' && o.tag.length <= 1024)) &&
    Array.isArray(o.argv) &&
    o.argv.length > 0 &&
    o.argv.every((a) => typeof a === 'string') &&
    typeof o.tty === 'boolean' &&
    Number.isSafeInteger(o.at);
  return ok ? (o as KeptTag) : null;
}

/** Start a process's command: kept where its spec asks and the machine's agent can (`p.kept` says which). */
export async function spawnKept(
  box: SandboxApi,
  p: Process,
  spec: ProcessSpec,
  opts: SpawnOptions & { encoding: 'buffer' },
): Promise<ProcessApi<ExecResult>> {
  const tag = spec.keep ? tagOf(p) : undefined;
  if (tag !== undefined) {
    try {
      const h = await box.spawn(spec.argv, { ...opts, keep: true, tag });
      p.kept = true;
      return h;
    } catch (e) {
      // an agent that cannot keep it (a VM's, through its relay): it runs as without
      if (!isSnaplabError(e, 'AGENT_PROTOCOL')) throw e;
    }
  }
  return box.spawn(spec.argv, opts);
}

/** The processes a previous daemon left running, found and taken on once a sandbox. */
export class KeptProcesses {
  /** sandboxes whose kept commands this daemon has taken on */
  private readonly done = new Set<string>();
  private readonly going = new Map<string, Promise<void>>();

  constructor(
    private readonly d: Daemon,
    private readonly ringBytes: number,
  ) {}

  /** Take on the sandbox's kept commands that no one holds, the first time it is asked (at once after). */
  adopt(box: SandboxApi): Promise<void> {
    if (this.done.has(box.id)) return Promise.resolve();
    let going = this.going.get(box.id);
    if (!going) {
      going = this.find(box).finally(() => this.going.delete(box.id));
      this.going.set(box.id, going);
    }
    return going;
  }

  private async find(box: SandboxApi): Promise<void> {
    let kept: KeptProcess[];
    try {
      kept = await box.kept();
    } catch (e) {
      // an agent that keeps nothing (older, or a VM's relay): nothing to find, ever
      if (isSnaplabError(e, 'AGENT_PROTOCOL')) this.done.add(box.id);
      // paused, stopped, unreachable: asked again next time
      return;
    }
    for (const k of kept) {
      const t = parseTag(k.tag);
      if (!t || k.held || this.d.processes.has(t.id)) continue;
      const p = new Process(box.id, t.argv, t.tag, t.tty, this.ringBytes, { id: t.id, startedAt: t.at });
      p.kept = true;
      p.stdin = k.stdin;
      let h: ProcessApi<ExecResult>;
      try {
        h = await box.attach(k.pid, {
          onStdout: (b) => p.output('stdout', b),
          onStderr: (b) => p.output('stderr', b),
          // a connection of its own, as every process of the daemon's: a slow reader holds it alone
          detached: true,
        });
      } catch {
        continue; // it ended meanwhile, or someone else took it
      }
      p.agent = { close: () => h.disconnect?.(), pauseOutput: (on) => h.hold?.(on) };
      p.attach(h, (on) => h.hold?.(on));
      this.d.runs(box, p, () => {});
    }
    this.done.add(box.id);
  }

  /** the sandbox is gone */
  forget(id: string): void {
    this.done.delete(id);
  }
}
