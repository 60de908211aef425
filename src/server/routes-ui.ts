/**
 * What the dashboard needs beside the API: its static files at `/` (built by Vite into dist/web,
 * public like /healthz: they hold no data, every call they make needs the same key as any
 * client), who the caller is, every visible machine's CPU and memory in one call, and the
 * `snaplab bench --results` directories under the daemon's bench directory.
 */
import { existsSync } from 'node:fs';
import { lstat, readFile, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import fastifyStatic from '@fastify/static';
import { Type } from 'typebox';
import { packageRoot } from '../agent/binary.js';
import { SnaplabError } from '../errors.js';
import { cgroupFor, stats } from '../host/cgroups.js';
import type { Daemon } from './daemon.js';
import { errors } from './schemas.js';

const any = Type.Object({}, { additionalProperties: true });
/** the page may talk to its own origin only, run no inline script, and be framed by nobody */
const CSP = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";
const RESULTS_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

export const webRoot = (): string => join(packageRoot(), 'dist', 'web');

export async function uiRoutes(app: FastifyInstance, d: Daemon): Promise<void> {
  const root = webRoot();
  if (existsSync(join(root, 'index.html'))) {
    // wildcard: false routes each built file by name (found once, at start), so no catch-all
    // route can shadow an API path or serve anything outside dist/web
    await app.register(fastifyStatic, {
      root, wildcard: false, index: 'index.html', schemaHide: true, cacheControl: false,
      setHeaders: (res, path) => {
        res.setHeader('content-security-policy', CSP);
        res.setHeader('x-content-type-options', 'nosniff');
        res.setHeader('referrer-policy', 'no-referrer');
        // Vite names assets by their hash: they never change; the page itself is checked each time
        res.setHeader('cache-control', path.includes('/assets/') ? 'public, max-age=31536000, immutable' : 'no-cache');
      },
    });
  } else {
    app.get('/', { schema: { hide: true } }, async () => {
      throw new SnaplabError('UI_NOT_BUILT', `the dashboard is not built (no ${join(root, 'index.html')})`, 'run `npm run build` in the snaplab checkout');
    });
  }

  app.get('/whoami', { config: { scope: 'read' }, schema: { tags: ['keys'], summary: 'The caller: its key (local on the Unix socket), scopes and quotas', response: { 200: any, ...errors } } }, async (req) => ({
    key: req.caller.key, scopes: [...req.caller.scopes], maxSandboxes: req.caller.maxSandboxes ?? null, maxExecs: req.caller.maxExecs ?? null,
  }));

  // one call for the whole list: the dashboard polls it and draws CPU from the difference
  app.get('/usage', { config: { scope: 'read' }, schema: { tags: ['sandboxes'], summary: "Every visible machine's memory, pids and CPU time now (from its cgroup)", response: { 200: Type.Array(any), ...errors } } }, async (req) => {
    const at = Date.now();
    const recs = d.lab.context.store.listSandboxes().filter((r) => (r.state === 'running' || r.state === 'paused') && d.visible(req.caller, r.id));
    return Promise.all(recs.map(async (r) => ({ id: r.id, at, ...(await stats(cgroupFor(r.id)).catch(() => ({}))) })));
  });

  // every take of a pool's standbys (a pool run's take phase, or a take for the caller's own use),
  // from the stored traces: takes by the CLI and the library count as well as the daemon's own
  app.get('/pools/:name/takes', {
    config: { scope: 'read' },
    schema: { tags: ['pools'], summary: 'The takes of a pool since a time (epoch ms): when, how long, hit or miss', params: Type.Object({ name: Type.String() }), querystring: Type.Object({ since: Type.Optional(Type.Number({ minimum: 0 })) }), response: { 200: Type.Array(any), ...errors } },
  }, async (req) => {
    const name = (req.params as { name: string }).name;
    await d.lab.pool(name).stats(); // POOL_NOT_FOUND for a pool that is not there
    const since = (req.query as { since?: number }).since ?? Date.now() - 60_000;
    return d.lab.context.store.operationsSince(name, ['run', 'take'], since).reverse().map((t) => {
      const take = t.kind === 'take' ? t.totalMs : t.phases.find((p) => p.name === 'take' && p.parent === null);
      const ms = typeof take === 'number' ? take : take ? take.endMs - take.startMs : null;
      return { at: t.startedAt, kind: t.kind, ms, hit: (t.details as { hit?: boolean } | null)?.hit ?? null, status: t.status };
    });
  });

  const benchDir = d.opts.benchDir ?? join(d.lab.home, 'bench');
  app.get('/bench', { config: { scope: 'read' }, schema: { tags: ['bench'], summary: 'The `snaplab bench --results` directories in the daemon\'s bench directory (serve --bench-dir)', response: { 200: Type.Array(any), ...errors } } }, async () => {
    const names = await readdir(benchDir).catch(() => [] as string[]);
    const out: Record<string, unknown>[] = [];
    for (const name of names.filter((n) => RESULTS_NAME.test(n)).sort()) {
      const s = await readResults(benchDir, name).catch(() => undefined);
      if (s) out.push({ name, workload: s.workload, storage: s.storage ?? null, startedAt: s.startedAt, rungs: Array.isArray(s.rungs) ? s.rungs.length : 0, compare: !!s.compare });
    }
    return out;
  });
  app.get('/bench/:name', { config: { scope: 'read' }, schema: { tags: ['bench'], summary: 'One results directory: its summary.json', params: Type.Object({ name: Type.String() }), response: { 200: any, ...errors } } }, async (req) =>
    readResults(benchDir, (req.params as { name: string }).name));
}

/**
 * A results directory's summary.json. Its name is one plain path segment; neither it nor the file
 * may be a symbolic link (a read key must not read files elsewhere on the host through one).
 */
async function readResults(dir: string, name: string): Promise<Record<string, unknown> & { workload: string; startedAt: string; rungs: unknown[] }> {
  if (!RESULTS_NAME.test(name)) throw new SnaplabError('BAD_INPUT', `invalid results name ${JSON.stringify(name)}`, 'give a directory name from GET /bench');
  const sub = join(dir, name);
  const file = join(sub, 'summary.json');
  const [a, b] = await Promise.all([lstat(sub).catch(() => undefined), lstat(file).catch(() => undefined)]);
  if (!a?.isDirectory() || !b?.isFile()) throw new SnaplabError('RESULTS_NOT_FOUND', `no results ${name} in ${dir}`, 'write them with `snaplab bench --results DIR/NAME`, list them with GET /bench');
  if (b.size > 16 << 20) throw new SnaplabError('BAD_RESULTS', `${file} is ${b.size} bytes`, 'a summary.json is far smaller: is it one?');
  let s: unknown;
  try {
    s = JSON.parse(await readFile(file, 'utf8'));
  } catch (e) {
    throw new SnaplabError('BAD_RESULTS', `${file} is not JSON: ${(e as Error).message}`, 'rerun the bench with --results into a new directory');
  }
  const o = s as Record<string, unknown>;
  if (!o || typeof o !== 'object' || typeof o.workload !== 'string' || !Array.isArray(o.rungs)) throw new SnaplabError('BAD_RESULTS', `${file} is not a bench summary (no workload or rungs)`, 'give a directory written by `snaplab bench --results`');
  return o as Record<string, unknown> & { workload: string; startedAt: string; rungs: unknown[] };
}
