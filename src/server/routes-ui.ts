/**
 * What the dashboard needs beside the API: its static files at `/` (built by Vite into dist/web,
 * public like /healthz: they hold no data, every call they make needs the same key as any
 * client) and the `snaplab bench --results` directories under the daemon's bench directory (who
 * the caller is and every visible machine's CPU and memory: routes-shared.ts).
 */
import { constants, existsSync } from 'node:fs';
import { lstat, open, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import type { FastifyInstance, FastifyPluginAsync } from 'fastify';
import fastifyStatic from '@fastify/static';
import { Type } from 'typebox';
import { packageRoot } from '../agent/binary.js';
import { SnaplabError } from '../errors.js';
import type { Daemon } from './daemon.js';
import { errors } from './schemas.js';
import { orElse } from '../cleanup.js';

const any = Type.Object({}, { additionalProperties: true });
/** the page may talk to its own origin only, run no inline script, and be framed by nobody */
const CSP =
  "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";
const RESULTS_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

export const webRoot = (): string => join(packageRoot(), 'dist', 'web');

export async function uiRoutes(app: FastifyInstance, d: Daemon): Promise<void> {
  await staticFiles(app);
  benchRoutes(app, d);
}

/** The dashboard's built files, or a `/` that says they are not built. */
async function staticFiles(app: FastifyInstance): Promise<void> {
  const root = webRoot();
  if (existsSync(join(root, 'index.html'))) {
    // wildcard: false routes each built file by name (found once, at start), so no catch-all
    // route can shadow an API path or serve anything outside dist/web
    // its files need no key: marked so in a context of their own (server/scopes.ts publicOrFail)
    const files: FastifyPluginAsync = async (scope) => {
      scope.addHook('onRoute', (r) => {
        r.config = { ...r.config, public: true };
      });
      await scope.register(fastifyStatic, {
        root,
        wildcard: false,
        index: 'index.html',
        schemaHide: true,
        cacheControl: false,
        setHeaders: (res, path) => {
          res.setHeader('content-security-policy', CSP);
          res.setHeader('x-content-type-options', 'nosniff');
          res.setHeader('referrer-policy', 'no-referrer');
          // Vite names assets by their hash: they never change; the page itself is checked each time
          res.setHeader(
            'cache-control',
            path.includes('/assets/') ? 'public, max-age=31536000, immutable' : 'no-cache',
          );
        },
      });
    };
    await app.register(files);
  } else {
    app.get('/', { config: { public: true }, schema: { hide: true } }, async () => {
      throw new SnaplabError(
        'UI_NOT_BUILT',
        `the dashboard is not built (no ${join(root, 'index.html')})`,
        'run `npm run build` in the snaplab checkout',
      );
    });
  }
}

function benchRoutes(app: FastifyInstance, d: Daemon): void {
  const benchDir = d.opts.benchDir ?? join(d.lab.home, 'bench');
  app.get(
    '/bench',
    {
      schema: {
        tags: ['bench'],
        summary: "The `snaplab bench --results` directories in the daemon's bench directory (serve --bench-dir)",
        response: { 200: Type.Array(any), ...errors },
      },
    },
    async () => {
      const names = await readdir(benchDir).catch(orElse([] as string[], 'readdir', 'ENOENT'));
      const out: Record<string, unknown>[] = [];
      for (const name of names.filter((n) => RESULTS_NAME.test(n)).sort()) {
        const s = await readResults(benchDir, name).catch(
          orElse(undefined, `read bench results ${name}`, 'BAD_RESULTS', 'RESULTS_NOT_FOUND', 'ENOENT'),
        );
        if (s)
          out.push({
            name,
            workload: s.workload,
            storage: s.storage ?? null,
            startedAt: s.startedAt,
            rungs: Array.isArray(s.rungs) ? s.rungs.length : 0,
            compare: !!s.compare,
          });
      }
      return out;
    },
  );
  app.get(
    '/bench/:name',
    {
      schema: {
        tags: ['bench'],
        summary: 'One results directory: its summary.json',
        params: Type.Object({ name: Type.String() }),
        response: { 200: any, ...errors },
      },
    },
    async (req) => readResults(benchDir, (req.params as { name: string }).name),
  );
}

/**
 * A results directory's summary.json. Its name is one plain path segment; neither it nor the file
 * may be a symbolic link (a read key must not read files elsewhere on the host through one): the
 * directory is checked with lstat and the file opened with O_NOFOLLOW and checked on its handle.
 * Errors name the results, not host paths, and never quote the file.
 */
async function readResults(
  dir: string,
  name: string,
): Promise<Record<string, unknown> & { workload: string; startedAt: string; rungs: unknown[] }> {
  if (!RESULTS_NAME.test(name))
    throw new SnaplabError(
      'BAD_INPUT',
      `invalid results name ${JSON.stringify(name)}`,
      'give a directory name from GET /bench',
    );
  const missing = (): SnaplabError =>
    new SnaplabError(
      'RESULTS_NOT_FOUND',
      `no results ${name} in the bench directory`,
      'write them with `snaplab bench --results $SNAPLAB_HOME/bench/NAME` (or serve --bench-dir); list them with GET /bench',
    );
  const sub = await lstat(join(dir, name)).catch(orElse(undefined, `lstat ${join(dir, name)}`, 'ENOENT'));
  if (!sub?.isDirectory()) throw missing();
  const fh = await open(
    join(dir, name, 'summary.json'),
    constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK,
  ).catch(orElse(undefined, `open ${join(dir, name, 'summary.json')}`, 'ENOENT', 'ELOOP', 'ENOTDIR'));
  if (!fh) throw missing();
  let text: string;
  try {
    const st = await fh.stat();
    if (!st.isFile()) throw missing();
    if (st.size > 16 << 20)
      throw new SnaplabError(
        'BAD_RESULTS',
        `results ${name}: summary.json is ${st.size} bytes`,
        'a summary.json is far smaller: is it one?',
      );
    text = await fh.readFile('utf8');
  } finally {
    await fh.close();
  }
  let o: Record<string, unknown> | undefined;
  try {
    o = JSON.parse(text) as Record<string, unknown>;
  } catch (e) {
    throw new SnaplabError(
      'BAD_RESULTS',
      `results ${name}: summary.json is not JSON`,
      'rerun the bench with --results into a new directory',
      { cause: e },
    );
  }
  if (!o || typeof o !== 'object' || typeof o.workload !== 'string' || !Array.isArray(o.rungs))
    throw new SnaplabError(
      'BAD_RESULTS',
      `results ${name}: summary.json is not a bench summary (no workload or rungs)`,
      'give a directory written by `snaplab bench --results`',
    );
  return o as Record<string, unknown> & { workload: string; startedAt: string; rungs: unknown[] };
}
