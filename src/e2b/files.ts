/**
 * envd's files: `GET /files` (a file's bytes), `POST /files` (multipart, each part's filename the
 * full path, or an octet-stream body to `?path=`), and the filesystem service's ListDir, Stat,
 * MakeDir, Remove and Move (spec/envd/filesystem/filesystem.proto), on the Lab API's
 * `sandbox.files`. The user inside is `?username=` or `Authorization: Basic user:`.
 */
import { posix } from 'node:path';
import { gunzipSync } from 'node:zlib';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { SandboxApi } from '../sdk/api.js';
import type { FileInfo } from '../lab/io/files.js';
import { SnaplabError, isSnaplabError } from '../errors.js';
import { orElse } from '../cleanup.js';
import { ConnectError, readBody } from './connect.js';
import { parseMultipart } from './multipart.js';
import { sendError, type E2bState } from './state.js';
import type { EnvdUser } from './users.js';

type Unary = (
  state: E2bState,
  fn: (box: SandboxApi, m: Record<string, unknown>, req: FastifyRequest) => Promise<unknown>,
) => (req: FastifyRequest, reply: FastifyReply) => Promise<FastifyReply>;

/** The largest upload taken at once (a part is held in memory before it is written). */
const MAX_UPLOAD = 256 << 20;

/** A path as envd takes it: relative ones are under the user's home. */
export function absolute(path: unknown, user: EnvdUser): string {
  if (typeof path !== 'string' || !path) throw new SnaplabError('BAD_INPUT', 'no path given', 'give ?path=/FILE');
  if (path.startsWith('/')) return posix.normalize(path);
  return posix.join(user.home ?? `/home/${user.name}`, path);
}

/** envd's HTTP errors: `{code, message}` with the status (a missing file: 404). */
function fileError(reply: FastifyReply, e: unknown): FastifyReply {
  return sendError(reply, e);
}

async function getFile(state: E2bState, req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
  try {
    const { box, user } = await state.fileSandbox(req, 'read');
    const path = absolute((req.query as { path?: unknown }).path, user);
    const data = await box.files.read(path, { user: user.name });
    return reply.type('application/octet-stream').header('content-length', data.length).send(data);
  } catch (e) {
    return fileError(reply, e);
  }
}

function gunzip(b: Buffer): Buffer {
  try {
    return gunzipSync(b, { maxOutputLength: MAX_UPLOAD });
  } catch (e) {
    throw new SnaplabError('BAD_INPUT', 'the gzip body does not unpack', 'send gzip data, or no Content-Encoding', {
      cause: e,
    });
  }
}

/** Write one file, its directories made first (as envd does); its entry as envd answers it. */
async function writeOne(box: SandboxApi, path: string, data: Buffer, user: string | undefined) {
  await box.files.mkdir(posix.dirname(path), { parents: true, user });
  await box.files.write(path, data, { user });
  return { name: posix.basename(path), type: 'file', path };
}

async function postFiles(state: E2bState, req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
  try {
    const { box, user } = await state.fileSandbox(req, 'write');
    const type = String(req.headers['content-type'] ?? '');
    let body = await readBody(req.body, MAX_UPLOAD);
    if (/gzip/i.test(String(req.headers['content-encoding'] ?? ''))) body = gunzip(body);
    const query = (req.query as { path?: unknown }).path;
    const written = [];
    if (type.startsWith('multipart/form-data')) {
      // `?path=` when given (older SDKs name the part "blob"), else the part's filename
      for (const part of parseMultipart(type, body))
        written.push(await writeOne(box, absolute(query ?? part.filename, user), part.data, user.name));
    } else written.push(await writeOne(box, absolute(query, user), body, user.name));
    return reply.type('application/json').send(written);
  } catch (e) {
    return fileError(reply, e);
  }
}

const FILE_TYPE: Record<string, string> = {
  file: 'FILE_TYPE_FILE',
  dir: 'FILE_TYPE_DIRECTORY',
  symlink: 'FILE_TYPE_SYMLINK',
};

