/**
 * The density bench's fronts (issue #34, docs/benchmarks.md "Density"): at each count, beside the
 * idle machines, the CLI as whole processes (`snaplab create`, `rm`, `ls`, `ls --json`, `ls --limit
 * 100`, `ls --count`, with the bench's home as SNAPLAB_HOME), the daemon (`snaplab serve` on that
 * home: until it answers with every machine adopted; then the API's list, paged and whole, and its
 * count (GET /counts/sandboxes), through the project's client, and
 * a create through the API until its `ready` event arrives on `GET /events`), and a pool take
 * (`lab.create({ pool })` from a pool of 2). Each front stops what it started, also on a failure.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import { promisify } from 'node:util';
import { packageRoot } from '../agent/binary.js';
import { bestEffort, noted } from '../cleanup.js';
import { RemoteLab } from '../client/remote.js';
import { SnaplabError } from '../errors.js';
import type { Lab } from '../sdk/lab.js';

const run = promisify(execFile);
const now = (): number => performance.now();

/** the worktree's own command (its build), never another install on PATH */
export const snaplabCommand = (): string => join(packageRoot(), 'native', 'build', 'snaplab');

/** the pool the bench keeps in its home (2 standbys), made once before the first count */
export const DENSITY_POOL = 'density';

/** a sample that failed, and what it said (density-bench.ts's sampler) */
export interface SampleFailure {
  /** the group of operations the sample was in: library, pool, cli, serve, api */
  what: string;
  code: string;
  message: string;
  /** its stored trace's phases, when it had one */
  trace?: string;
}

/** Runs one sample of a group; one that fails is recorded and the run goes on (an abort ends it). */
export type Sampler = (what: string, f: () => Promise<void>) => Promise<void>;

export type CliOp = 'cliCreate' | 'cliRm' | 'cliLs' | 'cliLsJson' | 'cliLsPage' | 'cliLsCount';
export type DaemonOp = 'serve' | 'apiPage' | 'apiList' | 'apiCount' | 'apiCreate' | 'apiEvent';
export type FrontOp = CliOp | DaemonOp | 'poolTake';
export const FRONT_OPS: FrontOp[] = [
  'poolTake',
  'cliCreate',
  'cliRm',
  'cliLs',
  'cliLsJson',
  'cliLsPage',
  'cliLsCount',
  'serve',
  'apiPage',
  'apiList',
  'apiCount',
  'apiCreate',
  'apiEvent',
];

function benchEnv(home: string): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, SNAPLAB_HOME: home };
  // the CLI acts on the bench's home itself, never through a daemon named elsewhere
  delete env.SNAPLAB_HOST;
  delete env.SNAPLAB_TOKEN;
  return env;
}

async function cli(home: string, args: string[]): Promise<string> {
  try {
    return (await run(snaplabCommand(), args, { env: benchEnv(home), maxBuffer: 1 << 28 })).stdout;
  } catch (e) {
    throw new SnaplabError(
      'INTERNAL',
      `snaplab ${args.join(' ')} failed in the density bench: ${(e as { stderr?: string }).stderr ?? (e as Error).message}`,
      `run it by hand with SNAPLAB_HOME=${home}`,
      { cause: e },
    );
  }
}

async function timed<T>(xs: number[], f: () => Promise<T>): Promise<T> {
  const t0 = now();
  const r = await f();
  xs.push(now() - t0);
  return r;
}

/** `samples` of each CLI command as a whole process (node's start included, as a user pays it). */
export async function cliOps(home: string, samples: number, sample: Sampler): Promise<Record<CliOp, number[]>> {
  const t: Record<CliOp, number[]> = {
    cliCreate: [],
    cliRm: [],
    cliLs: [],
    cliLsJson: [],
    cliLsPage: [],
    cliLsCount: [],
  };
  for (let i = 0; i < samples; i++)
    await sample('cli', async () => {
      const made = JSON.parse(
        await timed(t.cliCreate, () => cli(home, ['create', '--json', '--label', 'bench=density-probe'])),
      ) as { name: string };
      await timed(t.cliRm, () => cli(home, ['rm', made.name]));
      await timed(t.cliLs, () => cli(home, ['ls']));
      await timed(t.cliLsJson, () => cli(home, ['ls', '--json']));
      // the forms that need not grow with the count: a page, and a count by state
      await timed(t.cliLsPage, () => cli(home, ['ls', '--limit', '100']));
      await timed(t.cliLsCount, () => cli(home, ['ls', '--count']));
    });
  return t;
}

/** `samples` takes from the bench's pool of 2, each refilled (untimed) before the next. */
export async function poolOps(lab: Lab, samples: number, sample: Sampler): Promise<number[]> {
  const xs: number[] = [];
  const pool = lab.pool(DENSITY_POOL);
  for (let i = 0; i < samples; i++)
    await sample('pool', async () => {
      await pool.fill();
      const box = await timed(xs, () => lab.create({ pool: DENSITY_POOL, labels: { bench: 'density-probe' } }));
      await box.destroy();
    });
  await sample('pool', () => pool.fill());
  return xs;
}

