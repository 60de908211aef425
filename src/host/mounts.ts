import { readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { resolve } from 'node:path';
import { SnaplabError } from '../errors.js';
import { HostOpError, HostOps } from './hostops.js';
import { run } from './run.js';

export interface MountEntry {
  /** where it is mounted (escapes such as \040 decoded) */
  target: string;
  fstype: string;
  /** the device or pseudo-source ("tmpfs", "/dev/loop3", "overlay") */
  source: string;
  /** per-mount options (rw,relatime,...) */
  options: string;
  /** superblock options: for v1 cgroup mounts they name the controllers */
  superOptions: string;
  /** the path inside the source filesystem that is mounted (bind mounts: not "/") */
  root: string;
}

const MOUNTINFO = '/proc/self/mountinfo';

/** mountinfo escapes space, tab, newline and backslash as \ooo octal. */
function unescapeOctal(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
}

/**
 * Parse /proc/PID/mountinfo text. Line format (proc(5)):
 * `id parent major:minor root target options [optional fields...] - fstype source superoptions`
 */
export function parseMountinfo(text: string): MountEntry[] {
  const out: MountEntry[] = [];
  for (const line of text.split('\n')) {
    if (!line) continue;
    const f = line.split(' ');
    const dash = f.indexOf('-', 6);
    if (dash < 0 || f.length < dash + 4) continue;
    out.push({
      root: unescapeOctal(f[3]!),
      target: unescapeOctal(f[4]!),
      options: f[5]!,
      fstype: f[dash + 1]!,
      source: unescapeOctal(f[dash + 2]!),
      superOptions: f[dash + 3]!,
    });
  }
  return out;
}

/** Every mount visible to this process, in mount order (later mounts stack over earlier). */
export async function listMounts(): Promise<MountEntry[]> {
  return parseMountinfo(await readFile(MOUNTINFO, 'utf8'));
}

/** Synchronous variant for one-off cached detection (cgroup layout). */
export function listMountsSync(): MountEntry[] {
  return parseMountinfo(readFileSync(MOUNTINFO, 'utf8'));
}

function isUnder(path: string, prefix: string): boolean {
  const p = prefix.length > 1 && prefix.endsWith('/') ? prefix.slice(0, -1) : prefix;
  return path === p || path.startsWith(p === '/' ? '/' : `${p}/`);
}

/**
 * Mounts at or below `prefix`, deepest first, and among stacked mounts on one target the latest
 * first: the order in which they can be unmounted.
 */
export async function mountsUnder(prefix: string): Promise<MountEntry[]> {
  const abs = resolve(prefix);
  const all = await listMounts();
  const hits = all.map((m, i) => ({ m, i })).filter(({ m }) => isUnder(m.target, abs));
  const depth = (t: string): number => (t === '/' ? 0 : t.split('/').length);
  hits.sort((a, b) => depth(b.m.target) - depth(a.m.target) || b.i - a.i);
  return hits.map(({ m }) => m);
}

/** Is `path` the target of a mount? (mountinfo, so bind mounts of the same fs count too) */
export async function isMountPoint(path: string): Promise<boolean> {
  const abs = resolve(path);
  return (await listMounts()).some((m) => m.target === abs);
}

/**
 * Unmount one mount at `path` with the umount binary. Idempotent: a path that is not a mount
 * point is fine. A busy mount falls back to a lazy unmount (detached now, freed when unused).
 */
export async function unmount(path: string, opts: { lazy?: boolean } = {}): Promise<void> {
  const abs = resolve(path);
  const ops = HostOps.get();
  if (ops) {
    // umount2 through the resident helper: no tool spawn on the hot path
    try {
      await ops.request('umount', abs, opts.lazy ? String(MNT_DETACH) : '0');
      return;
    } catch (e) {
      if (!(e instanceof HostOpError)) throw e;
      if (e.errno === EINVAL || e.errno === ENOENT) return; // not a mount point (any more)
      if (e.errno === EBUSY && !opts.lazy) return unmount(abs, { lazy: true });
      throw unmountError(abs, e.message);
    }
  }
  if (!(await isMountPoint(abs))) return;
  const first = await run('umount', opts.lazy ? ['-l', abs] : [abs], { allowFail: true });
  if (first.code === 0) return;
  const msg = first.stderr.trim();
  if (/not mounted/i.test(msg)) return;
  if (!opts.lazy && /busy/i.test(msg)) {
    const lazy = await run('umount', ['-l', abs], { allowFail: true });
    if (lazy.code === 0) return;
    throw unmountError(abs, lazy.stderr.trim());
  }
  throw unmountError(abs, msg);
}

/** mount(2) of a filesystem with an option string, through the helper or the mount tool. */
export async function mountFs(source: string, target: string, fstype: string, options: string): Promise<void> {
  const ops = HostOps.get();
  if (!ops) {
    await run('mount', ['-t', fstype, '-o', options, source, target]);
    return;
  }
  try {
    await ops.request('mount', source, target, fstype, '0', options);
  } catch (e) {
    throw new SnaplabError(
      'HOST_COMMAND_FAILED',
      `mount -t ${fstype} ${source} ${target}: ${(e as Error).message}`,
      "see `dmesg | tail` for the kernel's reason",
      { cause: e },
    );
  }
}

/** Bind `source` (a file or a directory) at `target`, which must exist: through the helper or the mount tool. */
export async function bindMount(source: string, target: string): Promise<void> {
  const ops = HostOps.get();
  if (!ops) {
    await run('mount', ['--bind', source, target]);
    return;
  }
  try {
    await ops.request('mount', source, target, '', String(MS_BIND), '');
  } catch (e) {
    throw new SnaplabError(
      'HOST_COMMAND_FAILED',
      `mount --bind ${source} ${target}: ${(e as Error).message}`,
      "see `dmesg | tail` for the kernel's reason",
      { cause: e },
    );
  }
}

const MS_BIND = 4096;
const EINVAL = 22;
const ENOENT = 2;
const EBUSY = 16;
const MNT_DETACH = 2;

function unmountError(path: string, msg: string): SnaplabError {
  return new SnaplabError(
    'HOST_COMMAND_FAILED',
    `could not unmount ${path}: ${msg}`,
    `find what holds it with: fuser -vm ${path}`,
  );
}
