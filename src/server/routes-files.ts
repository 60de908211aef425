/**
 * Files of a sandbox, streamed both ways: `PUT /sandboxes/{id}/files?path=` takes the body as it
 * comes (application/octet-stream) into a temporary file renamed over the path; `GET` streams the
 * file out with flow control. Trees travel as tar (`/archive`). Stat, list, mkdir and remove are
 * one call each. Paths are the machine's own; the calls run as `user` (default root) inside it.
 * A gateway passes them, bodies and answers streamed, to the sandbox's node (sandbox-calls.ts).
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { PassThrough, Readable } from 'node:stream';
import { SnaplabError } from '../errors.js';
import { Type } from 'typebox';
import type { Daemon } from './daemon.js';
import { servedBy, type SandboxCalls } from './sandbox-calls.js';
import { IdParams, PathQuery, errors } from './schemas.js';

type PathQ = { path: string; user?: string };

/** An upload's body: the raw stream (application/octet-stream or x-tar), or none; anything parsed is refused. */
export function streamBody(body: unknown): Readable {
  if (body === undefined || body === null) return Readable.from([]);
  if (body instanceof Readable) return body;
  throw new SnaplabError(
    'UNSUPPORTED_MEDIA',
    'send the bytes as application/octet-stream (a file) or application/x-tar (a tree)',
    'e.g. curl -T FILE -H "content-type: application/octet-stream" ...',
  );
}

const tags = ['files'];
const info = Type.Object({}, { additionalProperties: true });

/** The sandbox of a request's `:id`, as its caller may see it. */
const box = (d: Daemon, req: FastifyRequest) => d.sandbox((req.params as { id: string }).id, req.caller);

export async function fileRoutes(app: FastifyInstance, s: SandboxCalls): Promise<void> {
  fileContentRoutes(app, s);
  fileEntryRoutes(app, s);
  archiveRoutes(app, s);
}

/** A file's bytes, down and up. */
function fileContentRoutes(app: FastifyInstance, s: SandboxCalls): void {
  app.get(
    '/sandboxes/:id/files',
    {
      schema: { tags, summary: 'Download a file (streamed)', params: IdParams, querystring: PathQuery },
    },
    servedBy(s, (d) => async (req, reply) => {
      const q = req.query as PathQ;
      const b = await box(d, req);
      // stat first: a missing file is a 404, not a 200 that breaks off. Chunked, not a
      // Content-Length from the stat: a file that grows or shrinks meanwhile must not break the connection
      const st = await b.files.stat(q.path, { follow: true, user: q.user });
      if (st.type === 'dir')
        throw new SnaplabError(
          'FILE_ERROR',
          `read ${q.path}: it is a directory (EISDIR)`,
          'list it with GET /sandboxes/{id}/files/list, or take its tar at /archive',
        );
      const out = new PassThrough();
      void b.files.readTo(q.path, out, { user: q.user }).catch((e: Error) => out.destroy(e));
      void reply.header('content-type', 'application/octet-stream').header('x-snaplab-size', String(st.size));
      return reply.send(out);
    }),
  );

  app.put(
    '/sandboxes/:id/files',
    {
      schema: {
        tags,
        summary: 'Upload a file (application/octet-stream body, streamed; parents made; whole or not at all)',
        params: IdParams,
        querystring: Type.Object({
          path: Type.String({ minLength: 1 }),
          user: Type.Optional(Type.String()),
          owner: Type.Optional(Type.String({ minLength: 1, description: 'USER[:GROUP] the file is given to' })),
          mode: Type.Optional(Type.String({ pattern: '^[0-7]{3,4}$' })),
          append: Type.Optional(Type.Boolean()),
          through: Type.Optional(Type.Boolean({ description: 'a link at path is written through, not replaced' })),
          xattr: Type.Optional(
            Type.Array(Type.String({ pattern: '^user\\.[^=]+=' }), {
              description: 'a `user.*` extended attribute the file lands with, NAME=VALUE; repeated',
            }),
          ),
        }),
        response: { 200: Type.Object({ bytes: Type.Integer() }), ...errors },
      },
    },
    servedBy(s, (d) => async (req) => {
      const q = req.query as PathQ & {
        owner?: string;
        mode?: string;
        append?: boolean;
        through?: boolean;
        xattr?: string[];
      };
      const xattrs = q.xattr?.length
        ? Object.fromEntries(q.xattr.map((a) => [a.slice(0, a.indexOf('=')), a.slice(a.indexOf('=') + 1)]))
        : undefined;
      const body = streamBody(req.body);
      const length = Number(req.headers['content-length']);
      const bytes = await (await box(d, req)).files.write(q.path, body, {
        user: q.user,
        owner: q.owner,
        mode: q.mode ? parseInt(q.mode, 8) : undefined,
        append: q.append,
        through: q.through,
        xattrs,
        ...(Number.isSafeInteger(length) ? { size: length } : {}),
      });
      return { bytes };
    }),
  );
}

