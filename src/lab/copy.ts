/**
 * Copying files and trees into, out of and between machines (`snaplab cp`, sandbox.upload /
 * download): a tar stream between two `snaplab-agent tar|untar` processes (native/copy.c), one on
 * the host and one run in the machine by its agent (the same static binary is at
 * /run/snaplab/agent in every machine, VMs included). The receiving side decides where things
 * go (docker cp's rules) and resolves every name below its destination without following a
 * symbolic link, so a hostile archive — or a hostile machine's — cannot write outside it.
 * Streamed with flow control on both legs: a 1 GiB file never sits in memory.
 */
import { spawn } from 'node:child_process';
import { PassThrough, type Readable, type Writable } from 'node:stream';
import { agentBinaryPath } from '../agent/binary.js';
import { MACHINE_AGENT_PATH } from '../drivers/driver.js';
import { SnaplabError } from '../errors.js';
import type { SandboxRecord } from '../store/records.js';
import type { LabContext } from './context.js';
import { connectAgent, spawnIn } from './sandbox-ops.js';

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

function ends(lines: string[]): { fatal: string | undefined; warnings: string[] } {
  const warnings = lines.filter((l) => WARNING.test(l)).map((l) => l.replace(WARNING, ''));
  const fatal = lines.filter((l) => l && !WARNING.test(l)).map((l) => l.replace(/^snaplab: cp: /, '')).pop();
  return { fatal, warnings };
}

/** The error of a failed copy: the side that failed first in the stream's order says why. */
function verdict(where: string, sender: SideEnd, receiver: SideEnd, bytes: number): CopyResult {
  // a machine raised by a snaplab before cp: its agent has no tar/untar and prints its usage
  if ([...sender.lines, ...receiver.lines].some((l) => l.startsWith('usage: snaplab-agent'))) {
    throw new SnaplabError('AGENT_PROTOCOL', "cp: the machine's agent cannot copy files (it is older than snaplab cp)", 'recreate the machine with this snaplab (its agent is the one it was raised with)');
  }
  const s = ends(sender.lines);
  const r = ends(receiver.lines);
  // a sender that could not start (no such SRC) makes the receiver see an empty archive: the sender's reason
  if (sender.code >= 2 && s.fatal) throw new SnaplabError('COPY_FAILED', `cp: ${s.fatal}`, `nothing or part was copied ${where}`);
  if (receiver.code >= 2) throw new SnaplabError('COPY_FAILED', `cp: ${r.fatal ?? `the receiving side failed (exit ${receiver.code})`}`, `the copy ${where} stopped there; what it wrote before stays`);
  if (sender.code >= 2) throw new SnaplabError('COPY_FAILED', `cp: the sending side failed (exit ${sender.code})`, 'see the messages above');
  return { bytes, warnings: [...s.warnings, ...r.warnings], complete: sender.code === 0 && receiver.code === 0 };
}

const lines = (b: Buffer[]): string[] => Buffer.concat(b).toString('utf8').split('\n').filter(Boolean);

