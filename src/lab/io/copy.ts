/**
 * Copying files and trees into, out of and between machines (`snaplab cp`, sandbox.upload /
 * download): a tar stream between two `snaplab-agent tar|untar` processes (native/copy.c), one on
 * the host (the agent's glibc build, snaplab-agent-host) and one run in the machine by its agent
 * (the static binary at /run/snaplab/agent in every machine, VMs included). The receiving side decides where things
 * go (docker cp's rules) and resolves every name below its destination without following a
 * symbolic link, so a hostile archive — or a hostile machine's — cannot write outside it.
 * Streamed with flow control on both legs: a 1 GiB file never sits in memory.
 */
import { spawn } from 'node:child_process';
import { posix } from 'node:path';
import { PassThrough, type Readable, type Writable } from 'node:stream';
import { hostAgentBinaryPath } from '../../agent/binary.js';
import { MACHINE_AGENT_PATH } from '../../drivers/driver.js';
import { SnaplabError } from '../../errors.js';
import type { SandboxRecord } from '../../store/records.js';
import type { LabContext } from '../context.js';
import type { AgentClient } from '../../agent/client.js';
import { connectAgent, spawnIn, type ExecProcess } from './sandbox-ops.js';
import { feedInput, outputTo } from './streams.js';
import { handledElsewhere } from '../../cleanup.js';

export interface CopyResult {
  /** bytes of the tar stream that went across */
  bytes: number;
  /** what either side could not keep (an owner, a device node, setuid bits out of a machine), one line each */
  warnings: string[];
  /** false when a side had to leave something out (an unreadable file, an owner it could not set) */
  complete: boolean;
}

/** How each side of a copy ended: its exit code and its stderr lines. */
interface SideEnd {
  code: number;
  lines: string[];
}

const WARNING = /^snaplab: cp: warning: /;

/** A side's warnings, and its fatal message: the last one (one process), or the first (tar | untar in one). */
function ends(lines: string[], which: 'first' | 'last' = 'last'): { fatal: string | undefined; warnings: string[] } {
  const warnings = lines.filter((l) => WARNING.test(l)).map((l) => l.replace(WARNING, ''));
  const fatals = lines.filter((l) => l && !WARNING.test(l)).map((l) => l.replace(/^snaplab: cp: /, ''));
  return { fatal: which === 'first' ? fatals[0] : fatals.at(-1), warnings };
}

/** A machine raised by a snaplab older than cp: its agent has no tar/untar/cp and prints its usage. */
function refuseOldAgent(lines: string[]): void {
  if (lines.some((l) => l.startsWith('usage: snaplab-agent'))) {
    throw new SnaplabError(
      'AGENT_PROTOCOL',
      "cp: the machine's agent cannot copy files (it is older than snaplab cp)",
      'recreate the machine with this snaplab (its agent is the one it was raised with)',
    );
  }
}

/** The error of a failed copy: the side that failed first in the stream's order says why. */
function verdict(where: string, sender: SideEnd, receiver: SideEnd, bytes: number): CopyResult {
  refuseOldAgent([...sender.lines, ...receiver.lines]);
  const s = ends(sender.lines);
  const r = ends(receiver.lines);
  // a sender that could not start (no such SRC) makes the receiver see an empty archive: the sender's reason
  if (sender.code >= 2 && s.fatal)
    throw new SnaplabError('COPY_FAILED', `cp: ${s.fatal}`, `nothing or part was copied ${where}`);
  if (receiver.code >= 2)
    throw new SnaplabError(
      'COPY_FAILED',
      `cp: ${r.fatal ?? `the receiving side failed (exit ${receiver.code})`}`,
      `the copy ${where} stopped there; what it wrote before stays`,
    );
  if (sender.code >= 2)
    throw new SnaplabError(
      'COPY_FAILED',
      `cp: the sending side failed (exit ${sender.code})`,
      'see the messages above',
    );
  return { bytes, warnings: [...s.warnings, ...r.warnings], complete: sender.code === 0 && receiver.code === 0 };
}

/** stderr lines of a side; control characters (a hostile machine's escape sequences) shown as ?. */
const lines = (b: Buffer[]): string[] =>
  Buffer.concat(b)
    .toString('utf8')
    .split('\n')
    .filter(Boolean)
    // biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are what it replaces
    .map((l) => l.replace(/[\u0000-\u001f\u007f-\u009f]/g, '?'));

/**
 * What a machine's tar of `src` must begin with, and the path to give it: its last component,
 * or "." for a directory's contents (`dir/.`, `/`). The receiver checks it (`untar --expect`), so
 * a hostile machine cannot choose what lands in the destination. `..` is resolved here, as text.
 */
