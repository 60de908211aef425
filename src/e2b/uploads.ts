/**
 * envd's uploads (`POST /files`), streamed into the sandbox as they come: an octet-stream body to
 * `?path=`, or multipart/form-data (RFC 7578) as E2B's SDKs send it, each part a file whose
 * filename is its full path (`?path=`, when given, names it instead: older SDKs call the part
 * "blob"). gzip bodies (`Content-Encoding: gzip`) are unpacked on the way. Nothing is held whole:
 * each file goes to the Lab API's streamed write, which lands it whole or not at all (a body that
 * breaks off leaves the file as it was), so the daemon's memory does not grow with an upload and
 * no size is refused but what the sandbox's disk refuses. The multipart reader is fastify's
 * busboy (@fastify/busboy), not one of ours.
 */
import { Readable } from 'node:stream';
import { createGunzip } from 'node:zlib';
import { Busboy, type BusboyInstance } from '@fastify/busboy';
import type { FastifyRequest } from 'fastify';
import { SnaplabError } from '../errors.js';

/** One file of an upload: where it goes (as the request names it) and its bytes, as they come. */
export interface UploadedFile {
  /** `?path=`, else the part's filename (undefined when neither is given) */
  path: string | undefined;
  data: Readable;
  /** the bytes it carries, when the request says (an octet-stream body's Content-Length) */
  size?: number;
}

type Write<T> = (f: UploadedFile) => Promise<T>;

/**
 * The most parts one multipart upload may have (E2B's SDKs send one per file of a `writeFiles`;
 * envd has no bound). It was 1000: a `writeFiles` of a project's 1500 files failed after writing
 * 1000 of them. Parts are written one at a time, so the bound is on what one request can queue.
 */
const MAX_PARTS = 100_000;

const badInput = (message: string, cause?: unknown): SnaplabError =>
  new SnaplabError('BAD_INPUT', message, 'send multipart/form-data, or one file as application/octet-stream', {
    cause,
  });
const brokeOff = (): SnaplabError => new SnaplabError('FILE_ERROR', 'the upload broke off', 'send it again');
/** zlib's own errors (Z_DATA_ERROR, Z_BUF_ERROR…): the body is not gzip, or ends short of its trailer */
const unpacking = (e: unknown): boolean => !!(e as NodeJS.ErrnoException | undefined)?.code?.startsWith('Z_');

/** The request's body as a stream: a JSON body comes parsed as bytes, none as nothing. */
function bodyOf(req: FastifyRequest): Readable {
  const b = req.body;
  if (Buffer.isBuffer(b)) return Readable.from([b]);
  if (b && typeof (b as Readable).on === 'function' && typeof (b as Readable).pipe === 'function') return b as Readable;
  return Readable.from([]);
}

/**
 * The upload's Content-Encoding: gzip (x-gzip is gzip, RFC 9110), or none (identity). Any other,
 * which was written as it came (a deflate body, its bytes), is refused as envd refuses it, its body
 * read and dropped so that the client gets the answer. Asked before its sandbox is found: a paused
 * one is not woken for a request that will be refused.
 */
export function uploadEncoding(req: FastifyRequest): 'gzip' | undefined {
  const codings = String(req.headers['content-encoding'] ?? '')
    .split(',')
    .map((c) => c.trim().toLowerCase())
    .filter((c) => c !== '' && c !== 'identity')
    .map((c) => (c === 'x-gzip' ? 'gzip' : c));
  if (codings.length === 0) return undefined;
  if (codings.length === 1 && codings[0] === 'gzip') return 'gzip';
  bodyOf(req).resume();
  throw new SnaplabError(
    'BAD_INPUT',
    `an upload in Content-Encoding ${JSON.stringify(codings.join(', '))}`,
    'send it as gzip, or with no Content-Encoding',
  );
}

/**
 * Write each file of the request's upload with `write`, one after another in the body's order, as
 * the body comes; resolves with what each write returned. On the first failure (a write's, the
 * body's framing, a body cut off, gzip that does not unpack) no more parts are written, the part
 * being read is ended with an error (its write leaves the file as it was; a part the body carried
 * whole before the failure is written), and it rejects once that write has settled, so that the
 * answer comes after the sandbox's files have stopped changing. The rest of the body is read and
 * dropped, so that a client still sending gets the answer.
 */
