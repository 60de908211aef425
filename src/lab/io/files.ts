/**
 * Files of a machine, one at a time: read and write streamed, stat, list, mkdir, remove, move.
 * Each is `snaplab-agent file ...` (native/files.c) run inside the machine as the given user, so
 * every path is the machine's own and its permissions apply; `owner` (write, mkdir, move) gives
 * what the call makes to another user, as envd does when it acts for one as root. A write lands
 * whole or not at all (a temporary file renamed over the path). A read streams with flow control:
 * its own agent connection is paused while the sink is full, so a large file never sits in memory.
 * Every other call's answer is held whole, at most MAX_ANSWER bytes (a listing of a huge tree).
 */
import { posix } from 'node:path';
import type { Readable, Writable } from 'node:stream';
import { MACHINE_AGENT_PATH } from '../../drivers/driver.js';
import { SnaplabError, isSnaplabError } from '../../errors.js';
import type { SandboxRecord } from '../../store/records.js';
import type { LabContext } from '../context.js';
import { connectAgent, execIn, spawnIn } from './sandbox-ops.js';
import { feedInput, outputTo } from './streams.js';
import { numericOwner, resolveUser } from './users.js';

/** The most a file call's answer (a stat, a listing) may hold: ~150 000 entries of a listing. */
const MAX_ANSWER = 32 << 20;

export interface FileInfo {
  name: string;
  path: string;
  type: 'file' | 'dir' | 'symlink' | 'char' | 'block' | 'fifo' | 'socket';
  size: number;
  /** octal, e.g. "0644" */
  mode: string;
  uid: number;
  gid: number;
  mtime: string;
  /** a symlink's target */
  target?: string;
  /** a symlink's end, every link followed (its real path, and what is there), when it ends at something */
  resolved?: { path: string; type: FileInfo['type'] | 'unknown'; mode: string };
  /** its `user.*` extended attributes (name to value), when it has any (a value with a NUL byte is left out) */
  xattrs?: Record<string, string>;
}

/** The `--xattr NAME=VALUE` flags of a write: only `user.*` names, no `=` in a name, no NUL anywhere. */
function xattrArgs(xattrs: Record<string, string> | undefined): string[] {
  return Object.entries(xattrs ?? {}).flatMap(([name, value]) => {
    if (!/^user\.[^=\0]+$/.test(name) || value.includes('\0'))
      throw new SnaplabError(
        'BAD_INPUT',
        `extended attribute ${JSON.stringify(name)}: a name is user.NAME (no "=", no NUL byte), a value has no NUL byte`,
        'e.g. { "user.author": "ann" }',
      );
    return ['--xattr', `${name}=${value}`];
  });
}

/** The agent's error line as an error: ENOENT is FILE_NOT_FOUND, ENOSPC and EDQUOT DISK_FULL (but a watch's), the rest FILE_ERROR with the errno name. */
export function fileError(stderr: string, code: number, what: string): SnaplabError {
  if (stderr.startsWith('usage: snaplab-agent')) {
    return new SnaplabError(
      'AGENT_PROTOCOL',
      `${what}: the machine's agent has no file commands (it is older than the daemon's file API)`,
      'recreate the machine with this snaplab',
    );
  }
  // the agent's line names the path: "snaplab: file: ENOENT: /x: No such file or directory"
  const m = /^snaplab: file: (E[A-Z0-9]+): (.*)$/m.exec(stderr);
  const verb = what.split(' ')[0];
  if (m?.[1] === 'ENOENT')
    return new SnaplabError('FILE_NOT_FOUND', `${verb} ${m[2]}`, "check the path (it is the machine's own)");
  // (a watch's ENOSPC is inotify's limit on watches, not the disk)
  if ((m?.[1] === 'ENOSPC' || m?.[1] === 'EDQUOT') && verb !== 'watch')
    return new SnaplabError(
      'DISK_FULL',
      `${verb} ${m[2]} (${m[1]})`,
      'the machine is at its disk size (--disk) or its filesystem is full: remove files, or make it with a larger --disk',
    );
  return new SnaplabError(
    'FILE_ERROR',
    m ? `${verb} ${m[2]} (${m[1]})` : `${what}: ${stderr.trim() || `exit ${code}`}`,
    m?.[1] === 'EACCES' || m?.[1] === 'EPERM' ? 'run as a user that may (user: root)' : 'see the message',
  );
}

interface Opts {
  user?: string;
}
/** `owner`: USER[:GROUP] (names or numbers, the machine's), who what the call makes belongs to */
type Owned = Opts & { owner?: string };

/**
 * The agent protocol minor whose `file` has `write --owner/--through`, `mkdir --owner`, `ls
 * --depth` and `mv`. A machine raised by an older build (adopted after an upgrade) has an older
 * agent: there a write or mkdir for an owner runs as the owner (its permissions apply), a write
 * replaces a link rather than writing through it, and `ls --depth` and `mv` are OLD_AGENT, which
 * their callers do another way.
 */
