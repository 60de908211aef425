import { handleOf } from '../lifecycle/handle.js';
import { freezeMark, thawOrphans } from '../lifecycle/inflight.js';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import type { AgentClient, ExecHandle, ExecResult as AgentExecResult } from '../../agent/client.js';
import type { KeptProcess } from '../../sdk/api.js';
import { deadError } from '../../drivers/namespaces/driver.js';
import { SnaplabError, isSnaplabError } from '../../errors.js';
import { cgroupFor, oomKills } from '../../host/cgroups/cgroups.js';
import type { SandboxRecord, SnapshotRecord } from '../../store/records.js';
import type { MemoryImage } from '../../drivers/driver.js';
import type { Volume } from '../../storage/backend.js';
import type { Trace } from '../../timing/trace.js';
import type { LabContext } from '../context.js';
import { mergeEnv } from './exec.js';
import { windowSize } from '../../agent/protocol.js';
import { resolveUser } from './users.js';
import { inflight } from '../lifecycle/inflight.js';
import { feedInput } from './streams.js';
import { reconcile } from '../lifecycle/reconcile.js';
import { checkName, newId } from '../names.js';
import { metaOf } from '../meta.js';
import { STOPPED, checkStoppable, isStopped, underStateLock } from '../lifecycle/stopped.js';
import { handledElsewhere, noted } from '../../cleanup.js';

export interface ExecOptions {
  /** added to (or replacing) the default environment */
  env?: Record<string, string> | string[];
  cwd?: string;
  /**
   * run as this user: a name or uid, with an optional group (`nginx`, `1000`, `1000:1000`,
   * `app:staff`), looked up in the sandbox's own /etc/passwd and /etc/group as Docker does
   */
  user?: string;
  /** kill the command (its whole process group) after this long; the result has exitCode 124 */
  timeoutMs?: number;
  /**
   * data or a stream to feed to the command's stdin (true: a pipe the caller feeds through
   * spawn()'s write/end); without it stdin is /dev/null
   */
  stdin?: string | Buffer | Readable | true;
  /**
   * run on a pseudo-terminal of this size inside the machine: the command leads a session with
   * it as its controlling terminal, its output and errors both come as stdout
   */
  tty?: { cols: number; rows: number };
  /** stream output as it comes; a stream given a callback is not collected into the result */
  onStdout?: (chunk: Buffer) => void;
  onStderr?: (chunk: Buffer) => void;
  signal?: AbortSignal;
  /**
   * (the library's exec, spawn and run) the result's stdout and stderr as strings (`utf8`, the
   * default) or Buffers (`buffer`)
   */
  encoding?: 'utf8' | 'buffer';
}

export interface ExecResult extends AgentExecResult {
  /** the command was killed by the kernel's OOM killer inside the sandbox's memory limit */
  oomKilled: boolean;
}

/** Throw the right error when a sandbox cannot take commands: dead (and why), paused, not ready. */
export async function ensureUsable(ctx: LabContext, s: SandboxRecord): Promise<void> {
  if (s.state === 'paused')
    throw new SnaplabError(
      'SANDBOX_PAUSED',
      `sandbox ${s.name} is paused`,
      `resume it with \`snaplab resume ${s.name}\``,
    );
  if (isStopped(s))
    throw new SnaplabError(
      'SANDBOX_STOPPED',
      `sandbox ${s.name} is stopped`,
      `start it again (\`snaplab start ${s.name}\`), snapshot it, or remove it with \`snaplab rm ${s.name}\``,
    );
  if (s.state === 'dead') throw deadError(s.name, s.reason ?? undefined);
  if (s.state !== 'running')
    throw new SnaplabError(
      'SANDBOX_DEAD',
      `sandbox ${s.name} is ${s.state}`,
      `wait, or remove it with \`snaplab rm ${s.name}\``,
    );
  const now = await reconcile(ctx, s); // a machine found dead is also reaped there
  if (now.state === 'dead') throw deadError(s.name, now.reason ?? undefined);
}

export async function connectAgent(ctx: LabContext, s: SandboxRecord): Promise<AgentClient> {
  await ensureUsable(ctx, s);
  try {
    return await ctx.driver(s.driver).connect(handleOf(s));
  } catch (e) {
    await ensureUsable(ctx, s); // died meanwhile? say so
    throw e;
  }
}