export async function eachUpload<T>(req: FastifyRequest, write: Write<T>): Promise<T[]> {
  const query = (req.query as { path?: unknown }).path;
  const given = typeof query === 'string' && query ? query : undefined;
  const raw = bodyOf(req);
  // the client left while its sandbox was found (or resumed): nothing more will come
  if (raw.destroyed && !raw.readableEnded) throw brokeOff();
  let unpackError: unknown;
  let body = raw;
  let unzip: ReturnType<typeof createGunzip> | undefined;
  if (uploadEncoding(req) === 'gzip') {
    unzip = createGunzip();
    // recorded before the write that reads it sees the error: the answer is then a 400 (a body
    // cut off is not a bad one: the client is gone, and its error is the cut's)
    unzip.on('error', (e) => {
      if (unpacking(e)) unpackError ??= e;
    });
    const z = unzip;
    raw.once('error', () => z.destroy(brokeOff()));
    raw.once('close', () => {
      if (!raw.readableEnded) z.destroy(brokeOff());
    });
    body = raw.pipe(z);
  }
  try {
    if (/^multipart\/form-data/i.test(String(req.headers['content-type'] ?? '')))
      return await eachPart(req, body, given, write);
    const length = Number(req.headers['content-length']);
    const size = body === raw && Number.isSafeInteger(length) && length >= 0 ? length : undefined;
    return [await write({ path: given, data: body, ...(size === undefined ? {} : { size }) })];
  } catch (e) {
    raw.unpipe();
    raw.resume();
    unzip?.destroy();
    if (unpackError)
      throw new SnaplabError('BAD_INPUT', 'the gzip body does not unpack', 'send gzip data, or no Content-Encoding', {
        cause: unpackError,
      });
    throw e;
  }
}

/** Each part of a multipart body, written in order as it is read (see eachUpload). */
function eachPart<T>(req: FastifyRequest, body: Readable, given: string | undefined, write: Write<T>): Promise<T[]> {
  return new Promise<T[]>((resolve, reject) => {
    let parser: BusboyInstance;
    try {
      parser = new Busboy({
        headers: req.headers as { 'content-type': string },
        // the filename is the file's full path in the sandbox (busboy keeps only its base otherwise)
        preservePath: true,
        // every part is a file (one without a filename goes to ?path=), as envd reads them
        isPartAFile: () => true,
        limits: { files: MAX_PARTS, parts: MAX_PARTS, headerPairs: 100 },
      });
    } catch (e) {
      reject(badInput(`a multipart body that cannot be read: ${(e as Error).message}`, e));
      return;
    }
    const results: T[] = [];
    let parts = 0;
    // one write at a time: a part waits in busboy (its stream paused, and the body with it) until
    // the one before it is written; at once, a thousand small parts were a thousand processes
    let chain = Promise.resolve();
    let writing: Readable | undefined;
    let done = false;
    const fail = (e: unknown): void => {
      if (done) return;
      done = true;
      body.unpipe(parser);
      writing?.destroy(brokeOff());
      // the answer once the write under way has settled (killed, or landed whole); the parts
      // queued behind it are skipped
      const answer = (): void => reject(e);
      chain.then(answer, answer);
    };
    parser.on('file', (field, file, filename) => {
      // a part's errors reach its write (which then keeps the file as it was) or fail(), never
      // the process: busboy ends a part cut short with one, and fail() ends the part being written
      file.on('error', () => undefined);
      // a form's other fields are not files: envd skips every part not named "file", as here
      if (done || field !== 'file') {
        file.resume();
        return;
      }
      parts++;
      chain = chain.then(async () => {
        if (done) return void file.resume();
        writing = file;
        results.push(await write({ path: given ?? (filename || undefined), data: file }));
        writing = undefined;
      });
      chain.catch(fail);
    });
    const tooMany = (): void => fail(badInput(`an upload of over ${MAX_PARTS} parts`));
    parser.on('partsLimit', tooMany);
    parser.on('filesLimit', tooMany);
    parser.on('error', (e) => fail(badInput(`a malformed multipart body: ${(e as Error).message}`, e)));
    parser.on('finish', () => {
      if (!parts) fail(badInput('a multipart body without parts'));
      chain.then(() => {
        if (done) return;
        done = true;
        resolve(results);
      }, fail);
    });
    // the request's own errors are a client gone (ECONNRESET): said as a cut; zlib's are a bad body
    body.once('error', (e) => fail(unpacking(e) ? e : brokeOff()));
    body.once('close', () => {
      if (!body.readableEnded) fail(brokeOff());
    });
    body.pipe(parser);
  });
}
