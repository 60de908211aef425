/**
 * envd's files: `GET /files` (a file's bytes), `POST /files` (multipart, each part's filename the
 * full path, or an octet-stream body to `?path=`), and the filesystem service's ListDir, Stat,
 * MakeDir, Remove and Move (spec/envd/filesystem/filesystem.proto), on the Lab API's
 * `sandbox.files`. As envd, each runs as root inside, and what an upload, MakeDir or Move makes
 * (files, missing directories) is given to the call's user (`?username=`, `Authorization: Basic
 * user:`, else the sandbox's default), whose home relative paths are under. A file's metadata
 * (envd ≥ 0.6.2: `X-Metadata-*` upload headers, EntryInfo's `metadata`) is its `user.e2b.*`
 * extended attributes, as envd keeps it.
 */
import { posix } from 'node:path';
import { once } from 'node:events';
import { PassThrough, type Readable } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { SandboxApi } from '../sdk/api.js';
import { SnaplabError, isSnaplabError } from '../errors.js';
import { orElse } from '../cleanup.js';
import { ConnectError, kindChecked, wrongKind } from './connect.js';
import { METADATA_XATTR, entryOf, metadataOf } from './entries.js';
import { eachUpload, uploadEncoding } from './uploads.js';
import { contentTypeOf, dispositionOf, rangeOf, sliceOf, type Wanted } from './download.js';
import type { Unary } from './envd.js';
import { sendError, type E2bState } from './state.js';
import type { EnvdUser, IdNames } from './users.js';

/** The deepest ListDir walks (envd's depth is a uint32: a depth past any real tree's is the whole tree). */
const MAX_DEPTH = 10000;

/**
 * Who what a call makes or writes is given to: its user, root too (as envd's chown to the caller:
 * a file of another user's written over as root becomes root's).
 */
const ownerOf = (user: EnvdUser): string => (user.name === undefined || user.name === 'root' ? '0:0' : user.name);

/**
 * A path as envd takes it: an absolute one as given (the machine's kernel resolves its `..`, through
 * its links); `~` and `~/…` the user's home, a relative one (or none) under it, cleaned as Go's
 * filepath.Join cleans (no trailing slash). (`~other` is refused, as envd refuses it.)
 */
export function absolute(path: unknown, user: EnvdUser): string {
  if (path !== undefined && typeof path !== 'string')
    throw new SnaplabError('BAD_INPUT', 'the path is not a string', 'give ?path=/FILE');
  const home = user.home ?? `/home/${user.name ?? 'root'}`;
  let p = path ?? '';
  if (p.startsWith('/')) return p;
  if (p.startsWith('~')) {
    if (p.length > 1 && p[1] !== '/')
      throw new SnaplabError(
        'BAD_INPUT',
        `cannot expand ${JSON.stringify(p)}: only ~ is the user's home`,
        'give ~/PATH',
      );
    p = p.slice(1);
  }
  const joined = posix.join(home, p);
  return joined.length > 1 ? joined.replace(/\/+$/, '') : joined;
}

/** envd's HTTP errors: `{code, message}` with the status (a missing file: 404). */
function fileError(state: E2bState, req: FastifyRequest, reply: FastifyReply, e: unknown, id?: string): FastifyReply {
  // a directory read or written as a file: 400, as envd answers it
  if (wrongKind(e)) return sendError(reply, new SnaplabError('BAD_INPUT', (e as Error).message));
  // the sandbox gone or paused: 502; its user gone: 401 (`id`: the sandbox, once known, which a
  // signed URL names without the E2b-Sandbox-Id header)
  return sendError(reply, state.unavailable(req, e, id));
}

