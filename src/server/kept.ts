/**
 * Processes that outlive the daemon. A background process (and a command its caller asks to keep)
 * is kept by the machine's agent past the connection it came on (agent protocol 1.5), with a tag
 * that says which process of the daemon's it is. A daemon started later finds them the first time
 * a sandbox's processes are asked for, and takes each on under its old id: its output from then on
 * (what it wrote while no daemon held it is told as a gap), its input, signals and end.
 */
import { OneAtATime } from '../concurrency.js';
import { SnaplabError, isSnaplabError } from '../errors.js';
import { type ExecResult, KEPT_TAG_MAX } from '../lab/io/sandbox-ops.js';
import type { AttachedProcess, KeptProcess, ProcessApi, SandboxApi, SpawnOptions } from '../sdk/api.js';
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

/** the most kept commands a daemon takes on in one sandbox (each is a process of the daemon's, with its ring) */
const MAX_FOUND = 64;
/** how long a caller waits for a sandbox's kept commands to be found (its agent answers LIST_KEPT and each ATTACH) */
const FIND_MS = 10_000;

/**
 * The tag of a process to keep, its argv cut to its first word if the whole does not fit, undefined
 * if even that does not (its user tag, escaped: then it is not kept).
 */
function tagOf(p: Process): string | undefined {
  const t: KeptTag = { d: 1, id: p.id, tag: p.tag, argv: p.argv, tty: p.tty, at: p.startedAt };
  for (const argv of [p.argv, [(p.argv[0] ?? '').slice(0, 256)]]) {
    const s = JSON.stringify({ ...t, argv });
    if (Buffer.byteLength(s) <= KEPT_TAG_MAX) return s;
  }
  return undefined;
}

/**
 * A kept command's tag as a daemon wrote it, or null. The machine's root could have changed it (it
 * can write the agent's memory): it names a process of that sandbox only, and is checked field by field.
 */
export function parseTag(s: string | null, now = Date.now()): KeptTag | null {
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
    (o.tag === null || (typeof o.tag === 'string' && [...o.tag].length <= 1024)) &&
    Array.isArray(o.argv) &&
    o.argv.length > 0 &&
    o.argv.every((a) => typeof a === 'string') &&
    typeof o.tty === 'boolean' &&
    Number.isSafeInteger(o.at) &&
    (o.at as number) >= 0 &&
    (o.at as number) <= now + 60_000;
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
  // asked for in so many words, and the machine's 4 KiB cannot hold what the daemon keeps of it
  if (spec.keep === true && tag === undefined)
    throw new SnaplabError(
      'BAD_INPUT',
      `the tag of a kept command is too long once written down (${KEPT_TAG_MAX} bytes for the tag, escaped as JSON, and the command's first word)`,
      'give a shorter tag, or fewer characters JSON escapes (control characters take six bytes each)',
    );
  if (tag !== undefined) {
    try {
      const h = await box.spawn(spec.argv, { ...opts, keep: true, tag });
      p.kept = true;
      return h;
    } catch (e) {
      // an agent that cannot keep it (before 1.5; a VM's before 1.6, whose relay says 1.4): it runs as without
      if (!isSnaplabError(e, 'AGENT_PROTOCOL')) throw e;
    }
  }
  return box.spawn(spec.argv, opts);
}

/**
 * The processes a previous daemon left running, found and taken on once a sandbox; again when one
 * of them is lost (its connection broke: the machine may still run it) or was held by someone else.
 */
export class KeptProcesses {
  /** sandboxes whose kept commands this daemon has taken on */
  private readonly done = new Set<string>();
  private readonly finding = new OneAtATime(FIND_MS);
  /** a sandbox's count of forget()s: a find that saw one come meanwhile does not say it is done */
  private readonly generation = new Map<string, number>();

  constructor(
    private readonly d: Daemon,
    private readonly ringBytes: number,
  ) {}

  /**
   * Take on the sandbox's kept commands that no one holds, the first time it is asked (at once
   * after). A caller waits at most 10 s: an agent that does not answer delays its own sandbox's
   * calls only, and they go on with the processes known.
   */
  async adopt(box: SandboxApi): Promise<void> {
    if (this.done.has(box.id)) return;
    await this.finding.run(box.id, () => this.find(box));
  }

  private async find(box: SandboxApi): Promise<void> {
    const generation = this.generation.get(box.id) ?? 0;
    let kept: KeptProcess[];
    try {
      kept = await box.kept();
    } catch (e) {
      // an agent that keeps nothing (older: a namespace's before 1.5, a VM's before 1.6): nothing to find, ever
      if (isSnaplabError(e, 'AGENT_PROTOCOL')) this.done.add(box.id);
      // paused, stopped, unreachable: asked again next time
      return;
    }
    let complete = true;
    const seen = new Set<number>();
    let found = this.d.processes.of(box.id).filter((p) => p.found && !p.ended).length;
    for (const k of kept) {
      const t = parseTag(k.tag);
      if (!t || seen.has(k.pid)) continue;
      // known, unless lost (its connection broke while the machine ran it on): then taken on again
      const known = this.d.processes.has(box.id, t.id) ? this.d.processes.get(box.id, t.id) : undefined;
      if (known && !lost(known)) continue;
      seen.add(k.pid);
      if (k.held) {
        complete = false; // someone else has it now: looked for again next time
        continue;
      }
      if (found >= MAX_FOUND) break;
      const p = new Process(box.id, t.argv, t.tag, t.tty, this.ringBytes, { id: t.id, startedAt: t.at });
      p.kept = true;
      p.stdin = k.stdin;
      let h: AttachedProcess;
      try {
        h = await box.attach(k.pid, {
          onStdout: (b) => p.output('stdout', b),
          onStderr: (b) => p.output('stderr', b),
        });
      } catch {
        complete = false; // ended meanwhile, or taken: looked for again next time
        continue;
      }
      // its output counts from what it wrote before: an old daemon's offset below that is a gap
      p.ring.rebase(h.since);
      p.agent = { close: () => h.disconnect?.(), pauseOutput: (on) => h.hold?.(on) };
      p.canHold = h.hold !== undefined;
      p.attach(h, (on) => h.hold?.(on));
      // its owner's exec, as when it was started (past the key's quota if need be: it runs already)
      this.d.runs(box, p, this.d.countExec(box.owner ?? 'local'));
      found++;
    }
    if (complete && generation === (this.generation.get(box.id) ?? 0)) this.done.add(box.id);
  }

  /** Look in the sandbox again next time: one of its kept processes was lost, or it is gone. */
  forget(id: string): void {
    this.done.delete(id);
    this.generation.set(id, (this.generation.get(id) ?? 0) + 1);
  }

  /** The sandbox is gone: nothing of it is kept here. */
  drop(id: string): void {
    this.done.delete(id);
    this.generation.delete(id);
  }
}

/** A kept process whose connection broke while its machine may run it on: looked for there again. */
export function lost(p: Process): boolean {
  return p.kept && p.error?.code === 'AGENT_UNREACHABLE';
}