const FILES_MINOR = 7;
const OLD_AGENT = "the machine's agent is older than protocol 1.7";

async function fileCommand(
  ctx: LabContext,
  s: SandboxRecord,
  given: string[],
  what: string,
  opts: Owned & { stdin?: Readable | Buffer } = {},
): Promise<string> {
  const agent = await connectAgent(ctx, s);
  try {
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let held = 0;
    let args = given;
    let user = opts.user;
    let owner: string[] = [];
    if (!agent.speaks(FILES_MINOR)) {
      // (the flags are those before `--`: a path may be spelled like one)
      const end = args.indexOf('--');
      const flags = args.slice(0, end < 0 ? args.length : end);
      if (args[0] === 'mv' || flags.includes('--depth')) throw new SnaplabError('AGENT_PROTOCOL', OLD_AGENT);
      args = [...flags.filter((a) => a !== '--through'), ...(end < 0 ? [] : args.slice(end))];
      user = opts.owner ?? user;
    } else if (opts.owner !== undefined) {
      // the owner's "UID:GID" (its supplementary groups are not a file's); two numbers as they are
      owner = ['--owner', numericOwner(opts.owner) ?? (await resolveUser(agent, opts.owner)).split(':', 2).join(':')];
    }
    let stop = (): void => undefined;
    const p = await spawnIn(ctx, s, agent, [MACHINE_AGENT_PATH, 'file', args[0]!, ...owner, ...args.slice(1)], {
      user,
      onStdout: (b) => {
        held += b.length;
        if (held <= MAX_ANSWER) out.push(b);
        else stop();
      },
      onStderr: (b) => err.push(b),
      ...(opts.stdin ? { stdin: true as const } : {}),
    });
    stop = () => p.kill(9);
    if (held > MAX_ANSWER) stop();
    // a write whose input broke off is stopped (SIGTERM: its temporary file removed), not ended
    if (opts.stdin) feedInput(p, opts.stdin, () => p.kill(15));
    const r = await p.result;
    if (held > MAX_ANSWER)
      throw new SnaplabError(
        'FILE_ERROR',
        `${what}: the answer is over ${MAX_ANSWER >> 20} MiB`,
        'ask for less (a smaller depth, a deeper directory)',
      );
    if (r.exitCode !== 0) {
      if (r.signal === 15 && opts.stdin) {
        const kept = args.includes('--append')
          ? 'what came before the break was appended'
          : 'the file is unchanged (a device, or a file of /proc or /sys, written where it is: what came before the break went in)';
        throw new SnaplabError('FILE_ERROR', `${what}: the input broke off; ${kept}`, 'send it again');
      }
      throw fileError(Buffer.concat(err).toString(), r.exitCode, what);
    }
    return Buffer.concat(out).toString();
  } finally {
    await agent.close();
  }
}

const jsonLines = <T>(text: string): T[] =>
  text
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as T);

export async function statPath(
  ctx: LabContext,
  s: SandboxRecord,
  path: string,
  opts: Opts & { follow?: boolean } = {},
): Promise<FileInfo> {
  return jsonLines<FileInfo>(
    await fileCommand(ctx, s, ['stat', ...(opts.follow ? ['-L'] : []), '--', path], `stat ${path}`, opts),
  )[0]!;
}

/**
 * The entries of the directory at `path`, sorted by name; with `depth` N > 1, N levels, each
 * directory's entries right after it (never through a link).
 */
export async function listDir(
  ctx: LabContext,
  s: SandboxRecord,
  path: string,
  opts: Opts & { depth?: number } = {},
): Promise<FileInfo[]> {
  const depth = opts.depth ?? 1;
  if (!Number.isSafeInteger(depth) || depth < 1)
    throw new SnaplabError('BAD_INPUT', `depth ${depth}: a whole number from 1`, 'e.g. depth: 2');
  const args = ['ls', ...(depth > 1 ? ['--depth', String(depth)] : []), '--', path];
  try {
    return jsonLines<FileInfo>(await fileCommand(ctx, s, args, `list ${path}`, opts));
  } catch (e) {
    if (!isSnaplabError(e, 'AGENT_PROTOCOL') || e.message !== OLD_AGENT) throw e;
  }
  // an older agent: a command a directory, each followed by its entries
  const out: FileInfo[] = [];
  const walk = async (dir: string, level: number): Promise<void> => {
    for (const f of await listDir(ctx, s, dir, { user: opts.user })) {
      out.push(f);
      if (f.type === 'dir' && level < depth) await walk(f.path, level + 1);
    }
  };
  await walk(path, 1);
  return out;
}