/** Run argv in the sandbox through an open agent connection; map a lost agent to "it died, because...". */
export async function execIn(
  ctx: LabContext,
  s: SandboxRecord,
  agent: AgentClient,
  argv: string[],
  opts: ExecOptions = {},
): Promise<ExecResult> {
  return (await spawnIn(ctx, s, agent, argv, opts)).result;
}

/** A command started in a sandbox: feed it, signal it, resize its terminal, await its result. */
export interface ExecProcess {
  /** its pid as the machine sees it */
  pid: Promise<number>;
  /** (stdin: true) send input; false means wait for drained() before writing more */
  write(b: Buffer | string): boolean;
  drained(): Promise<void>;
  /** (stdin: true) end of input */
  end(): void;
  /** a signal to the command's whole process group */
  kill(signal: number): void;
  /** (tty) a new terminal size: the command gets SIGWINCH */
  resize(cols: number, rows: number): void;
  /**
   * hold (true) or release its output at the machine's agent, the connection's other commands going
   * on: where the connection is the agent's own, or a VM's relay that routes it (protocol 1.7)
   */
  hold?: (on: boolean) => void;
  result: Promise<ExecResult>;
}

/** The sandbox's OOM kill count now (0 when it cannot be read: a command is then not called OOM-killed). */
function oomCount(id: string): number {
  const cg = cgroupFor(id);
  try {
    return oomKills(cg);
  } catch {
    return 0;
  }
}

/** Start argv in the sandbox without waiting for it (execIn waits). */
export async function spawnIn(
  ctx: LabContext,
  s: SandboxRecord,
  agent: AgentClient,
  argv: string[],
  opts: ExecOptions & { keep?: { tag?: string }; waitOutput?: boolean } = {},
): Promise<ExecProcess> {
  if (argv.length === 0)
    throw new SnaplabError(
      'BAD_INPUT',
      'no command given',
      'put the command after --, e.g. `snaplab exec box -- ls -l /`',
    );
  // an open connection to a frozen agent would wait for ever: say it is paused
  if (s.state === 'paused')
    throw new SnaplabError(
      'SANDBOX_PAUSED',
      `sandbox ${s.name} is paused`,
      `resume it with \`snaplab resume ${s.name}\``,
    );
  const env = mergeEnv(opts.env);
  const limited = s.limits.memoryBytes !== undefined;
  // the OOM counter before every command, as the C fast path reads it: a kill in a command that
  // did not end in SIGKILL (a pipeline's `|| true`) must not be laid at the next one's door
  const oomBefore = limited ? oomCount(s.id) : 0;
  const user = opts.user === undefined ? undefined : await resolveUser(agent, opts.user);
  const tty = opts.tty === undefined ? undefined : windowSize(opts.tty.cols, opts.tty.rows);
  if (opts.keep?.tag !== undefined && Buffer.byteLength(opts.keep.tag) > KEPT_TAG_MAX)
    throw new SnaplabError('BAD_INPUT', `a kept command's tag is at most ${KEPT_TAG_MAX} bytes of UTF-8`);
  const keep = opts.keep ? { tag: opts.keep.tag === undefined ? 'L0:' : `L1:${opts.keep.tag}` } : undefined;
  const h = agent.exec(
    {
      argv,
      env,
      cwd: opts.cwd,
      user,
      timeoutMs: opts.timeoutMs,
      stdin: opts.stdin !== undefined,
      tty,
      keep,
      waitOutput: opts.waitOutput,
    },
    { onStdout: opts.onStdout, onStderr: opts.onStderr, signal: opts.signal },
  );
  if (opts.stdin !== undefined && opts.stdin !== true) feedInput(h, opts.stdin);
  return processOf(ctx, s, agent, h, limited, oomBefore);
}

/** A started (or attached) command as the Lab hands it out: its result says whether the OOM killer ended it. */
function processOf(
  ctx: LabContext,
  s: SandboxRecord,
  agent: AgentClient,
  h: ExecHandle,
  limited: boolean,
  oomBefore: number,
): ExecProcess {
  const result = (async (): Promise<ExecResult> => {
    let r: AgentExecResult;
    try {
      r = await h.result;
    } catch (e) {
      if (isSnaplabError(e, 'AGENT_UNREACHABLE')) await ensureUsable(ctx, s);
      throw e;
    }
    let oomKilled = false;
    // killed by SIGKILL, itself or (a shell's 137) the child it waited for: the OOM killer's if
    // the memory cgroup counted a kill meanwhile
    if ((r.signal === 9 || r.exitCode === 128 + 9) && !r.timedOut && limited) {
      oomKilled = oomCount(s.id) > oomBefore;
    }
    return { ...r, oomKilled };
  })();
  result.catch(handledElsewhere); // the caller awaits it; an early failure must not be unhandled meanwhile
  return {
    pid: h.pid,
    write: (b) => h.write(b),
    drained: () => h.drained(),
    end: () => h.end(),
    kill: (sig) => h.kill(sig),
    resize: (cols, rows) => h.resize(windowSize(cols, rows)),
    // the agent's own connection holds one exec from 1.2; a VM's relay routes a client's hold from 1.7
    ...((ctx.driver(s.driver).capabilities.execHold && agent.speaks(2)) || agent.speaks(7)
      ? { hold: (on: boolean) => h.hold(on) }
      : {}),
    result,
  };
}

