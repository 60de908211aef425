import { createReadStream, createWriteStream, existsSync } from 'node:fs';
import { stat } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { SnaplabError } from '../errors.js';
import { run } from '../host/run.js';
import { byteLimit, decompressor, sniff, type Budget, type Compression } from './decompress.js';
import { dirBlobs, resolveImage, tarBlobs, type Blobs, type ResolvedImage } from './oci.js';
import type { Produced, Provenance } from './source.js';
import { looksLikeImageArchive } from './tar-index.js';
import { applyTar, type UnpackStats } from './unpack.js';
import { readAt } from './read-at.js';
import { orElse } from '../cleanup.js';

export type { Provenance } from './source.js';
/** What an import made besides the tree (the contract's Produced). */
export type Imported = Produced;

export interface ImportOptions {
  /** which image of an archive holding several (a tag, or an OCI ref name) */
  tag?: string;
  /** the most an import may unpack, all layers together */
  maxBytes?: number;
  /** an abort stops the copy or the layer under way and rejects with the signal's reason */
  signal?: AbortSignal;
  /** a line per step (each layer) */
  onProgress?: (s: string) => void;
}

/** 64 GiB: far past any real root filesystem, well short of filling a host. */
export const DEFAULT_MAX_BYTES = 64 * 2 ** 30;

const PREFIX = 1 << 20;

/** The first bytes of a file, decompressed: enough to see an archive's first names. */
async function prefixOf(file: string, compression: Compression): Promise<Buffer> {
  const stage = decompressor(compression);
  if (!stage) return readAt(file, 0, PREFIX);
  const chunks: Buffer[] = [];
  let have = 0;
  const input = createReadStream(file);
  input.pipe(stage.stream);
  await new Promise<void>((done) => {
    const stop = (): void => {
      input.destroy();
      stage.stream.destroy();
      done();
    };
    stage.stream.on('data', (c: Buffer) => {
      chunks.push(c);
      have += c.length;
      if (have >= PREFIX) stop();
    });
    stage.stream.on('end', stop);
    stage.stream.on('error', stop);
  });
  return Buffer.concat(chunks);
}

/** A compressed image archive, decompressed once to a file so that its blobs can be read in place. */
async function spool(
  file: string,
  compression: Compression,
  into: string,
  budget: Budget,
  signal?: AbortSignal,
): Promise<string> {
  const stage = decompressor(compression)!;
  const out = join(into, 'archive.tar');
  try {
    await pipeline(
      createReadStream(file),
      stage.stream,
      byteLimit(budget, file),
      createWriteStream(out, { flags: 'wx', mode: 0o600 }),
      { signal },
    );
    await stage.done;
  } catch (e) {
    // an abort's AbortError says less than the reason the caller gave
    if (signal?.aborted) throw signal.reason;
    throw e;
  }
  return out;
}

function notesOf(total: UnpackStats): string[] {
  const notes: string[] = [];
  if (total.devices) notes.push(`${total.devices} device node(s) or FIFO(s) skipped: /dev is the sandbox's own`);
  if (total.xattrsDropped)
    notes.push(
      `${total.xattrsDropped} extended attribute(s) dropped (trusted.*, user.overlay.* and security.* other than security.capability are not taken from images)`,
    );
  return notes;
}

function addStats(a: UnpackStats, b: UnpackStats): UnpackStats {
  const out = { ...a };
  for (const k of Object.keys(b) as (keyof UnpackStats)[]) out[k] += b[k];
  return out;
}

const ZERO: UnpackStats = {
  entries: 0,
  files: 0,
  dirs: 0,
  symlinks: 0,
  hardlinks: 0,
  whiteouts: 0,
  opaques: 0,
  devices: 0,
  xattrsDropped: 0,
  bytes: 0,
};

