import { createReadStream, createWriteStream } from 'node:fs';
import { lstat, readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { gunzipSync, createGzip } from 'node:zlib';
import { SnaplabError } from '../../errors.js';
import { run } from '../../host/run.js';
import { failureMeans, orElse } from '../../cleanup.js';

/**
 * Every path under `root` (relative, without "./"), parents before children, siblings in byte
 * order: the archive's order does not depend on readdir's. Symlinks are listed, never followed.
 * `skipEntry(rel, isDir)` leaves one entry out of the list; a skipped directory is still walked.
 */
export async function listTree(
  root: string,
  skipEntry?: (rel: string, isDir: boolean) => Promise<boolean>,
): Promise<string[]> {
  const out: string[] = [];
  const walk = async (rel: string): Promise<void> => {
    const entries = await readdir(rel ? join(root, rel) : root, { withFileTypes: true });
    const names = entries.map((e) => e.name).sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
    const byName = new Map(entries.map((e) => [e.name, e]));
    for (const name of names) {
      const r = rel ? `${rel}/${name}` : name;
      const isDir = byName.get(name)!.isDirectory(); // Dirent: a symlink to a directory is not one
      if (!(skipEntry && (await skipEntry(r, isDir)))) out.push(r);
      if (isDir) await walk(r);
    }
  };
  await walk('');
  return out;
}

let gnuCpio: Promise<boolean> | undefined;
/** Debian's GNU cpio (handles hard links, NUL-separated names, --reproducible) or busybox's. */
function haveGnuCpio(): Promise<boolean> {
  gnuCpio ??= run('cpio', ['--version'], { allowFail: true })
    .then((r) => r.code === 0 && r.stdout.includes('GNU cpio'))
    .catch(failureMeans(false)); // no cpio at all: not GNU's
  return gnuCpio;
}

/** Write a newc archive of `names` (relative to `dir`) to `out`, uncompressed. */
export async function writeNewc(
  dir: string,
  names: string[],
  out: string,
  opts: { rootOwner?: boolean } = {},
): Promise<void> {
  const owner = opts.rootOwner ? ['-R', '0:0'] : [];
  if (await haveGnuCpio()) {
    await run(
      'cpio',
      ['-o', '-H', 'newc', '--quiet', '--null', '--reproducible', '--force-local', '-O', out, ...owner],
      {
        cwd: dir,
        input: names.map((n) => `${n}\0`).join(''),
      },
    );
    return;
  }
  const bad = names.find((n) => n.includes('\n'));
  if (bad !== undefined) {
    throw new SnaplabError(
      'DRIVER_UNAVAILABLE',
      `busybox cpio cannot archive a file name with a newline: ${JSON.stringify(bad)}`,
      'apt-get install cpio',
    );
  }
  await run('busybox', ['cpio', '-o', '-H', 'newc', '-F', out, ...owner], {
    cwd: dir,
    input: names.map((n) => `${n}\n`).join(''),
  });
}

/** Concatenate archives into one gzip stream (the kernel unpacks concatenated newc archives in order; later entries win). */
export async function gzipConcat(parts: string[], out: string, level = 1): Promise<void> {
  async function* chunks(): AsyncGenerator<Buffer> {
    for (const p of parts) for await (const c of createReadStream(p)) yield c as Buffer;
  }
  await pipeline(chunks, createGzip({ level }), createWriteStream(out, { mode: 0o644 }));
}

export interface CpioEntry {
  name: string;
  mode: number;
  size: number;
  /** the symlink's target, for symlinks */
  target?: string;
}

/** Every entry of a (possibly gzip'd) initramfs of concatenated newc archives, in archive order. */
export async function listInitramfs(path: string): Promise<CpioEntry[]> {
  const entries: CpioEntry[] = [];
  parseNewc(path, await readFile(path), (e) => void entries.push(e));
  return entries;
}

/** The contents of the last entry named `name` (the one the kernel keeps), or undefined. */
export async function readInitramfsFile(path: string, name: string): Promise<Buffer | undefined> {
  let found: Buffer | undefined;
  parseNewc(path, await readFile(path), (e, data) => {
    if (e.name === name) found = Buffer.from(data);
  });
  return found;
}

function parseNewc(path: string, raw: Buffer, each: (e: CpioEntry, data: Buffer) => void): void {
  const b = raw[0] === 0x1f && raw[1] === 0x8b ? gunzipSync(raw) : raw;
  let off = 0;
  const hex = (at: number): number => parseInt(b.toString('latin1', at, at + 8), 16);
  while (off < b.length) {
    if (b[off] === 0) {
      off++; // padding between archives
      continue;
    }
    const magic = b.toString('latin1', off, off + 6);
    if (magic !== '070701' && magic !== '070702') {
      throw new SnaplabError('INTERNAL', `${path}: not a newc archive at byte ${off} (${JSON.stringify(magic)})`);
    }
    const mode = hex(off + 14);
    const size = hex(off + 54);
    const namesize = hex(off + 94);
    const name = b.toString('utf8', off + 110, off + 110 + namesize - 1);
    const dataAt = (off + 110 + namesize + 3) & ~3;
    off = (dataAt + size + 3) & ~3;
    if (name === 'TRAILER!!!') continue;
    const data = b.subarray(dataAt, dataAt + size);
    const e: CpioEntry = { name, mode, size };
    if ((mode & 0o170000) === 0o120000) e.target = data.toString('utf8');
    each(e, data);
  }
}

/** lstat that answers undefined for a missing path. */
export async function lstatOrUndefined(p: string): Promise<Awaited<ReturnType<typeof lstat>> | undefined> {
  return lstat(p).catch(orElse(undefined, `lstat ${p}`, 'ENOENT', 'ENOTDIR'));
}
