import { spawn } from 'node:child_process';
import { Duplex, Transform } from 'node:stream';
import { createGunzip } from 'node:zlib';
import { SnaplabError } from '../errors.js';
import { handledElsewhere } from '../cleanup.js';

export type Compression = 'none' | 'gzip' | 'zstd' | 'xz';

/** The compression of a stream, from its first bytes (media types and file names are not trusted). */
export function sniff(head: Buffer): Compression {
  if (head[0] === 0x1f && head[1] === 0x8b) return 'gzip';
  if (head.readUInt32LE(0) === 0xfd2fb528) return 'zstd';
  if (head.subarray(0, 6).equals(Buffer.from([0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00]))) return 'xz';
  return 'none';
}

/** What an import may still unpack: shared by all the layers of one image. */
export interface Budget {
  left: number;
  limit: number;
}

/** A Transform that fails once more bytes than the budget has left passed (a decompression bomb). */
export function byteLimit(budget: Budget, what: string): Transform {
  return new Transform({
    transform(chunk: Buffer, _enc, done) {
      budget.left -= chunk.length;
      if (budget.left < 0) {
        done(
          new SnaplabError(
            'IMAGE_TOO_LARGE',
            `${what} unpacks to more than ${budget.limit} bytes`,
            'raise the limit with --max-size SIZE if the image is meant to be that large',
          ),
        );
      } else done(null, chunk);
    },
  });
}

/** A decompressing stage: the stream, and a promise that rejects when the decompressor failed. */
export interface Stage {
  stream: Duplex;
  done: Promise<void>;
}

/** A program (zstd, xz) as a stream stage; its exit status is checked, not only its output. */
function program(name: string, pkg: string): Stage {
  const child = spawn(name, ['-dc'], { stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
  const done = new Promise<void>((resolve, reject) => {
    child.on('error', (e: NodeJS.ErrnoException) =>
      reject(
        e.code === 'ENOENT'
          ? new SnaplabError('MISSING_TOOL', `${name} is needed to decompress this image`, `apt-get install ${pkg}`, {
              cause: e,
            })
          : e,
      ),
    );
    child.on('close', (code) =>
      code === 0
        ? resolve()
        : reject(
            new SnaplabError(
              'BAD_IMAGE',
              `${name} could not decompress a layer: ${stderr.trim() || `exit ${code}`}`,
              'the archive is corrupt or truncated',
            ),
          ),
    );
  });
  done.catch(handledElsewhere);
  return { stream: Duplex.from({ writable: child.stdin, readable: child.stdout }), done };
}

/** The stage that undoes `kind` (undefined: nothing to undo). */
export function decompressor(kind: Compression): Stage | undefined {
  switch (kind) {
    case 'none':
      return undefined;
    case 'gzip':
      return { stream: createGunzip(), done: Promise.resolve() };
    case 'zstd':
      return program('zstd', 'zstd');
    case 'xz':
      return program('xz', 'xz-utils');
  }
}
