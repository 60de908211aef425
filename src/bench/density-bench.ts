/**
 * `snaplab bench --workload density --counts 0,1000,5000,10000` (issue #34, docs/benchmarks.md
 * "Density"): how the costs of one machine move as the number of idle machines on the host grows.
 * At each count (idle busybox sandboxes made in bulk through the library, with progress), it
 * times `samples` of: create, exec, snapshot and restore of one, list, rm of one, gc with nothing
 * to do; and it reads the host memory each idle sandbox holds (MemAvailable and /proc/meminfo's
 * kernel counters, before the first and now, less this process's own growth, divided by the
 * count; and the mean of what the sandboxes' memory cgroups are charged) and the bulk create rate.
 * Beside those, the fronts (density-fronts.ts): a take from a pool of 2, the CLI's create, rm, ls
 * and ls --json as whole processes, and a daemon on the same home (its start with every machine
 * adopted, the API's paged and whole list, a create's `ready` event on GET /events).
 * It runs in a home of its own under /tmp, removed at its end, so that gc has only the bench's
 * machines to see; an abort (Ctrl-C) or a failure removes everything it made and stops its daemon.
 */
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { availableParallelism, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { bestEffort, orElse } from '../cleanup.js';
import { SnaplabError } from '../errors.js';
import { Lab } from '../sdk/lab.js';
import { createMany } from '../sdk/bulk.js';
import type { Progress } from './progress.js';
import {
  DENSITY_POOL,
  FRONT_OPS,
  type FrontOp,
  type SampleFailure,
  type Sampler,
  cliOps,
  type DaemonMemory,
  daemonOps,
  poolOps,
} from './density-fronts.js';
import { spawnLoop } from './baselines.js';
import { pad } from './report-text.js';
import { renderWaterfall } from '../timing/waterfall.js';
import { percentile } from './stats.js';

export interface DensityOptions {
  /** idle machines at each step, ascending (0: none but the measured ones) */
  counts: number[];
  /** timed operations of each kind at each count */
  samples: number;
  /** creates in flight during the bulk fill */
  concurrency: number;
}

export interface OpFigures {
  /** null when every sample of it failed (the failures say why) */
  p50: number | null;
  p95: number | null;
  samples: number;
}

/** /proc/meminfo's counters that a machine moves, per idle sandbox, KiB */
const COUNTERS = ['AnonPages', 'PageTables', 'KernelStack', 'SUnreclaim', 'SReclaimable', 'Percpu', 'Shmem'] as const;

export interface DensityPoint {
  count: number;
  /** the host's 1, 5 and 15 minute load averages when the operations were timed */
  loadavg: number[];
  /** the fill from the previous count to this one */
  bulk: {
    made: number;
    seconds: number;
    perSecond: number;
    /** the same namespaces made by `unshare` at the same concurrency right after (each exits, so its namespaces are also torn down): the host's floor */
    unsharePerSecond: number;
  } | null;
  /** host memory per idle sandbox, KiB (null at count 0) */
  memory: {
    /** MemAvailable's fall, less this process's RSS growth, over the count */
    perSandboxKiB: number;
    /** what a sandbox's memory cgroup is charged (its processes' pages, kernel memory charged to it), mean of a sample */
    cgroupKiB: number;
    /** /proc/meminfo's counters' growth over the count */
    counters: Record<(typeof COUNTERS)[number], number>;
  } | null;
  ms: Record<LibraryOp | FrontOp, OpFigures>;
  /** the daemon's resident memory with every machine adopted (null when its last sample failed) */
  daemon: DaemonMemory | null;
  /** samples that failed: the run goes on (its other samples and counts are kept), each with what it said */
  failures: SampleFailure[];
}

const LIBRARY_OPS = ['create', 'exec', 'snapshot', 'restore', 'list', 'rm', 'gc'] as const;
type LibraryOp = (typeof LIBRARY_OPS)[number];

export interface DensitySummary {
  workload: 'density';
  startedAt: string;
  finishedAt: string;
  settings: DensityOptions & { image: string; cpus: number; memTotalKiB: number };
  points: DensityPoint[];
}

type Meminfo = Record<string, number>;
const meminfo = (): Meminfo =>
  Object.fromEntries(
    readFileSync('/proc/meminfo', 'utf8')
      .split('\n')
      .filter(Boolean)
      .map((l) => {
        const [k, v] = l.split(/:\s+/);
        return [k!, Number.parseInt(v!, 10)];
      }),
  );
const rssKiB = (): number => Math.round(process.memoryUsage().rss / 1024);
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const round = (v: number, d = 2): number => Math.round(v * 10 ** d) / 10 ** d;
const now = (): number => performance.now();

function figures(xs: number[]): OpFigures {
  if (xs.length === 0) return { p50: null, p95: null, samples: 0 };
  return { p50: round(percentile(xs, 50), 3), p95: round(percentile(xs, 95), 3), samples: xs.length };
}

const ms1 = (v: number | null): string => (v === null ? '-' : v.toFixed(1));

function checkAbort(signal: AbortSignal | undefined): void {
  if (signal?.aborted)
    throw signal.reason instanceof SnaplabError
      ? signal.reason
      : new SnaplabError('ABORTED', 'the density bench was interrupted', 'everything it made is removed; run it again');
}

/** Make `n` idle sandboxes, `concurrency` at a time, with a progress note every second. */
async function fill(
  lab: Lab,
  n: number,
  o: DensityOptions,
  progress: Progress,
  signal?: AbortSignal,
): Promise<DensityPoint['bulk']> {
  if (n <= 0) return null;
  const t0 = now();
  // (its connections are closed at once: the library holds nothing of an idle machine)
  const made = (
    await createMany(
      lab,
      n,
      { labels: { bench: 'density' } },
      {
        parallel: o.concurrency,
        signal,
        onProgress: (p) => progress.note(`creating: ${p.done} of ${n} more (${Math.round(p.perSecond)}/s)`),
      },
    ).catch((e: unknown) => {
      checkAbort(signal);
      throw e;
    })
  ).length;
  checkAbort(signal);
  const seconds = (now() - t0) / 1000;
  const floor = await spawnLoop(Math.min(o.concurrency, n), { durationMs: 3000, count: Math.min(n, 300) }, 'unshare', [
    ...UNSHARE,
    'true',
  ]);
  if (floor.errors.length > 0)
    throw new SnaplabError(
      'INTERNAL',
      `the unshare baseline failed: ${floor.errors[0]}`,
      `run it by hand: unshare ${UNSHARE.join(' ')} true`,
    );
  return {
    made,
    seconds: round(seconds),
    perSecond: round(made / seconds, 1),
    unsharePerSecond: round(floor.latenciesMs.length / (floor.wallMs / 1000), 1),
  };
}

/** the namespaces a sandbox has, made by util-linux's unshare with nothing else: a bulk create's floor */
const UNSHARE = ['--user', '--map-root-user', '--mount', '--pid', '--net', '--ipc', '--uts', '--cgroup', '--fork'];

/** Memory per idle sandbox now, against `base` (taken with none). */
async function memoryAt(
  lab: Lab,
  base: { info: Meminfo; rss: number },
  count: number,
): Promise<DensityPoint['memory']> {
  if (count === 0) return null;
  await sleep(2000); // let the last machines settle (and deferred frees land)
  const info = meminfo();
  const own = rssKiB() - base.rss;
  const per = (k: string): number => round((info[k]! - base.info[k]!) / count, 1);
  const all = await lab.list();
  const sample = all.filter((_, i) => i % Math.max(1, Math.floor(all.length / 20)) === 0).slice(0, 20);
  const charged = await Promise.all(sample.map(async (b) => (await b.usage()).memoryBytes / 1024));
  for (const b of all) b.close();
  return {
    perSandboxKiB: round((base.info.MemAvailable! - info.MemAvailable! - own) / count, 1),
    cgroupKiB: round(charged.reduce((a, b) => a + b, 0) / Math.max(1, charged.length), 1),
    counters: Object.fromEntries(COUNTERS.map((k) => [k, per(k)])) as Record<(typeof COUNTERS)[number], number>,
  };
}

async function timed<T>(xs: number[], f: () => Promise<T>): Promise<T> {
  const t0 = now();
  const r = await f();
  xs.push(now() - t0);
  return r;
}

/** `--counts`: idle machines at each step, ascending and distinct, 0 allowed. */
export function parseCounts(text: string): number[] {
  const counts = text.split(',').map((t) => Number(t.trim()));
  const ok = counts.every((c, i) => Number.isInteger(c) && c >= 0 && (i === 0 || c > counts[i - 1]!));
  if (!ok || counts.length === 0)
    throw new SnaplabError(
      'BAD_INPUT',
      `--counts ${JSON.stringify(text)}: give whole numbers in ascending order`,
      'e.g. --counts 0,1000,5000,10000',
    );
  return counts;
}

/** `samples` of each operation, with `count` idle machines beside them. */
async function libraryOps(lab: Lab, samples: number, sample: Sampler): Promise<Record<LibraryOp, number[]>> {
  const t: Record<LibraryOp, number[]> = {
    create: [],
    exec: [],
    snapshot: [],
    restore: [],
    list: [],
    rm: [],
    gc: [],
  };
  const probe = await lab.create({ name: PROBE, labels: { bench: 'density-probe' } });
  try {
    for (let i = 0; i < samples; i++)
      await sample('library', async () => {
        const box = await timed(t.create, () => lab.create({ labels: { bench: 'density-probe' } }));
        await timed(t.rm, () => box.destroy());
        const r = await timed(t.exec, () => probe.exec(['/bin/true']));
        if (r.exitCode !== 0) throw new SnaplabError('INTERNAL', `/bin/true exited ${r.exitCode}`, 'see the probe');
        const name = `density-${process.pid}-${i}`;
        await timed(t.snapshot, () => probe.snapshot(name));
        try {
          const back = await timed(t.restore, () => lab.restore(name));
          await back.destroy();
        } finally {
          await lab.removeSnapshot(name);
        }
        await timed(t.list, () => lab.list());
        await timed(t.gc, () => lab.gc());
      });
  } finally {
    await bestEffort('remove the probe', () => probe.destroy());
  }
  return t;
}

/** the library's probe: the machine exec and snapshot are timed on */
export const PROBE = 'density-probe';

/**
 * Runs one sample; one that fails is told of at once and kept with what it said (its trace's
 * phases, read while the bench's home is still there), and the run goes on: at 5 000 idle
 * machines a single timeout must not lose a half-hour ladder. An abort still ends the run.
 */
function sampler(lab: Lab, failures: SampleFailure[], progress: Progress, signal?: AbortSignal): Sampler {
  return async (what, f) => {
    checkAbort(signal);
    try {
      await f();
    } catch (e) {
      if (signal?.aborted || (e instanceof SnaplabError && e.code === 'ABORTED')) throw e;
      const err = e as SnaplabError & { operationId?: string };
      const stored = err.operationId
        ? await lab.trace(err.operationId).catch(orElse(undefined, 'read its trace'))
        : undefined;
      const failure: SampleFailure = {
        what,
        code: err.code ?? 'INTERNAL',
        message: err.message,
        ...(stored ? { trace: renderWaterfall(stored) } : {}),
      };
      failures.push(failure);
      progress.note(
        `a ${what} sample failed: [${failure.code}] ${failure.message}${failure.trace ? `\n${failure.trace}` : ''}`,
      );
    }
  };
}

/** `samples` of each operation, library and fronts, with `count` idle machines beside them. */
async function operations(
  lab: Lab,
  samples: number,
  progress: Progress,
  signal?: AbortSignal,
): Promise<Pick<DensityPoint, 'ms' | 'daemon' | 'failures'>> {
  const failures: SampleFailure[] = [];
  const sample = sampler(lab, failures, progress, signal);
  const t = {
    ...(await libraryOps(lab, samples, sample)),
    poolTake: await poolOps(lab, samples, sample),
    ...(await cliOps(lab.home, samples, sample)),
  };
  const { ms: daemonMs, daemon } = await daemonOps(lab.home, samples, sample, (l) => progress.note(l));
  const ms = Object.fromEntries(
    Object.entries({ ...t, ...daemonMs }).map(([k, xs]) => [k, figures(xs)]),
  ) as DensityPoint['ms'];
  return { ms, daemon, failures };
}

/** Remove every machine and snapshot of the bench's home, `concurrency` at a time, then its home. */
async function clear(lab: Lab, concurrency: number, progress: Progress): Promise<void> {
  if ((await lab.pools().catch(orElse([], "list the bench's pools"))).length)
    await bestEffort('remove the bench pool', () => lab.pool(DENSITY_POOL).remove());
  const all = await lab.list().catch(orElse([], "list the bench's machines"));
  let left = all.length;
  let shown = now();
  const worker = async (): Promise<void> => {
    for (let b = all.pop(); b; b = all.pop()) {
      await bestEffort(`remove ${b.name}`, () => b.destroy());
      left--;
      if (now() - shown > 1000) {
        shown = now();
        progress.note(`removing: ${left} left`);
      }
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  for (const s of await lab.snapshots().catch(orElse([], "list the bench's snapshots")))
    await bestEffort(`remove snapshot ${s.name}`, () => lab.removeSnapshot(s.name));
  await bestEffort('remove the bench image', () => lab.removeImage('busybox', { force: true }));
  await bestEffort('gc the bench home', () => lab.gc());
  const home = lab.home;
  lab.close();
  await bestEffort('remove the bench home', () => rm(home, { recursive: true, force: true }));
}

export async function densityBench(
  o: DensityOptions,
  progress: Progress,
  signal?: AbortSignal,
): Promise<DensitySummary> {
  const startedAt = new Date().toISOString();
  const lab = await Lab.open({ home: mkdtempSync(join(tmpdir(), 'snaplab-bench-density-')) });
  const points: DensityPoint[] = [];
  progress.note(`in ${lab.home} (removed at the end)`);
  try {
    await (await lab.create()).destroy(); // image import, pool mount, the helper: once, untimed
    await lab.createPool({ name: DENSITY_POOL, image: 'busybox', size: 2, limits: {} });
    await sleep(1000);
    const base = { info: meminfo(), rss: rssKiB() };
    let running = 0;
    for (const count of o.counts) {
      const bulk = await fill(lab, count - running, o, progress, signal);
      running = count;
      const memory = await memoryAt(lab, base, count);
      progress.note(`at ${count}: timing ${o.samples} of each operation`);
      const { ms, daemon, failures } = await operations(lab, o.samples, progress, signal);
      const point = { count, loadavg: loadavg().map((l) => round(l)), bulk, memory, ms, daemon, failures };
      points.push(point);
      progress.note(pointLine(point));
    }
  } finally {
    progress.note(`removing the bench's machines`);
    await clear(lab, o.concurrency, progress);
    progress.done();
  }
  return {
    workload: 'density',
    startedAt,
    finishedAt: new Date().toISOString(),
    settings: { ...o, image: 'busybox', cpus: availableParallelism(), memTotalKiB: meminfo().MemTotal! },
    points,
  };
}

/** One count's figures on one line, as soon as they are measured: an interrupted run keeps them in its log. */
const pointLine = (p: DensityPoint): string =>
  `at ${p.count}: p50 ms ${Object.entries(p.ms)
    .map(([k, f]) => `${k} ${ms1(f.p50)}`)
    .join(', ')}` +
  (p.memory ? `; ${p.memory.perSandboxKiB} KiB per idle sandbox (its cgroup ${p.memory.cgroupKiB})` : '') +
  (p.bulk ? `; bulk ${p.bulk.perSecond}/s (unshare ${p.bulk.unsharePerSecond}/s)` : '') +
  (p.daemon ? `; daemon RSS ${p.daemon.rssKiB} KiB` : '') +
  (p.failures.length ? `; ${p.failures.length} sample(s) failed` : '') +
  `; load ${p.loadavg.join(' ')}`;

/** the fronts' columns: what each times */
const FRONT_HEADS: Record<FrontOp, string> = {
  poolTake: 'pool take',
  cliCreate: 'CLI create',
  cliRm: 'CLI rm',
  cliLs: 'CLI ls',
  cliLsJson: 'CLI ls --json',
  cliLsPage: 'CLI ls --limit 100',
  cliLsCount: 'CLI ls --count',
  serve: 'serve, adopted',
  apiPage: 'API list ?limit=100',
  apiList: 'API list',
  apiCount: 'API count',
  apiCreate: 'API create',
  apiEvent: 'API create to ready event',
};

export function renderDensitySummary(s: DensitySummary): string {
  const rows = (ops: readonly (LibraryOp | FrontOp)[]): string[][] =>
    s.points.map((p) => [
      String(p.count),
      ...ops.map((k) => `${ms1(p.ms[k].p50)} / ${ms1(p.ms[k].p95)}`),
      p.loadavg[0]!.toFixed(2),
    ]);
  const memRows = s.points.map((p) => [
    String(p.count),
    p.bulk ? `${p.bulk.perSecond}/s (${p.bulk.made} in ${p.bulk.seconds} s)` : '-',
    p.bulk ? `${p.bulk.unsharePerSecond}/s` : '-',
    p.memory ? String(p.memory.perSandboxKiB) : '-',
    p.memory ? String(p.memory.cgroupKiB) : '-',
    p.daemon ? `${p.daemon.rssKiB} (peak ${p.daemon.peakKiB})` : '-',
    p.memory ? COUNTERS.map((k) => `${k} ${p.memory!.counters[k]}`).join(', ') : '-',
  ]);
  return [
    `workload density: idle busybox sandboxes at ${s.settings.counts.join(', ')}; ${s.settings.samples} samples of each operation at each count; ${s.settings.cpus} CPUs, ${Math.round(s.settings.memTotalKiB / 1024)} MiB`,
    ...pad(['idle', ...LIBRARY_OPS.map((k) => `${k} p50/p95 ms`), 'load'], rows(LIBRARY_OPS)),
    ...pad(['idle', ...FRONT_OPS.map((k) => `${FRONT_HEADS[k]} p50/p95 ms`), 'load'], rows(FRONT_OPS)),
    ...pad(
      [
        'idle',
        'bulk create',
        'unshare (same run)',
        'KiB/sandbox (MemAvailable)',
        'KiB/sandbox (its cgroup)',
        'daemon RSS KiB',
        'meminfo KiB/sandbox',
      ],
      memRows,
    ),
    ...s.points.flatMap((p) =>
      p.failures.map((f) => `at ${p.count}: a ${f.what} sample failed: [${f.code}] ${f.message}`),
    ),
  ].join('\n');
}

/** --results: summary.json and summary.md (the tables) in a directory prepareResultsDir checked. */
export function writeDensityResults(dir: string, s: DensitySummary): string[] {
  const files = [join(dir, 'summary.json'), join(dir, 'summary.md')];
  writeFileSync(files[0]!, `${JSON.stringify(s, null, 2)}\n`);
  writeFileSync(files[1]!, `# snaplab bench --workload density\n\n\`\`\`\n${renderDensitySummary(s)}\n\`\`\`\n`);
  return files;
}