/** The most bytes of a kept command's own tag: the agent's 4096, less the Lab's mark before it. */
export const KEPT_TAG_MAX = 4093;

/** The kept commands (spawn's `keep`) of a sandbox that still run, oldest first. */
export async function keptIn(agent: AgentClient): Promise<KeptProcess[]> {
  const now = Date.now();
  return (await agent.kept()).map((k) => ({
    pid: k.pid,
    tag: tagOf(k.tag),
    tty: k.tty,
    stdin: k.stdin,
    held: k.held,
    startedAt: now - k.ageMs,
  }));
}

/**
 * What spawn's `tag` was: the agent gives back what the Lab gave it ("L1:" and the tag, "L0:" for
 * none), as the machine's root may have left it (it can write the agent's memory): anything else
 * is no tag.
 */
function tagOf(raw: string): string | null {
  return raw.startsWith('L1:') ? raw.slice(3) : null;
}

/** Take on a kept command by pid: its output from now on, its input, signals and end. */
export async function attachIn(
  ctx: LabContext,
  s: SandboxRecord,
  agent: AgentClient,
  pid: number,
  opts: ExecOptions = {},
): Promise<ExecProcess & { since: number }> {
  if (!Number.isInteger(pid) || pid <= 0 || pid > 0xffffffff)
    throw new SnaplabError('BAD_INPUT', `bad pid ${pid}`, 'a pid as kept() gives it');
  if (s.state === 'paused')
    throw new SnaplabError(
      'SANDBOX_PAUSED',
      `sandbox ${s.name} is paused`,
      `resume it with \`snaplab resume ${s.name}\``,
    );
  const limited = s.limits.memoryBytes !== undefined;
  const oomBefore = limited ? oomCount(s.id) : 0;
  const h = agent.attach(pid, { onStdout: opts.onStdout, onStderr: opts.onStderr, signal: opts.signal });
  h.result.catch(handledElsewhere); // a refused attach rejects both: the pid's is the one answered
  try {
    await h.pid;
  } catch (e) {
    const m = isSnaplabError(e, 'AGENT_ERROR') ? /\((ESRCH|EBUSY)\)$/.exec(e.message) : null;
    if (m?.[1] === 'ESRCH')
      throw new SnaplabError(
        'PROCESS_NOT_FOUND',
        `no kept command has pid ${pid} in sandbox ${s.name}`,
        'it has ended, or was not started with keep: list them with kept()',
      );
    if (m?.[1] === 'EBUSY')
      throw new SnaplabError(
        'PROCESS_BUSY',
        `command ${pid} in sandbox ${s.name} is held by another connection`,
        'it is attached elsewhere; a connection that goes lets it go',
      );
    throw e;
  }
  return { ...processOf(ctx, s, agent, h, limited, oomBefore), since: await h.since };
}

export interface SnapshotOptions {
  /** the whole machine state too (drivers that can: VMs), so a restore continues it */
  memory?: boolean;
  /**
   * the connection to use when the guest must first write its cache to its disk (a VM): the
   * caller's own, if it holds one; else one is opened
   */
  agent?: () => Promise<AgentClient>;
  /** snaplab's own snapshot (a pool's template), under a name users cannot give (checkName skipped) */
  internal?: boolean;
}

/**
 * Freeze the sandbox, snapshot its filesystem, thaw it (even when the snapshot fails). With
 * `memory`, the whole machine state too, taken while it is frozen, so memory and disk agree.
 */