async function getFile(state: E2bState, req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
  let id: string | undefined;
  try {
    const { box, user } = await state.fileSandbox(req, 'read');
    id = box.id;
    const path = absolute((req.query as { path?: unknown }).path, user);
    // one byte range, as envd's ServeContent answers it: the size first (a read ends at the file's end)
    let part: Wanted;
    let size = 0;
    if (typeof req.headers.range === 'string') {
      // (through a link, as envd's os.Stat)
      const info = await box.files.stat(path, { follow: true }).catch((e: unknown) => {
        throw state.unavailable(req, e, box.id);
      });
      size = info.size;
      if (info.type === 'file') part = rangeOf(req.headers.range, size);
      if (part === 'unsatisfiable')
        return reply
          .code(416)
          .header('content-range', `bytes */${size}`)
          .type('text/plain; charset=utf-8')
          .send('invalid range: failed to overlap\n');
    }
    // streamed as it is read, not held whole; the status waits for its first bytes (or its end, or
    // its error: a missing file is still a 404). An error after that cuts the response short
    const out = new PassThrough();
    // a client gone before the first bytes (a FIFO nobody writes, a slow file) ends the read: its
    // command is killed with the sink, never left holding a descriptor and a process
    reply.raw.once('close', () => {
      if (!reply.raw.writableFinished) out.destroy();
    });
    const reading = box.files.readTo(path, out);
    await Promise.race([once(out, 'readable'), reading]).catch((e: unknown) => {
      throw state.unavailable(req, e, box.id);
    });
    // a failure after the first bytes (the sandbox gone mid-read) ends the response short, not never
    reading.catch((e: unknown) => out.destroy(e instanceof Error ? e : new Error(String(e))));
    // its type from its name, else from its first bytes (looked at, and put back)
    const head = (out.read() as Buffer | null) ?? Buffer.alloc(0);
    if (head.length) out.unshift(head);
    reply
      .type(contentTypeOf(path, head))
      .header('content-disposition', dispositionOf(path))
      .header('accept-ranges', 'bytes')
      .header('vary', 'Accept-Encoding');
    if (!part || typeof part !== 'object') return reply.send(out);
    // the range's bytes, the read stopped once they are through; failing mid-range, it fails the body (the
    // response cut short, never left open); a client that leaves has the body ended by Fastify
    const body = sliceOf(part.start, part.end, () => {
      out.unpipe(body);
      out.destroy();
    });
    out.once('error', (e) => body.destroy(e));
    out.pipe(body);
    return reply
      .code(206)
      .header('content-range', `bytes ${part.start}-${part.end}/${size}`)
      .header('content-length', String(part.end - part.start + 1))
      .send(body);
  } catch (e) {
    return fileError(state, req, reply, e, id);
  }
}

/** envd's caps: a key fits a 255-byte xattr name with the prefix; all of a file's fit one 4 KiB block. */
const MAX_METADATA_KEY = 255 - METADATA_XATTR.length;
const MAX_METADATA = 4096;

/**
 * An upload's metadata as envd reads it: each `X-Metadata-KEY` header (the first, when repeated),
 * its key lowercased, keys and values printable US-ASCII, within envd's caps (else 400); as the
 * `user.e2b.*` extended attributes the files land with.
 */
function uploadXattrs(req: FastifyRequest): Record<string, string> {
  const out: Record<string, string> = {};
  let total = 0;
  for (const [name, values] of Object.entries(req.raw.headersDistinct)) {
    if (!name.startsWith('x-metadata-') || !values?.length) continue;
    const key = name.slice('x-metadata-'.length);
    const value = values[0]!;
    if (!key) continue;
    if (key.length > MAX_METADATA_KEY || !/^[\x20-\x7e]*$/.test(key + value))
      throw new SnaplabError(
        'BAD_INPUT',
        `invalid metadata: key ${JSON.stringify(key)} (at most ${MAX_METADATA_KEY} bytes) or its value is not printable US-ASCII`,
        'send X-Metadata-KEY: VALUE headers of printable US-ASCII',
      );
    total += METADATA_XATTR.length + key.length + value.length;
    out[METADATA_XATTR + key] = value;
  }
  if (total > MAX_METADATA)
    throw new SnaplabError('BAD_INPUT', `invalid metadata: ${total} bytes, over ${MAX_METADATA}`, 'send less metadata');
  return out;
}

/**
 * Write one file, its missing directories made, both given to `owner` (as envd does), with the
 * upload's metadata (an overwrite replaces the file's metadata whole, as envd's); its entry as
 * envd answers it.
 */
async function writeOne(
  box: SandboxApi,
  path: string,
  data: Readable,
  owner: string | undefined,
  xattrs: Record<string, string>,
  size: number | undefined,
) {
  // a link at the path is written through, as envd's open of it does
  await box.files.write(path, data, { owner, xattrs, through: true, ...(size === undefined ? {} : { size }) });
  const metadata = metadataOf(xattrs);
  return { name: posix.basename(path), type: 'file', path, ...(metadata ? { metadata } : {}) };
}