/** Stat, list, mkdir, remove and move. */
function fileEntryRoutes(app: FastifyInstance, s: SandboxCalls): void {
  app.get(
    '/sandboxes/:id/files/stat',
    {
      schema: { tags, params: IdParams, querystring: PathQuery, response: { 200: info, ...errors } },
    },
    servedBy(s, (d) => async (req) => {
      const q = req.query as PathQ;
      return (await box(d, req)).files.stat(q.path, { user: q.user });
    }),
  );

  app.get(
    '/sandboxes/:id/files/list',
    {
      schema: {
        tags,
        summary: 'The entries of a directory, sorted; `depth` N: N levels, a directory followed by its entries',
        params: IdParams,
        querystring: Type.Object({
          path: Type.String({ minLength: 1 }),
          user: Type.Optional(Type.String()),
          depth: Type.Optional(Type.Integer({ minimum: 1, maximum: 10000 })),
        }),
        response: { 200: Type.Array(info), ...errors },
      },
    },
    servedBy(s, (d) => async (req) => {
      const q = req.query as PathQ & { depth?: number };
      return (await box(d, req)).files.list(q.path, { user: q.user, depth: q.depth });
    }),
  );

  app.post(
    '/sandboxes/:id/files/mkdir',
    {
      schema: {
        tags,
        params: IdParams,
        body: Type.Object(
          {
            path: Type.String({ minLength: 1 }),
            parents: Type.Optional(Type.Boolean()),
            mode: Type.Optional(Type.String({ pattern: '^[0-7]{3,4}$' })),
            user: Type.Optional(Type.String()),
            owner: Type.Optional(Type.String({ minLength: 1 })),
          },
          { additionalProperties: false },
        ),
        response: { 204: Type.Null(), ...errors },
      },
    },
    servedBy(s, (d) => async (req, reply) => {
      const b = req.body as { path: string; parents?: boolean; mode?: string; user?: string; owner?: string };
      await (await box(d, req)).files.mkdir(b.path, {
        parents: b.parents,
        mode: b.mode ? parseInt(b.mode, 8) : undefined,
        user: b.user,
        owner: b.owner,
      });
      return reply.status(204).send();
    }),
  );

  app.post(
    '/sandboxes/:id/files/move',
    {
      schema: {
        tags,
        summary: 'Rename a file or directory (rename(2)); `parents`: the missing directories of `to` made first',
        params: IdParams,
        body: Type.Object(
          {
            from: Type.String({ minLength: 1 }),
            to: Type.String({ minLength: 1 }),
            parents: Type.Optional(Type.Boolean()),
            user: Type.Optional(Type.String()),
            owner: Type.Optional(Type.String({ minLength: 1 })),
          },
          { additionalProperties: false },
        ),
        response: { 204: Type.Null(), ...errors },
      },
    },
    servedBy(s, (d) => async (req, reply) => {
      const b = req.body as { from: string; to: string; parents?: boolean; user?: string; owner?: string };
      await (await box(d, req)).files.move(b.from, b.to, { parents: b.parents, user: b.user, owner: b.owner });
      return reply.status(204).send();
    }),
  );

  app.delete(
    '/sandboxes/:id/files',
    {
      schema: {
        tags,
        summary: 'Remove a file or (recursive) a tree; symbolic links are never followed',
        params: IdParams,
        querystring: Type.Object({
          path: Type.String({ minLength: 1 }),
          recursive: Type.Optional(Type.Boolean()),
          force: Type.Optional(Type.Boolean()),
          user: Type.Optional(Type.String()),
        }),
        response: { 204: Type.Null(), ...errors },
      },
    },
    servedBy(s, (d) => async (req, reply) => {
      const q = req.query as PathQ & { recursive?: boolean; force?: boolean };
      await (await box(d, req)).files.remove(q.path, { recursive: q.recursive, force: q.force, user: q.user });
      return reply.status(204).send();
    }),
  );
}

/** Trees as tar, both ways. */
function archiveRoutes(app: FastifyInstance, s: SandboxCalls): void {
  app.put(
    '/sandboxes/:id/archive',
    {
      schema: {
        tags,
        summary: 'Unpack a tar stream (application/x-tar) into the directory `path`',
        params: IdParams,
        querystring: Type.Object({ path: Type.String({ minLength: 1 }) }),
        response: { 200: info, ...errors },
      },
    },
    servedBy(s, (d) => async (req) => {
      const body = streamBody(req.body);
      return (await box(d, req)).upload((req.query as { path: string }).path, body);
    }),
  );

  app.get(
    '/sandboxes/:id/archive',
    {
      schema: {
        tags,
        summary: 'A tar stream of `path` (a file or a tree; `dir/.` for its contents)',
        params: IdParams,
        querystring: Type.Object({ path: Type.String({ minLength: 1 }) }),
      },
    },
    servedBy(s, (d) => async (req, reply) => {
      const b = await box(d, req);
      const path = (req.query as { path: string }).path;
      await b.files.stat(path); // a missing path is a 404 before the stream begins
      const out = new PassThrough();
      void b.download(path, out).catch((e: Error) => out.destroy(e));
      void reply.header('content-type', 'application/x-tar');
      return reply.send(out);
    }),
  );
}
