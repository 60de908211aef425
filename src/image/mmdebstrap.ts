/** mmdebstrap run for a Debian image: its progress, its log, its failure, and its interruption. */
import { type ChildProcess, spawn } from 'node:child_process';
import { createWriteStream } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SnaplabError } from '../errors.js';
import type { DebianSpec } from './debian.js';

const UNREACHABLE =
  /(Temporary failure resolving|Could not resolve|Failed to fetch|Connection failed|Could not connect|Network is unreachable|No route to host|Unable to connect)/;

/** After an interrupt, how long mmdebstrap has to unmount what it mounted in the tree and stop. */
const INTERRUPT_GRACE_MS = 15_000;

/**
 * mmdebstrap's exit code. An abort interrupts its process group as ^C would (SIGINT: mmdebstrap
 * then unmounts /proc, /sys and /dev from the tree and exits), SIGKILL after INTERRUPT_GRACE_MS.
 */
function exitOf(child: ChildProcess, signal: AbortSignal | undefined): Promise<number | null> {
  const kill = (sig: NodeJS.Signals): void => {
    try {
      process.kill(-child.pid!, sig);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ESRCH') throw e;
    }
  };
  let grace: NodeJS.Timeout | undefined;
  const onAbort = (): void => {
    kill('SIGINT');
    grace = setTimeout(() => kill('SIGKILL'), INTERRUPT_GRACE_MS);
  };
  return new Promise<number | null>((resolve, reject) => {
    child.on('error', (e: NodeJS.ErrnoException) =>
      reject(
        e.code === 'ENOENT'
          ? new SnaplabError(
              'MISSING_TOOL',
              'building Debian images needs mmdebstrap',
              'apt-get install mmdebstrap (snaplab set-up installs it)',
              { cause: e },
            )
          : e,
      ),
    );
    child.on('close', resolve);
    signal?.addEventListener('abort', onAbort, { once: true });
  }).finally(() => {
    signal?.removeEventListener('abort', onAbort);
    clearTimeout(grace);
  });
}

/**
 * mmdebstrap's customize hooks (shell run on the host once the packages are in, the tree as "$1")
 * that add a login user beside root: uid 1000, home /home/NAME, /bin/bash, passwordless sudo.
 * NAME is checked (checkSpec: letters, digits, _ and -), so it is safe in these lines.
 */
export function userHooks(name: string): string[] {
  return [
    `--customize-hook=chroot "$1" useradd --create-home --uid 1000 --user-group --shell /bin/bash ${name}`,
    `--customize-hook=mkdir -p "$1/etc/sudoers.d" && echo '${name} ALL=(ALL:ALL) NOPASSWD: ALL' > "$1/etc/sudoers.d/${name}" && chmod 0440 "$1/etc/sudoers.d/${name}"`,
  ];
}

/**
 * Build a root filesystem into the empty directory `root` with mmdebstrap, the log in `logFile`.
 * Progress: mmdebstrap's phases (its `I:` lines) and a count of packages fetched.
 */
export async function runMmdebstrap(
  root: string,
  spec: DebianSpec,
  sources: string,
  scratch: string,
  logFile: string,
  onProgress?: (s: string) => void,
  signal?: AbortSignal,
  /** more options (the package cache's hooks, package-cache.ts) */
  extra: string[] = [],
): Promise<void> {
  signal?.throwIfAborted();
  const sourcesFile = join(scratch, 'sources.sources');
  await writeFile(sourcesFile, sources);
  const args = [
    '--verbose',
    '--mode=root',
    '--format=directory',
    `--variant=${spec.variant}`,
    ...(spec.packages.length ? [`--include=${spec.packages.join(',')}`] : []),
    // apt's lists stay, so that `apt-get install` works in a machine without an update first
    '--skip=cleanup/apt/lists',
    ...(spec.user ? userHooks(spec.user) : []),
    ...extra,
    spec.suite,
    root,
    sourcesFile,
  ];
  await mkdir(join(logFile, '..'), { recursive: true });
  const log = createWriteStream(logFile, { flags: 'w' });
  log.write(`$ mmdebstrap ${args.join(' ')}\n`);
  const child = spawn('mmdebstrap', args, {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, LC_ALL: 'C.UTF-8', DEBIAN_FRONTEND: 'noninteractive' },
    // a process group of its own: an abort interrupts mmdebstrap and the apt and dpkg it runs
    detached: true,
  });
  let fetched = 0;
  let pending = '';
  let lastFetchReport = 0;
  const tail: string[] = [];
  const onData = (b: Buffer): void => {
    log.write(b);
    pending += b.toString();
    const lines = pending.split(/\r?\n/);
    pending = lines.pop() ?? '';
    for (const line of lines) {
      tail.push(line);
      if (tail.length > 400) tail.shift();
      if (/^I: /.test(line)) onProgress?.(line.slice(3));
      else if (/^Get:\d+ /.test(line)) {
        fetched++;
        if (Date.now() - lastFetchReport > 1000) {
          lastFetchReport = Date.now();
          onProgress?.(`fetched ${fetched} files`);
        }
      }
    }
  };
  child.stdout.on('data', onData);
  child.stderr.on('data', onData);
  let code: number | null;
  try {
    code = await exitOf(child, signal);
  } finally {
    await new Promise<void>((done) => log.end(done));
  }
  if (signal?.aborted) throw signal.reason;
  if (code === 0) return;
  const all = tail.join('\n');
  const shown = tail
    .filter((l) => l.trim())
    .slice(-15)
    .join('\n');
  const unreachable = UNREACHABLE.exec(all);
  throw new SnaplabError(
    'IMAGE_BUILD_FAILED',
    `mmdebstrap failed (exit ${code})${unreachable ? ': the mirror cannot be reached' : ''}; the end of its log:\n${shown}`,
    unreachable
      ? `check that this host reaches its apt mirror (apt-get update), or pass --mirror URL for one it reaches; full log: ${logFile}`
      : `full log: ${logFile}`,
  );
}