export async function snapshotSandbox(
  ctx: LabContext,
  s: SandboxRecord,
  name: string,
  trace: Trace,
  opts: SnapshotOptions = {},
): Promise<SnapshotRecord> {
  if (!opts.internal) checkName('snapshot', name);
  const memory = opts.memory === true;
  const driver = ctx.driver(s.driver);
  if (memory && !driver.snapshotMemory) {
    throw new SnaplabError(
      'BAD_INPUT',
      `the ${s.driver} driver cannot snapshot memory: processes do not survive its snapshots`,
      'drop --memory (a filesystem snapshot), or use --driver qemu',
    );
  }
  return underStateLock(ctx, s, async () => {
    if (ctx.store.getSnapshot(name)) {
      throw new SnaplabError(
        'SNAPSHOT_EXISTS',
        `a snapshot named ${name} already exists`,
        `pick another --name, or remove it with \`snaplab snapshot rm ${name}\``,
      );
    }
    // a stopped machine's filesystem is still: taken as it is, like a paused one's
    const still = s.state === 'paused' || isStopped(s);
    if (memory && isStopped(s))
      throw new SnaplabError(
        'BAD_INPUT',
        `sandbox ${s.name} is stopped: it has no memory to snapshot`,
        'drop --memory',
      );
    if (!still) await ensureUsable(ctx, s);
    if (!s.volume)
      throw new SnaplabError(
        'INTERNAL',
        `sandbox ${s.name} has no volume recorded`,
        'remove it with `snaplab rm` and create it again',
      );
    // everything that can fail without touching the machine comes before the freeze
    const backend = await ctx.readyBackend(s.storage);
    const wasPaused = still;
    // a filesystem snapshot of a VM: its kernel's dirty pages first (a memory snapshot has them)
    if (!memory && driver.capabilities.guestCache && !wasPaused) {
      await trace.phase('guest sync', async () => {
        const r = await execIn(ctx, s, opts.agent ? await opts.agent() : await connectAgent(ctx, s), ['sync']);
        if (r.exitCode !== 0)
          throw new SnaplabError(
            'AGENT_ERROR',
            `sync in ${s.name} failed (exit ${r.exitCode}): ${r.stderr.toString().trim()}`,
            'does the image have sync (busybox has)?',
          );
      });
    }
    return inflight(ctx, 'snapshot', async () => {
      let volume: Volume | undefined;
      let image: MemoryImage | undefined;
      let failed = true;
      const dir = join(ctx.home, 'snapshots', newId());
      // marked first: a process killed while the machine is frozen leaves the mark, by which the
      // next ls, gc, check or resume thaws it (thawOrphans)
      const unmark = wasPaused ? (_thawed: boolean) => {} : freezeMark(ctx, s.id);
      if (!wasPaused) await trace.phase('freeze', () => driver.pause(handleOf(s))).catch(unmarked(unmark));
      try {
        // memory and disk are taken while the machine stands still, so they agree
        volume = await trace.phase('snapshot storage', () => backend.snapshot(s.volume!));
        if (memory) image = await driver.snapshotMemory!(handleOf(s), dir, trace);
        failed = false;
      } catch (e) {
        if (volume) await backend.delete(volume).catch(noted(`remove volume ${volume?.id}`));
        await rm(dir, { recursive: true, force: true });
        throw e;
      } finally {
        let thawed = true;
        if (!wasPaused)
          await trace
            .phase('thaw', () => driver.resume(handleOf(s)))
            .catch((e: unknown) => {
              // a failed thaw leaves its mark: the next ls, gc or resume tries again
              thawed = false;
              unmark(false);
              // a failed thaw must not hide why the snapshot failed
              if (!failed) throw e;
            });
        if (thawed) unmark(true);
      }
      const rec = snapshotRecord(ctx, s, name, volume, image);
      let recorded = false;
      try {
        recorded = ctx.store.insertSnapshot(rec);
      } finally {
        // not recorded (the name is taken, or the insert failed): what was made is nobody's
        if (!recorded) {
          await backend.delete(volume);
          await rm(dir, { recursive: true, force: true });
        }
      }
      if (!recorded)
        throw new SnaplabError('SNAPSHOT_EXISTS', `a snapshot named ${name} already exists`, 'pick another --name');
      return rec;
    });
  });
}

/** What a snapshot of this machine is, as stored: it belongs to whom the machine belonged. */
function snapshotRecord(
  ctx: LabContext,
  s: SandboxRecord,
  name: string,
  volume: Volume,
  image: MemoryImage | undefined,
): SnapshotRecord {
  return {
    name,
    id: volume.id,
    sandbox: s.name,
    image: s.image,
    storage: s.storage,
    volume,
    limits: s.limits,
    createdAt: Date.now(),
    driver: s.driver,
    memory: image ? { ...image, driver: s.driver } : null,
    init: s.init ?? null,
    ids: s.ids ?? null,
    owner: metaOf(ctx, s.id).owner,
  };
}