/** Apply an image's layers in manifest order, each checked against its digest and diff_id. */
async function applyLayers(
  root: string,
  blobs: Blobs,
  img: ResolvedImage,
  budget: Budget,
  opts: ImportOptions,
): Promise<{ layers: NonNullable<Provenance['layers']>; total: UnpackStats }> {
  const layers: NonNullable<Provenance['layers']> = [];
  let total = ZERO;
  for (const [i, l] of img.layers.entries()) {
    const what = `layer ${i + 1} of ${img.layers.length} (${(l.digest ?? l.diffId).slice(0, 19)})`;
    opts.signal?.throwIfAborted();
    opts.onProgress?.(`applying ${what}`);
    const applied = await applyTar(root, await blobs.range(l.name), { layer: true, budget, what, signal: opts.signal });
    if (l.digest && applied.blobDigest !== l.digest) {
      throw new SnaplabError(
        'IMAGE_DIGEST_MISMATCH',
        `${what}: the blob's content hashes to ${applied.blobDigest}, not ${l.digest}`,
        'the archive is corrupt or was altered; export it again',
      );
    }
    if (applied.diffId !== l.diffId) {
      throw new SnaplabError(
        'IMAGE_DIGEST_MISMATCH',
        `${what}: its uncompressed content hashes to ${applied.diffId}, the config says ${l.diffId}`,
        'the archive is corrupt or was altered; export it again',
      );
    }
    layers.push({
      digest: applied.blobDigest,
      diffId: applied.diffId,
      compression: applied.compression,
      bytes: applied.stats.bytes,
    });
    total = addStats(total, applied.stats);
  }
  return { layers, total };
}

async function fromArchive(
  root: string,
  blobs: Blobs,
  source: string,
  opts: ImportOptions,
  budget: Budget,
): Promise<Imported> {
  const img = await resolveImage(blobs, opts.tag);
  const { layers, total } = await applyLayers(root, blobs, img, budget, opts);
  return {
    provenance: {
      kind: img.format,
      source,
      ref: img.ref,
      manifestDigest: img.manifestDigest,
      configDigest: img.configDigest,
      layers,
      notes: notesOf(total),
    },
    config: img.config,
  };
}

/**
 * `source` as an absolute path, checked to be a directory or a file: BAD_INPUT otherwise, before
 * anything is made.
 */
export async function checkImportSource(source: string): Promise<{ abs: string; directory: boolean }> {
  const abs = resolve(source);
  const st = await stat(abs).catch(orElse(undefined, `stat ${abs}`, 'ENOENT', 'ENOTDIR'));
  if (!st)
    throw new SnaplabError(
      'BAD_INPUT',
      `no such file or directory: ${source}`,
      'give an image archive, an OCI layout directory, or a rootfs tarball or directory',
    );
  if (!st.isDirectory() && !st.isFile())
    throw new SnaplabError(
      'BAD_INPUT',
      `${source} is neither a file nor a directory`,
      'give an image archive or a rootfs tarball or directory',
    );
  return { abs, directory: st.isDirectory() };
}

/**
 * Fill `root` (an empty directory) from `source`: a root filesystem tarball or directory, a
 * `docker save` tarball, or an OCI image layout (directory or tarball), compressed or not.
 * `scratch` is an empty directory for a decompressed copy of a compressed image archive.
 */
export async function importInto(
  root: string,
  source: string,
  scratch: string,
  opts: ImportOptions = {},
): Promise<Imported> {
  const { abs, directory } = await checkImportSource(source);
  const budget: Budget = { left: opts.maxBytes ?? DEFAULT_MAX_BYTES, limit: opts.maxBytes ?? DEFAULT_MAX_BYTES };
  if (directory) {
    if (['oci-layout', 'index.json', 'manifest.json'].some((f) => existsSync(join(abs, f)))) {
      return fromArchive(root, await dirBlobs(abs), abs, opts, budget);
    }
    opts.onProgress?.(`copying ${abs}`);
    await run('cp', ['-a', '--', `${abs}/.`, root], { signal: opts.signal });
    return { provenance: { kind: 'directory', source: abs, notes: [] } };
  }
  const compression = sniff(await readAt(abs, 0, 6));
  const verdict = await looksLikeImageArchive(await prefixOf(abs, compression));
  // a root filesystem is applied from the source, or from the decompressed copy if one was made
  let rootfsFile = abs;
  if (verdict !== false) {
    const tarFile = compression === 'none' ? abs : await spool(abs, compression, scratch, budget, opts.signal);
    const blobs = await tarBlobs(tarFile);
    const fresh = (): Budget => ({ left: budget.limit, limit: budget.limit }); // the spool counted the same bytes once already
    if (verdict || blobs.has('manifest.json') || blobs.has('index.json'))
      return fromArchive(root, blobs, abs, opts, fresh());
    rootfsFile = tarFile;
    Object.assign(budget, fresh());
  }
  opts.onProgress?.(`applying ${source}`);
  const applied = await applyTar(
    root,
    { file: rootfsFile },
    { layer: false, budget, what: source, signal: opts.signal },
  );
  return { provenance: { kind: 'rootfs', source: abs, notes: notesOf(applied.stats) } };
}