/** `snaplab-agent ARGS` on the host. */
function hostHelper(args: string[], stdio: ['pipe' | 'ignore', 'pipe' | 'ignore']): { proc: ReturnType<typeof spawn>; done: Promise<SideEnd> } {
  const proc = spawn(agentBinaryPath(), args, { stdio: [stdio[0], stdio[1], 'pipe'] });
  const err: Buffer[] = [];
  proc.stderr!.on('data', (b: Buffer) => err.push(b));
  const done = new Promise<SideEnd>((resolve) => {
    proc.on('error', (e) => resolve({ code: 2, lines: [`snaplab: cp: cannot run ${agentBinaryPath()}: ${e.message}`] }));
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
export async function sendArchive(ctx: LabContext, s: SandboxRecord, dest: string, source: Readable, opts: { plain?: boolean; sender?: Sender } = {}): Promise<CopyResult> {
  const agent = await connectAgent(ctx, s);
  try {
    agent.requireMinor(2, 'copy files (snaplab cp)');
    const err: Buffer[] = [];
    const inside = await spawnIn(ctx, s, agent, [MACHINE_AGENT_PATH, 'untar', ...(opts.plain ? ['--plain'] : []), '--', dest], {
      stdin: true,
      onStdout: () => {},
      onStderr: (b) => err.push(b),
    });
    let bytes = 0;
    source.on('data', (b: Buffer) => {
      bytes += b.length;
      if (inside.write(b)) return;
      source.pause();
      void inside.drained().then(() => source.resume());
    });
    source.on('end', () => inside.end());
    source.on('error', () => inside.end());
    const r = await inside.result;
    source.destroy(); // the receiver stopped (it failed, or took the end blocks): the rest is moot
    // a receiver that failed reads no more: a sender still writing would wait on its pipe forever
    if (r.exitCode >= 2) opts.sender?.stop();
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
    let stop = (): void => {};
    sink.on('error', () => {
      sinkFailed = true;
      stop(); // nobody takes the rest: end the machine's tar instead of streaming into the void
    });
    const inside = await spawnIn(ctx, s, agent, [MACHINE_AGENT_PATH, 'tar', ...(opts.follow ? ['-L'] : []), '--', src], {
      onStdout: (b) => {
        bytes += b.length;
        if (sinkFailed || sink.write(b)) return;
        agent.pauseOutput(true);
        sink.once('drain', () => agent.pauseOutput(false));
      },
      onStderr: (b) => err.push(b),
    });
    stop = () => inside.kill(9);
    if (sinkFailed) stop();
    const r = await inside.result;
    await new Promise<void>((resolve) => (sinkFailed ? resolve() : sink.end(resolve)));
    const receiver = opts.receiver ? await opts.receiver : { code: 0, lines: [] };
    return verdict(`to ${sinkName(sink)}`, { code: r.exitCode, lines: lines(err) }, receiver, bytes);
  } finally {
    await agent.close();
  }
}

const sinkName = (w: Writable): string => (w === process.stdout ? 'stdout' : 'the destination');

/** A host path (file or tree) into the machine at dest. */
export async function copyIn(ctx: LabContext, s: SandboxRecord, hostSrc: string, dest: string, opts: { follow?: boolean } = {}): Promise<CopyResult> {
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
export async function copyOut(ctx: LabContext, s: SandboxRecord, src: string, hostDest: string, opts: { follow?: boolean } = {}): Promise<CopyResult> {
  const untar = hostHelper(['untar', '--untrusted', '--', hostDest], ['pipe', 'ignore']);
  try {
    return await receiveArchive(ctx, s, src, untar.proc.stdin!, { follow: opts.follow, receiver: untar.done });
  } finally {
    untar.proc.kill('SIGKILL');
  }
}

/** From one machine to another, machine to machine, without a copy on the host's disk. */
export async function copyBetween(ctx: LabContext, from: SandboxRecord, src: string, to: SandboxRecord, dest: string, opts: { follow?: boolean } = {}): Promise<CopyResult> {
  const pipe = new PassThrough({ highWaterMark: 1024 * 1024 });
  let receiverDone!: (e: SideEnd) => void;
  const receiver = new Promise<SideEnd>((res) => (receiverDone = res));
  const sending = sendArchive(ctx, to, dest, pipe).then(
    (r) => (receiverDone({ code: r.complete ? 0 : 1, lines: r.warnings.map((w) => `snaplab: cp: warning: ${w}`) }), r),
    (e: unknown) => (receiverDone({ code: 2, lines: [`snaplab: cp: ${(e as Error).message.replace(/^cp: /, '')}`] }), pipe.destroy(), Promise.reject(e)),
  );
  sending.catch(() => {});
  const r = await receiveArchive(ctx, from, src, pipe, { follow: opts.follow, receiver });
  await sending;
  return r;
}