/** A daemon on the bench's home, up once it logs that it listens (after it adopted what is there). */
async function startDaemon(home: string, socket: string): Promise<ChildProcess> {
  const child = spawn(snaplabCommand(), ['serve', '--socket', socket], {
    env: benchEnv(home),
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let log = '';
  try {
    await new Promise<void>((up, failed) => {
      child.stderr!.on('data', (b: Buffer) => {
        log = (log + b.toString()).slice(-4000); // its request log flows here as long as it runs: the end is kept
        if (/ listening /.test(log)) up();
      });
      child.once('error', failed);
      child.once('exit', (code) => failed(new Error(`it exited (${code}) before it listened: ${log.slice(-2000)}`)));
    });
  } catch (e) {
    await stopDaemon(child);
    throw new SnaplabError('DAEMON_ERROR', `snaplab serve on the bench home: ${(e as Error).message}`, 'see its log', {
      cause: e,
    });
  }
  child.stderr!.resume(); // its request log is not read: let it flow
  return child;
}

async function stopDaemon(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const gone = once(child, 'exit');
  child.kill('SIGTERM');
  const late = setTimeout(() => child.kill('SIGKILL'), 20_000);
  await gone;
  clearTimeout(late);
}

/** the daemon's memory with every machine adopted and the API timed (VmRSS and VmHWM of its process) */
export interface DaemonMemory {
  rssKiB: number;
  peakKiB: number;
}

function daemonMemory(pid: number): DaemonMemory {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (k: string): number =>
    Number.parseInt(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? 'NaN', 10);
  return { rssKiB: kib('VmRSS'), peakKiB: kib('VmHWM') };
}

/** The `ready` events of `GET /events` from now on: when the one of a sandbox of this name arrived. */
function readyEvents(res: Readable): { see(name: string): Promise<number> } {
  const waiting = new Map<string, (at: number) => void>();
  const arrived = new Map<string, number>();
  let buf = '';
  res.on('data', (b: Buffer) => {
    buf += b.toString();
    for (let end = buf.indexOf('\n\n'); end >= 0; end = buf.indexOf('\n\n')) {
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      if (!/^event: ready$/m.test(block)) continue;
      const { name } = JSON.parse(block.split('\ndata: ')[1]!) as { name: string };
      arrived.set(name, now());
      waiting.get(name)?.(now());
    }
  });
  const see = (name: string): Promise<number> =>
    arrived.has(name)
      ? Promise.resolve(arrived.get(name)!)
      : new Promise((seen, failed) => {
          const late = setTimeout(
            () =>
              failed(
                new SnaplabError(
                  'TIMEOUT',
                  `no ready event for ${name} in 60 s`,
                  "read the daemon's GET /events by hand",
                ),
              ),
            60_000,
          );
          waiting.set(name, (at) => {
            clearTimeout(late);
            seen(at);
          });
        });
  return { see };
}

/**
 * `samples` starts of a daemon on the bench's home (each until it answers, every machine adopted),
 * and with the last one up: the API's first page of 100 and whole list, and a create through the
 * API with the time until its `ready` event arrives, then the daemon's memory (null when that
 * sample failed). The daemon is stopped at the end, always.
 */
export async function daemonOps(
  home: string,
  samples: number,
  sample: Sampler,
  note: (line: string) => void,
): Promise<{ ms: Record<DaemonOp, number[]>; daemon: DaemonMemory | null }> {
  const t: Record<DaemonOp, number[]> = {
    serve: [],
    apiPage: [],
    apiList: [],
    apiCount: [],
    apiCreate: [],
    apiEvent: [],
  };
  let daemon: DaemonMemory | null = null;
  const socket = join(home, 'd.sock');
  for (let i = 0; i < samples; i++)
    await sample('serve', async () => {
      const t0 = now();
      const child = await startDaemon(home, socket);
      const remote = new RemoteLab({ url: `unix:${socket}` });
      const events = new AbortController();
      try {
        await remote.health();
        t.serve.push(now() - t0);
        note(`a daemon on the bench home answers, every machine adopted, in ${Math.round(now() - t0)} ms`);
        if (i === samples - 1) {
          await apiOps(remote, samples, t, events.signal, sample);
          daemon = daemonMemory(child.pid!);
          note(`the daemon holds ${daemon.rssKiB} KiB (its peak ${daemon.peakKiB} KiB)`);
        }
      } finally {
        events.abort();
        remote.close();
        await bestEffort('stop the bench daemon', () => stopDaemon(child));
      }
    });
  return { ms: t, daemon };
}

async function apiOps(
  remote: RemoteLab,
  samples: number,
  t: Record<DaemonOp, number[]>,
  signal: AbortSignal,
  sample: Sampler,
): Promise<void> {
  const stream = await remote.transport.stream('GET', '/events', { signal });
  stream.on('error', noted("read the bench daemon's events", 'ABORT_ERR', 'ECONNRESET')); // ended by the abort
  const ready = readyEvents(stream);
  for (let i = 0; i < samples; i++)
    await sample('api', async () => {
      await timed(t.apiPage, () => remote.list({ limit: 100 }));
      await timed(t.apiList, () => remote.list());
      await timed(t.apiCount, () => remote.count());
      const name = `density-api-${process.pid}-${i}`;
      const t0 = now();
      const box = await remote.create({ name, labels: { bench: 'density-probe' } });
      try {
        t.apiCreate.push(now() - t0);
        t.apiEvent.push((await ready.see(name)) - t0);
      } finally {
        await box.destroy(); // also when its event did not come: the idle count stays what it says
      }
    });
}