async function postFiles(state: E2bState, req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
  let id: string | undefined;
  try {
    uploadEncoding(req);
    const { box, user } = await state.fileSandbox(req, 'write');
    id = box.id;
    const xattrs = uploadXattrs(req);
    // each file streamed into the sandbox as it comes (uploads.ts); a second part for a path this
    // upload wrote already is refused, as envd refuses it (the first stays written)
    const paths = new Set<string>();
    const written = await eachUpload(req, async (f) => {
      const path = absolute(f.path, user);
      if (paths.has(path))
        throw new SnaplabError(
          'BAD_INPUT',
          `you cannot upload multiple files to the same path '${path}' in one upload request, only the first specified file was uploaded`,
          'give each file its own path',
        );
      paths.add(path);
      return writeOne(box, path, f.data, ownerOf(user), xattrs, f.size);
    });
    return reply.type('application/json').send(written);
  } catch (e) {
    return fileError(state, req, reply, e, id);
  }
}

/** A path a call must name (an empty one would be the user's home). */
function required(path: unknown, what: string): void {
  if (typeof path !== 'string' || !path) throw new ConnectError('invalid_argument', `${what} is required`);
}

/** Not found, said as Connect says it. */
function notFound(e: unknown): never {
  if (isSnaplabError(e, 'FILE_NOT_FOUND')) throw new ConnectError('not_found', e.message);
  throw e;
}

/**
 * ListDir: `depth` levels under `path` in one command, each directory followed by its entries (as
 * envd's walk); a link to a directory is listed as the directory, under the path asked for (envd
 * follows it: Debian's /bin, /lib and /sbin are such links), links below it are not followed. A
 * path that is not a directory is the listing's own ENOTDIR (invalid_argument), a missing one its
 * ENOENT (not_found): no stat first.
 */
async function listDir(box: SandboxApi, path: string, depth: number, ids: IdNames) {
  const entries = await box.files.list(path, { depth }).catch((e: unknown) => notFound(kindChecked(e)));
  // each entry's path cleaned, as envd's walk joins it (Go's filepath.Join)
  return { entries: entries.map((f) => entryOf({ ...f, path: posix.normalize(f.path) }, ids)) };
}

export function registerFiles(app: FastifyInstance, state: E2bState, unary: Unary): void {
  app.get('/files', (req, reply) => getFile(state, req, reply));
  app.post('/files', (req, reply) => postFiles(state, req, reply));
  const F = '/filesystem.Filesystem';
  // the path asked for (relative: under the user's home), who is given what the call makes, and
  // how owners are named
  const at = async (box: SandboxApi, m: Record<string, unknown>, req: FastifyRequest) => {
    const user = await state.actAs(box, req);
    return { path: absolute(m.path, user), owner: ownerOf(user), ids: user.ids };
  };
  app.post(
    `${F}/Stat`,
    unary(state, async (box, m, req) => {
      const { path, ids } = await at(box, m, req);
      return { entry: entryOf(await box.files.stat(path).catch(notFound), ids) };
    }),
  );
  app.post(
    `${F}/ListDir`,
    unary(state, async (box, m, req) => {
      // envd's depth is a uint32; 0 is one level
      const depth = typeof m.depth === 'number' && m.depth > 0 ? Math.min(Math.floor(m.depth), MAX_DEPTH) : 1;
      const { path, ids } = await at(box, m, req);
      return listDir(box, path, depth, ids);
    }),
  );
  app.post(
    `${F}/MakeDir`,
    unary(state, async (box, m, req) => {
      const { path, owner, ids } = await at(box, m, req);
      const there = await box.files
        .stat(path, { follow: true })
        .catch(orElse(undefined, `stat ${path}`, 'FILE_NOT_FOUND'));
      // as envd: a directory there already is already_exists (the SDK's false), anything else an error
      if (there?.type === 'dir') throw new ConnectError('already_exists', `${path} exists`);
      if (there) throw new ConnectError('invalid_argument', `${path} exists and is not a directory`);
      await box.files.mkdir(path, { parents: true, owner });
      return { entry: entryOf(await box.files.stat(path), ids) };
    }),
  );
  app.post(
    `${F}/Remove`,
    unary(state, async (box, m, req) => {
      // (no path would be the user's home, as envd reads it: never removed by default)
      required(m.path, 'path');
      const { path } = await at(box, m, req);
      await box.files.remove(path, { recursive: true, force: true });
      return {};
    }),
  );
  app.post(
    `${F}/Move`,
    unary(state, async (box, m, req) => {
      required(m.source, 'source');
      required(m.destination, 'destination');
      const user = await state.actAs(box, req);
      const [owner, ids] = [ownerOf(user), user.ids];
      const from = absolute(m.source, user);
      const to = absolute(m.destination, user);
      // rename(2), the target's missing directories made and given to the user first, as envd's
      await box.files.move(from, to, { parents: true, owner }).catch(notFound);
      return { entry: entryOf(await box.files.stat(to), ids) };
    }),
  );
}