export async function pauseSandbox(ctx: LabContext, s: SandboxRecord, trace: Trace): Promise<void> {
  await underStateLock(ctx, s, async () => {
    if (s.state === 'paused') return;
    await ensureUsable(ctx, s);
    await trace.phase('freeze', () => ctx.driver(s.driver).pause(handleOf(s)));
    ctx.store.updateSandbox(s.id, { state: 'paused' });
    s.state = 'paused';
  });
}

/**
 * Stop a machine and keep its filesystem: a system machine's systemd is asked to halt (services
 * stopped, filesystems synced) and killed only past the grace period (a system VM's with
 * `systemctl poweroff` in the guest); any other VM's cache is written to its disk first. The
 * record stays (state dead, reason STOPPED) for `start`, `snapshot` and `rm`, with its user
 * namespace range and its egress namespace (no process holds either), so `start` raises it again
 * as it was. A machine stopped already is refused (SANDBOX_STOPPED).
 */
export async function stopSandbox(ctx: LabContext, s: SandboxRecord, trace: Trace): Promise<void> {
  await underStateLock(ctx, s, async () => {
    checkStoppable(s);
    if (s.state !== 'running' && s.state !== 'paused') await ensureUsable(ctx, s); // says why not
    const driver = ctx.driver(s.driver);
    if (driver.capabilities.guestCache && s.state === 'running') {
      // a system VM's systemd halts it (units stopped, disks synced) and QEMU exits with the
      // guest; any other VM is synced, then killed
      if (s.init === 'systemd')
        await trace.phase('guest halt', () => guestHalt(ctx, s)).catch(noted(`halt ${s.name} from inside`));
      else {
        await trace
          .phase('guest sync', async () => {
            const agent = await connectAgent(ctx, s);
            try {
              await execIn(ctx, s, agent, ['sync']);
            } finally {
              // not awaited: close() never rejects (it ends the socket, and destroys it after 1 s)
              void agent.close();
            }
          })
          .catch(noted(`sync ${s.name} before the kill`));
      }
    }
    await trace.phase('halt', () => driver.destroy(handleOf(s), { halt: true }));
    ctx.store.updateSandbox(s.id, { state: 'dead', reason: STOPPED });
    Object.assign(s, { state: 'dead', reason: STOPPED });
  });
}

/** How long a system VM's guest may take to power off before its QEMU is killed (emulated: seconds). */
const GUEST_HALT_GRACE_MS = 30_000;

/** `systemctl poweroff` in the guest, then wait for its QEMU to exit (it does when the guest powers off). */
async function guestHalt(ctx: LabContext, s: SandboxRecord): Promise<void> {
  const driver = ctx.driver(s.driver);
  const agent = await connectAgent(ctx, s);
  try {
    // --no-block: the answer comes before the agent's own unit is stopped
    await execIn(ctx, s, agent, ['systemctl', 'poweroff', '--no-block'], { timeoutMs: 10_000 });
  } finally {
    // not awaited: close() never rejects (it ends the socket, and destroys it after 1 s)
    void agent.close();
  }
  const end = Date.now() + GUEST_HALT_GRACE_MS;
  while (Date.now() < end && (await driver.inspect(handleOf(s))).state !== 'dead')
    await new Promise((r) => setTimeout(r, 100));
}

export async function resumeSandbox(ctx: LabContext, s: SandboxRecord, trace: Trace): Promise<void> {
  await underStateLock(ctx, s, async () => {
    if (s.state !== 'paused') {
      // running already, unless a snapshot killed mid-way left it frozen: then thawed
      if (s.state === 'running') {
        await trace.phase('thaw', () => thawOrphans(ctx, { id: s.id, locked: true }));
        return;
      }
      await ensureUsable(ctx, s);
    }
    await trace.phase('thaw', () => ctx.driver(s.driver).resume(handleOf(s)));
    ctx.store.updateSandbox(s.id, { state: 'running' });
    s.state = 'running';
  });
}

/** A freeze that failed holds no machine frozen: its mark goes, and the failure goes on. */
const unmarked =
  (unmark: (thawed: boolean) => void) =>
  (e: unknown): never => {
    unmark(true);
    throw e;
  };