export function sourceName(src: string): { path: string; expect: string } {
  if (!src)
    throw new SnaplabError('BAD_INPUT', 'no path to copy from', 'give the path in the machine, e.g. /etc/hosts');
  const contents = src === '/' || /(^|\/)\.\/*$/.test(src);
  const norm = posix.normalize(src.startsWith('/') ? src : `/${src}`).replace(/\/+$/, '') || '/';
  if (contents || norm === '/') return { path: norm === '/' ? '/.' : `${norm}/.`, expect: '.' };
  return { path: src.endsWith('/') ? `${norm}/` : norm, expect: posix.basename(norm) };
}

/** `snaplab-agent ARGS` on the host (its glibc build: hostAgentBinaryPath says why). */
function hostHelper(
  args: string[],
  stdio: ['pipe' | 'ignore', 'pipe' | 'ignore'],
): { proc: ReturnType<typeof spawn>; done: Promise<SideEnd> } {
  const proc = spawn(hostAgentBinaryPath(), args, { stdio: [stdio[0], stdio[1], 'pipe'] });
  const err: Buffer[] = [];
  proc.stderr!.on('data', (b: Buffer) => err.push(b));
  const done = new Promise<SideEnd>((resolve) => {
    proc.on('error', (e) =>
      resolve({ code: 2, lines: [`snaplab: cp: cannot run ${hostAgentBinaryPath()}: ${e.message}`] }),
    );
    proc.on('close', (code, signal) => resolve({ code: code ?? (signal ? 2 : 0), lines: lines(err) }));
  });
  return { proc, done };
}

/** The process producing an archive: how it ended, and a way to end it. */
interface Sender {
  done: Promise<SideEnd>;
  stop(): void;
}

/**
 * Extract the tar stream `source` at `dest` in the machine. `plain`: a user's archive, unpacked
 * into the directory dest as it is (`snaplab cp - box:/dir`); else an archive of snaplab's tar,
 * placed by docker cp's rules. `sender` is how the producer of `source` ended, when there is one.
 */
export async function sendArchive(
  ctx: LabContext,
  s: SandboxRecord,
  dest: string,
  source: Readable,
  opts: { plain?: boolean; sender?: Sender; expect?: string } = {},
): Promise<CopyResult> {
  let agent: AgentClient;
  try {
    agent = await connectAgent(ctx, s);
  } catch (e) {
    source.destroy();
    opts.sender?.stop();
    throw e;
  }
  try {
    agent.requireMinor(2, 'copy files (snaplab cp)');
    const err: Buffer[] = [];
    const flags = [...(opts.plain ? ['--plain'] : []), ...(opts.expect !== undefined ? ['--expect', opts.expect] : [])];
    const inside = await spawnIn(ctx, s, agent, [MACHINE_AGENT_PATH, 'untar', ...flags, '--', dest], {
      stdin: true,
      onStdout: () => {},
      onStderr: (b) => err.push(b),
    });
    let bytes = 0;
    source.on('data', (b: Buffer) => (bytes += b.length));
    feedInput(inside, source); // also a source that failed at once, before this was attached
    const r = await inside.result;
    if (r.exitCode >= 2) source.destroy(); // the receiver failed: the rest is moot
    // a receiver that failed reads no more, and one that ended early may never: a sender still
    // writing would wait on its pipe forever. Ours ends at once after its last block.
    if (r.exitCode >= 2) opts.sender?.stop();
    else if (opts.sender)
      void Promise.race([opts.sender.done, new Promise((res) => setTimeout(res, 5000).unref())]).then(() =>
        opts.sender!.stop(),
      );
    const sender = opts.sender ? await opts.sender.done : { code: 0, lines: [] };
    return verdict(`in ${s.name}:${dest}`, sender, { code: r.exitCode, lines: lines(err) }, bytes);
  } finally {
    await agent.close();
  }
}

/**
 * Stream the tar of `src` in the machine (snaplab's tar: named after its last component, or its
 * contents for `dir/.`) into `sink`, pausing the machine's output while the sink is full.
 * `receiver` is how the consumer of the stream ended, when there is one.
 */
export async function receiveArchive(
  ctx: LabContext,
  s: SandboxRecord,
  src: string,
  sink: Writable,
  opts: { follow?: boolean; receiver?: Promise<SideEnd> } = {},
): Promise<CopyResult> {
  const agent = await connectAgent(ctx, s);
  try {
    agent.requireMinor(2, 'copy files (snaplab cp)');
    const err: Buffer[] = [];
    let bytes = 0;
    let sinkFailed = false;
    let ending = false;
    let inside: ExecProcess | undefined;
    // a sink that fails or goes (a host untar that exited, a destroyed stream): the machine's tar is ended
    const write = outputTo(agent, sink, () => {
      if (ending) return;
      sinkFailed = true;
      inside?.kill(9);
    });
    inside = await spawnIn(ctx, s, agent, [MACHINE_AGENT_PATH, 'tar', ...(opts.follow ? ['-L'] : []), '--', src], {
      onStdout: (b) => {
        bytes += b.length;
        write(b);
      },
      onStderr: (b) => err.push(b),
    });
    if (sinkFailed) inside.kill(9);
    const r = await inside.result;
    ending = true;
    await new Promise<void>((resolve) => (sinkFailed || sink.destroyed ? resolve() : sink.end(resolve)));
    const receiver = (await opts.receiver) ?? { code: 0, lines: [] };
    return verdict(`to ${sinkName(sink)}`, { code: r.exitCode, lines: lines(err) }, receiver, bytes);
  } finally {
    await agent.close();
  }
}

const sinkName = (w: Writable): string => (w === process.stdout ? 'stdout' : 'the destination');

/** A host path (file or tree) into the machine at dest. */
export async function copyIn(
  ctx: LabContext,
  s: SandboxRecord,
  hostSrc: string,
  dest: string,
  opts: { follow?: boolean } = {},
): Promise<CopyResult> {
  const tar = hostHelper(['tar', ...(opts.follow ? ['-L'] : []), '--', hostSrc], ['ignore', 'pipe']);
  // taken at once: Node discards a child's unread output when it exits (a small tree is done
  // before the machine's side has started)
  const out = tar.proc.stdout!.pipe(new PassThrough({ highWaterMark: 1024 * 1024 }));
  try {
    return await sendArchive(ctx, s, dest, out, { sender: { done: tar.done, stop: () => tar.proc.kill('SIGKILL') } });
  } finally {
    tar.proc.kill('SIGKILL'); // a no-op once it has exited
  }
}

/**
 * A path of the machine to hostDest. Root inside may have made anything, so nothing is created
 * on the host with setuid/setgid bits and no device node at all (`untar --untrusted`).
 */
export async function copyOut(
  ctx: LabContext,
  s: SandboxRecord,
  src: string,
  hostDest: string,
  opts: { follow?: boolean } = {},
): Promise<CopyResult> {
  const from = sourceName(src);
  const untar = hostHelper(['untar', '--untrusted', '--expect', from.expect, '--', hostDest], ['pipe', 'ignore']);
  try {
    return await receiveArchive(ctx, s, from.path, untar.proc.stdin!, { follow: opts.follow, receiver: untar.done });
  } finally {
    untar.proc.kill('SIGKILL');
  }
}

/**
 * Between two paths of one machine: `agent cp` (tar | untar) in one exec inside it. Through the
 * host, a VM's two halves would share its relay's one stream, where the reader's slowness
 * stalls the writer's acknowledgements (docs/agent-protocol.md, "Flow control").
 */
async function copyWithin(
  ctx: LabContext,
  s: SandboxRecord,
  src: string,
  dest: string,
  opts: { follow?: boolean },
): Promise<CopyResult> {
  const from = sourceName(src);
  const agent = await connectAgent(ctx, s);
  try {
    agent.requireMinor(2, 'copy files (snaplab cp)');
    const err: Buffer[] = [];
    const r = await (
      await spawnIn(
        ctx,
        s,
        agent,
        [MACHINE_AGENT_PATH, 'cp', ...(opts.follow ? ['-L'] : []), '--expect', from.expect, '--', from.path, dest],
        { onStdout: () => {}, onStderr: (b) => err.push(b) },
      )
    ).result;
    const all = lines(err);
    refuseOldAgent(all);
    // the first failure says why: the untar half's "empty archive" only follows the tar half's
    const { fatal, warnings } = ends(all, 'first');
    if (r.exitCode >= 2)
      throw new SnaplabError(
        'COPY_FAILED',
        `cp: ${fatal ?? `failed (exit ${r.exitCode})`}`,
        `the copy in ${s.name} stopped there; what it wrote before stays`,
      );
    return { bytes: 0, warnings, complete: r.exitCode === 0 };
  } finally {
    await agent.close();
  }
}

/** From one machine to another, machine to machine, without a copy on the host's disk. */
export async function copyBetween(
  ctx: LabContext,
  from: SandboxRecord,
  src: string,
  to: SandboxRecord,
  dest: string,
  opts: { follow?: boolean } = {},
): Promise<CopyResult> {
  if (from.id === to.id) return copyWithin(ctx, from, src, dest, opts);
  const pipe = new PassThrough({ highWaterMark: 1024 * 1024 });
  let receiverDone!: (e: SideEnd) => void;
  const receiver = new Promise<SideEnd>((res) => (receiverDone = res));
  const from_ = sourceName(src);
  const sending = sendArchive(ctx, to, dest, pipe, { expect: from_.expect }).then(
    (r) => {
      receiverDone({ code: r.complete ? 0 : 1, lines: r.warnings.map((w) => `snaplab: cp: warning: ${w}`) });
      // the sending machine's tar ends right after its last block; one that keeps writing
      // (nobody reads any more) is ended, and reported, after a grace
      setTimeout(() => pipe.destroy(), 5000).unref();
      return r;
    },
    (e: unknown) => {
      receiverDone({ code: 2, lines: [`snaplab: cp: ${(e as Error).message.replace(/^cp: /, '')}`] });
      pipe.destroy();
      throw e;
    },
  );
  sending.catch(handledElsewhere);
  let r: CopyResult;
  try {
    r = await receiveArchive(ctx, from, from_.path, pipe, { follow: opts.follow, receiver });
  } catch (e) {
    pipe.destroy(); // the receiving machine's untar ends (its input closed) instead of waiting
    await sending.catch(handledElsewhere);
    throw e;
  }
  await sending;
  return r;
}