/** A snaplab FileInfo as envd's EntryInfo (JSON). */
function entryOf(f: FileInfo): Record<string, unknown> {
  const mode = Number.parseInt(f.mode, 8);
  return {
    name: f.name,
    type: FILE_TYPE[f.type] ?? 'FILE_TYPE_UNSPECIFIED',
    path: f.path,
    size: String(f.size),
    mode,
    permissions: permissions(f.type, mode),
    owner: String(f.uid),
    group: String(f.gid),
    modifiedTime: f.mtime,
    ...(f.target !== undefined ? { symlinkTarget: f.target } : {}),
  };
}

function permissions(type: string, mode: number): string {
  const bits = 'rwxrwxrwx'.split('').map((c, i) => (mode & (0o400 >> i) ? c : '-'));
  return (type === 'dir' ? 'd' : type === 'symlink' ? 'L' : '-') + bits.join('');
}

/** Not found, said as Connect says it. */
function notFound(e: unknown): never {
  if (isSnaplabError(e, 'FILE_NOT_FOUND')) throw new ConnectError('not_found', e.message);
  throw e;
}

async function listDir(box: SandboxApi, path: string, depth: number, user: string | undefined) {
  const out: Record<string, unknown>[] = [];
  const walk = async (dir: string, level: number): Promise<void> => {
    for (const f of await box.files.list(dir, { user })) {
      out.push(entryOf(f));
      if (f.type === 'dir' && level < depth) await walk(f.path, level + 1);
    }
  };
  const top = await box.files.stat(path, { user }).catch(notFound);
  if (top.type !== 'dir') throw new ConnectError('invalid_argument', `${path} is not a directory`);
  await walk(path, 1);
  return { entries: out };
}

export function registerFiles(app: FastifyInstance, state: E2bState, unary: Unary): void {
  app.get('/files', (req, reply) => getFile(state, req, reply));
  app.post('/files', (req, reply) => postFiles(state, req, reply));
  const F = '/filesystem.Filesystem';
  // the path asked for (relative: under the user's home) and the user the call acts as
  const at = async (box: SandboxApi, m: Record<string, unknown>, req: FastifyRequest) => {
    const user = await state.actAs(box, req);
    return { path: absolute(m.path, user), user: user.name };
  };
  app.post(
    `${F}/Stat`,
    unary(state, async (box, m, req) => {
      const { path, user } = await at(box, m, req);
      return { entry: entryOf(await box.files.stat(path, { user }).catch(notFound)) };
    }),
  );
  app.post(
    `${F}/ListDir`,
    unary(state, async (box, m, req) => {
      const depth = typeof m.depth === 'number' && m.depth > 0 ? m.depth : 1;
      const { path, user } = await at(box, m, req);
      return listDir(box, path, depth, user);
    }),
  );
  app.post(
    `${F}/MakeDir`,
    unary(state, async (box, m, req) => {
      const { path, user } = await at(box, m, req);
      const there = await box.files.stat(path, { user }).catch(orElse(undefined, `stat ${path}`, 'FILE_NOT_FOUND'));
      if (there) throw new ConnectError('already_exists', `${path} exists`);
      await box.files.mkdir(path, { parents: true, user });
      return { entry: entryOf(await box.files.stat(path, { user })) };
    }),
  );
  app.post(
    `${F}/Remove`,
    unary(state, async (box, m, req) => {
      const { path, user } = await at(box, m, req);
      await box.files.remove(path, { recursive: true, force: true, user });
      return {};
    }),
  );
  app.post(
    `${F}/Move`,
    unary(state, async (box, m, req) => {
      const as = await state.actAs(box, req);
      const user = as.name;
      const from = absolute(m.source, as);
      const to = absolute(m.destination, as);
      await box.files.stat(from, { user }).catch(notFound);
      const r = await box.exec(['mv', '--', from, to], { user });
      if (r.exitCode !== 0) throw new ConnectError('failed_precondition', r.stderr.trim() || `mv exited ${r.exitCode}`);
      return { entry: entryOf(await box.files.stat(to, { user })) };
    }),
  );
}
