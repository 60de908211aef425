import { spawn } from 'node:child_process';
import { createHash, type Hash } from 'node:crypto';
import { existsSync, createReadStream } from 'node:fs';
import { join } from 'node:path';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { packageRoot } from '../agent/binary.js';
import { SnaplabError, type ErrorCode } from '../errors.js';
import { byteLimit, decompressor, sniff, type Budget, type Compression } from './decompress.js';
import { readAt } from './read-at.js';

/** What the helper applied (native/unpack.c prints it). */
export interface UnpackStats {
  entries: number;
  files: number;
  dirs: number;
  symlinks: number;
  hardlinks: number;
  whiteouts: number;
  opaques: number;
  devices: number;
  xattrsDropped: number;
  bytes: number;
}

export interface Applied {
  stats: UnpackStats;
  compression: Compression;
  /** sha256 of the bytes as stored (the blob) */
  blobDigest: string;
  /** sha256 of the uncompressed tar (the layer's diff_id) */
  diffId: string;
}

export function unpackBinaryPath(): string {
  const p = join(packageRoot(), 'native', 'build', 'snaplab-unpack');
  if (!existsSync(p))
    throw new SnaplabError('INTERNAL', `image helper not found at ${p}`, 'build it: make -C native (or npm run build)');
  return p;
}

const tap = (h: Hash): Transform =>
  new Transform({
    transform(c: Buffer, _e, done) {
      h.update(c);
      done(null, c);
    },
  });

const HELPER_CODES: Record<string, [ErrorCode, string]> = {
  UNSAFE_PATH: [
    'IMAGE_UNSAFE',
    'the archive would write outside its own tree or through a link; nothing of it was kept',
  ],
  BAD_TAR: ['BAD_IMAGE', 'the archive is corrupt, truncated, or uses a tar feature snaplab does not take'],
  IO: ['IMAGE_IO', 'see the message; check free space under SNAPLAB_HOME'],
};

/** A part of a file: the whole file, or one member of an uncompressed tar. */
export interface FileRange {
  file: string;
  offset?: number;
  size?: number;
}

/**
 * Apply one tar (plain, gzip, zstd or xz: sniffed, not trusted from a media type) to `root`
 * through the helper, hashing the stored and the uncompressed bytes on the way.
 * `layer`: OCI whiteouts apply. The budget is shared by every layer of one import.
 */
export async function applyTar(
  root: string,
  src: FileRange,
  opts: { layer: boolean; budget: Budget; what: string; signal?: AbortSignal },
): Promise<Applied> {
  const offset = src.offset ?? 0;
  const compression = sniff(await readAt(src.file, offset, 6));
  const blobHash = createHash('sha256');
  const diffHash = createHash('sha256');
  const stage = decompressor(compression);
  const helper = spawn(unpackBinaryPath(), [root, ...(opts.layer ? ['--layer'] : [])], {
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  helper.stdout.on('data', (b: Buffer) => (out += b.toString()));
  helper.stderr.on('data', (b: Buffer) => (err += b.toString()));
  const exited = new Promise<number | null>((resolve, reject) => {
    helper.on('error', reject);
    helper.on('close', (code) => resolve(code));
  });
  const input = createReadStream(src.file, {
    start: offset,
    end: src.size === undefined ? undefined : offset + src.size - 1,
  });
  const stages = [
    input,
    tap(blobHash),
    ...(stage ? [stage.stream] : []),
    tap(diffHash),
    byteLimit(opts.budget, opts.what),
    helper.stdin,
  ];
  let streamErr: unknown;
  try {
    await pipeline(stages as unknown as [NodeJS.ReadableStream, NodeJS.WritableStream], { signal: opts.signal });
    await stage?.done;
  } catch (e) {
    streamErr = e;
    helper.kill('SIGKILL');
  }
  const code = await exited;
  // an abort stops the stream; the helper was killed for it and has exited: that is the answer
  if (opts.signal?.aborted) throw opts.signal.reason;
  const line = err.trim().split('\n').pop() ?? '';
  const tab = line.indexOf('\t');
  if (code !== 0 && tab > 0 && !(streamErr instanceof SnaplabError)) {
    const [ours, hint]: [ErrorCode, string] = HELPER_CODES[line.slice(0, tab)] ?? [
      'BAD_IMAGE',
      'the archive could not be applied',
    ];
    throw new SnaplabError(ours, `${opts.what}: ${line.slice(tab + 1)}`, hint);
  }
  if (streamErr) {
    if (streamErr instanceof SnaplabError) throw streamErr;
    throw new SnaplabError(
      'BAD_IMAGE',
      `${opts.what}: ${(streamErr as Error).message}`,
      'the archive is corrupt or truncated',
    );
  }
  if (code !== 0)
    throw new SnaplabError(
      'INTERNAL',
      `the image helper failed on ${opts.what} (exit ${code}): ${err.trim()}`,
      'report this with the archive that caused it',
    );
  return {
    stats: JSON.parse(out) as UnpackStats,
    compression,
    blobDigest: `sha256:${blobHash.digest('hex')}`,
    diffId: `sha256:${diffHash.digest('hex')}`,
  };
}