export async function makeDir(
  ctx: LabContext,
  s: SandboxRecord,
  path: string,
  opts: Owned & { parents?: boolean; mode?: number } = {},
): Promise<void> {
  await fileCommand(
    ctx,
    s,
    [
      'mkdir',
      ...(opts.parents ? ['--parents'] : []),
      ...(opts.mode !== undefined ? ['--mode', opts.mode.toString(8)] : []),
      '--',
      path,
    ],
    `mkdir ${path}`,
    opts,
  );
}

export async function removePath(
  ctx: LabContext,
  s: SandboxRecord,
  path: string,
  opts: Opts & { recursive?: boolean; force?: boolean } = {},
): Promise<void> {
  await fileCommand(
    ctx,
    s,
    ['rm', ...(opts.recursive ? ['--recursive'] : []), ...(opts.force ? ['--force'] : []), '--', path],
    `remove ${path}`,
    opts,
  );
}

/**
 * Rename `from` to `to` (rename(2): a file onto a directory, a directory onto a non-empty one, or
 * across filesystems fail); `parents`: the missing directories of `to` made first.
 */
export async function movePath(
  ctx: LabContext,
  s: SandboxRecord,
  from: string,
  to: string,
  opts: Owned & { parents?: boolean } = {},
): Promise<void> {
  try {
    await fileCommand(ctx, s, ['mv', ...(opts.parents ? ['--parents'] : []), '--', from, to], `move ${from}`, opts);
    return;
  } catch (e) {
    if (!isSnaplabError(e, 'AGENT_PROTOCOL') || e.message !== OLD_AGENT) throw e;
  }
  // an older agent: its parents made as the owner, then `mv` (into a directory there, unlike rename)
  const as = opts.owner ?? opts.user;
  if (opts.parents) await makeDir(ctx, s, posix.dirname(to), { parents: true, user: as });
  const agent = await connectAgent(ctx, s);
  try {
    const r = await execIn(ctx, s, agent, ['mv', '--', from, to], { user: as });
    const said = r.stderr.toString().trim();
    if (r.exitCode !== 0)
      throw new SnaplabError(
        /No such file/.test(said) ? 'FILE_NOT_FOUND' : 'FILE_ERROR',
        `move ${from}: ${said || `mv exited ${r.exitCode}`}`,
        "check the paths (they are the machine's own)",
      );
  } finally {
    await agent.close();
  }
}

/**
 * Write `data` (streamed) to `path`, parents made; whole or not at all. Without `mode`, a file it
 * replaces keeps its permission bits (a new one is 0644). `size`: the bytes the
 * stream will carry, when known (an HTTP Content-Length): fewer, and the file is left as it was.
 * Returns the bytes written.
 */
export async function writeFile(
  ctx: LabContext,
  s: SandboxRecord,
  path: string,
  data: Readable | Buffer | string,
  opts: Owned & {
    mode?: number;
    append?: boolean;
    through?: boolean;
    size?: number;
    xattrs?: Record<string, string>;
  } = {},
): Promise<number> {
  const stdin = typeof data === 'string' ? Buffer.from(data) : data;
  const size = Buffer.isBuffer(stdin) ? stdin.length : opts.size;
  const args = [
    'write',
    '--parents',
    ...(opts.mode !== undefined ? ['--mode', opts.mode.toString(8)] : []),
    ...(opts.append ? ['--append'] : []),
    ...(opts.through ? ['--through'] : []),
    ...(size !== undefined && !opts.append ? ['--size', String(size)] : []),
    ...xattrArgs(opts.xattrs),
    '--',
    path,
  ];
  const out = await fileCommand(ctx, s, args, `write ${path}`, { ...opts, stdin });
  return (JSON.parse(out) as { bytes: number }).bytes;
}

/** Stream the file at `path` into `sink` (ended after). Returns the bytes read. */
export async function readFile(
  ctx: LabContext,
  s: SandboxRecord,
  path: string,
  sink: Writable,
  opts: Opts = {},
): Promise<number> {
  const agent = await connectAgent(ctx, s);
  try {
    let bytes = 0;
    let gone = false;
    const err: Buffer[] = [];
    let kill = (): void => {
      gone = true;
    };
    const write = outputTo(agent, sink, () => kill());
    const p = await spawnIn(ctx, s, agent, [MACHINE_AGENT_PATH, 'file', 'cat', '--', path], {
      user: opts.user,
      onStdout: (b) => {
        bytes += b.length;
        write(b);
      },
      onStderr: (b) => err.push(b),
    });
    kill = () => {
      gone = true;
      p.kill(9);
    };
    if (gone) p.kill(9);
    const r = await p.result;
    if (r.exitCode !== 0 && !gone) {
      const e = fileError(Buffer.concat(err).toString(), r.exitCode, `read ${path}`);
      sink.destroy(e);
      throw e;
    }
    await new Promise<void>((resolve) => (sink.destroyed || sink.writableEnded ? resolve() : sink.end(resolve)));
    return bytes;
  } finally {
    await agent.close();
  }
}
