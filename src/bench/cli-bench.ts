import { DEFAULT_IMAGE } from '../defaults.js';
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { packageRoot } from '../agent/binary.js';
import { which } from '../host/run.js';
import type { Lab } from '../sdk/lab.js';
import type { Sandbox } from '../sdk/sandbox.js';
import { closedLoop } from './loop.js';
import type { Progress } from './progress.js';
import { pad } from './report-text.js';
import { latencySummary, median, type LatencySummary } from './stats.js';
import { noted } from '../cleanup.js';

/** One command line timed as a whole process, the way a shell script runs it. */
interface Case {
  name: string;
  argv: string[];
  env?: NodeJS.ProcessEnv;
  /** also run as parallel loops (create, rm and snapshot change state: serial only) */
  parallel: boolean;
  baseline?: boolean;
  /** run after each timed run, untimed (rm what create made) */
  after?: (i: number) => Promise<void>;
  /** argv for the i-th run (create and snapshot need a new name each time) */
  argvAt?: (i: number) => string[];
}

export interface CliCaseResult {
  name: string;
  argv: string;
  baseline: boolean;
  serialMs?: LatencySummary & { samples: number };
  /** calls per second with `loops` shell loops at once: median over rounds, and the range */
  parallel?: { loops: number; callsPerSecond: number; range: [number, number] };
  errors: string[];
  note?: string;
}

export interface CliBenchSummary {
  workload: 'cli';
  command: string;
  startedAt: string;
  finishedAt: string;
  settings: { rounds: number; serialPerRound: number; loops: number; durationMs: number; lsSandboxes: number };
  cases: CliCaseResult[];
  /** p50 ratios against the same run's baselines */
  ratios: Record<string, number>;
}

export interface CliBenchPlan {
  rounds: number;
  loops: number;
  durationMs: number;
  json: boolean;
}

const SERIAL_PER_ROUND = 10;
const LS_SANDBOXES = 100;
const now = (): number => Number(process.hrtime.bigint()) / 1e6;

/** Spawn argv, wait for its exit: the wall time, or an error naming what it printed. */
function timed(argv: string[], env: NodeJS.ProcessEnv): Promise<number> {
  return new Promise((resolve, reject) => {
    const t0 = now();
    const c = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'ignore', 'pipe'], env });
    let err = '';
    c.stderr!.on('data', (b: Buffer) => (err += b.toString()));
    c.on('error', reject);
    c.on('exit', (code, sig) =>
      code === 0
        ? resolve(now() - t0)
        : reject(new Error(`${argv.join(' ')}: ${sig ?? `exit ${code}`} ${err.trim().slice(0, 200)}`)),
    );
  });
}

type BenchDaemon = { socket: string; stop: () => Promise<void> };
type CaseRuns = { serial: number[]; parallel: number[]; errors: string[] };

/**
 * The command line itself (`snaplab bench --workload cli`): whole processes of `snaplab` as a
 * shell runs them, serially and as parallel loops, beside `node -e 0` (the floor of any Node CLI)
 * and `nsenter -t PID -a /bin/true` (a C tool entering the same sandbox), and LXD's `lxc exec`
 * where it is installed. Cases alternate within each round, so drift falls on all alike.
 */
export async function cliBench(lab: Lab, plan: CliBenchPlan, progress: Progress): Promise<CliBenchSummary> {
  const startedAt = new Date().toISOString();
  const snaplab = (await which('snaplab')) ?? join(packageRoot(), 'native', 'build', 'snaplab');
  const env = { ...process.env, SNAPLAB_HOME: lab.home };
  const tag = `bench-cli-${process.pid}`;
  const made: Sandbox[] = [];
  let daemon: BenchDaemon | undefined;
  try {
    progress.note(
      `raising a sandbox to exec in, one with 100 MB written to snapshot, and ${LS_SANDBOXES} idle ones for ls`,
    );
    const box = await lab.create({ name: `${tag}-exec` });
    made.push(box);
    const filled = await lab.create({ name: `${tag}-fill` });
    made.push(filled);
    await filled.exec(['dd', 'if=/dev/zero', 'of=/root/fill', 'bs=1M', 'count=100']);
    for (let i = 0; i < LS_SANDBOXES - 2; i++) made.push(await lab.create({ name: `${tag}-ls${i}` }));
    const lxc = await which('lxc');
    daemon = await startBenchDaemon(snaplab, env, tag);
    if (daemon) progress.note(`a daemon for the create-through-a-daemon cases: ${daemon.socket}`);
    const cases: Case[] = [
      ...localCases(snaplab, tag, box, env),
      ...(daemon ? daemonCases(snaplab, tag, daemon, env) : []),
      {
        name: 'snaplab snapshot (100 MB written)',
        argv: [],
        argvAt: (i) => [snaplab, 'snapshot', filled.name, '--name', `${tag}-s${i}`],
        after: async (i) => void (await timed([snaplab, 'snapshot', 'rm', `${tag}-s${i}`], env)),
        parallel: false,
      },
    ];
    const results = await runRounds(cases, plan, env, progress);
    const out = [...cases.map((c) => caseResult(c, results.get(c.name)!, plan)), ...skipped(!!daemon, !!lxc)];
    return {
      workload: 'cli',
      command: snaplab,
      startedAt,
      finishedAt: new Date().toISOString(),
      settings: {
        rounds: plan.rounds,
        serialPerRound: SERIAL_PER_ROUND,
        loops: plan.loops,
        durationMs: plan.durationMs,
        lsSandboxes: LS_SANDBOXES,
      },
      cases: out,
      ratios: ratiosOf(out),
    };
  } finally {
    progress.note('removing the bench sandboxes');
    await daemon?.stop();
    for (const b of made) await b.destroy().catch(noted(`remove ${b.name}`));
    for (const b of await lab.list())
      if (b.name.startsWith(`${tag}-`)) await b.destroy().catch(noted(`remove ${b.name}`));
    for (const s of await lab.snapshots())
      if (s.name.startsWith(`${tag}-`)) await lab.removeSnapshot(s.name).catch(noted(`remove snapshot ${s.name}`));
    progress.done();
  }
}

/** The cases of the embedded command line, and their baselines. */
function localCases(snaplab: string, tag: string, box: Sandbox, env: NodeJS.ProcessEnv): Case[] {
  return [
    { name: 'node -e 0', argv: [process.execPath, '-e', '0'], parallel: true, baseline: true },
    { name: 'snaplab --version', argv: [snaplab, '--version'], parallel: true },
    // the Node CLI's own floor: what every command but exec and --version pays
    { name: 'snaplab --help (Node CLI)', argv: [snaplab, '--help'], parallel: true },
    { name: `snaplab ls (${LS_SANDBOXES} sandboxes)`, argv: [snaplab, 'ls'], parallel: true },
    { name: 'snaplab exec -- /bin/true', argv: [snaplab, 'exec', box.name, '--', '/bin/true'], parallel: true },
    {
      name: 'snaplab exec -- /bin/true (Node path)',
      argv: [snaplab, 'exec', box.name, '--', '/bin/true'],
      env: { SNAPLAB_NO_FAST_EXEC: '1' },
      parallel: true,
    },
    {
      name: 'nsenter -t PID -a /bin/true',
      argv: ['nsenter', '-t', String(box.info.pid), '-a', '/bin/true'],
      parallel: true,
      baseline: true,
    },
    {
      name: 'snaplab create (to usable) + rm',
      argv: [],
      argvAt: (i) => [snaplab, 'create', '--name', `${tag}-c${i}`],
      after: async (i) => void (await timed([snaplab, 'rm', `${tag}-c${i}`], env)),
      parallel: false,
    },
  ];
}

/** The cases through a daemon (the C client, the Node CLI, and curl as the baseline). */
function daemonCases(snaplab: string, tag: string, daemon: BenchDaemon, env: NodeJS.ProcessEnv): Case[] {
  const viaDaemon = { SNAPLAB_HOST: `unix:${daemon.socket}` };
  return [
    {
      name: `snaplab ls through a daemon (C client, ${LS_SANDBOXES} sandboxes)`,
      argv: [snaplab, 'ls'],
      env: viaDaemon,
      parallel: true,
    },
    {
      name: 'snaplab create through a daemon (C client) + rm',
      argv: [],
      env: viaDaemon,
      argvAt: (i: number) => [snaplab, 'create', '--name', `${tag}-d${i}`],
      after: async (i: number) => void (await timed([snaplab, 'rm', `${tag}-d${i}`], { ...env, ...viaDaemon })),
      parallel: false,
    },
    {
      name: 'snaplab create through a daemon (Node CLI) + rm',
      argv: [],
      env: { ...viaDaemon, SNAPLAB_NO_FAST: '1' },
      argvAt: (i: number) => [snaplab, 'create', '--name', `${tag}-n${i}`],
      after: async (i: number) => void (await timed([snaplab, 'rm', `${tag}-n${i}`], { ...env, ...viaDaemon })),
      parallel: false,
    },
    {
      // a C client making the same request (the body the command sends): the daemon's create from a shell
      name: 'curl POST /sandboxes + rm',
      argv: [],
      baseline: true,
      argvAt: (i: number) => [
        'curl',
        '-sf',
        '--unix-socket',
        daemon.socket,
        '-X',
        'POST',
        '-H',
        'content-type: application/json',
        '-d',
        JSON.stringify({ image: DEFAULT_IMAGE, name: `${tag}-u${i}`, labels: {}, onTimeout: 'kill' }),
        'http://snaplab/sandboxes',
      ],
      after: async (i: number) => void (await timed([snaplab, 'rm', `${tag}-u${i}`], { ...env, ...viaDaemon })),
      parallel: false,
    },
  ];
}

/** Each round runs every case in turn: serial runs, then parallel loops where the case allows. */
async function runRounds(
  cases: Case[],
  plan: CliBenchPlan,
  env: NodeJS.ProcessEnv,
  progress: Progress,
): Promise<Map<string, CaseRuns>> {
  const results = new Map<string, CaseRuns>(cases.map((c) => [c.name, { serial: [], parallel: [], errors: [] }]));
  let n = 0;
  for (let round = 1; round <= plan.rounds; round++) {
    for (const c of cases) {
      const r = results.get(c.name)!;
      const e = { ...env, ...c.env };
      for (let k = 0; k < SERIAL_PER_ROUND; k++) {
        const i = n++;
        try {
          r.serial.push(await timed(c.argvAt?.(i) ?? c.argv, e));
          await c.after?.(i);
        } catch (err) {
          r.errors.push((err as Error).message);
        }
      }
      if (c.parallel) {
        const loop = await closedLoop(plan.loops, { durationMs: plan.durationMs }, async () => ({
          latencyMs: await timed(c.argv, e),
        }));
        r.parallel.push(loop.latenciesMs.length / (loop.wallMs / 1000));
        r.errors.push(...loop.errors);
      }
      progress.note(
        `round ${round}/${plan.rounds} ${c.name}: p50 ${median(r.serial).toFixed(1)} ms${c.parallel ? `, ${r.parallel.at(-1)!.toFixed(1)} calls/s with ${plan.loops} loops` : ''}`,
      );
    }
  }
  return results;
}

function caseResult(c: Case, r: CaseRuns, plan: CliBenchPlan): CliCaseResult {
  return {
    name: c.name,
    argv: (c.argvAt?.(0) ?? c.argv).join(' ').replace(process.execPath, 'node'),
    baseline: !!c.baseline,
    ...(r.serial.length ? { serialMs: { ...latencySummary(r.serial), samples: r.serial.length } } : {}),
    ...(r.parallel.length
      ? {
          parallel: {
            loops: plan.loops,
            callsPerSecond: round1(median(r.parallel)),
            range: [round1(Math.min(...r.parallel)), round1(Math.max(...r.parallel))] as [number, number],
          },
        }
      : {}),
    errors: r.errors.slice(0, 3),
  };
}

/** The cases this host could not run, each with why. */
function skipped(daemon: boolean, lxc: boolean): CliCaseResult[] {
  const out: CliCaseResult[] = [];
  if (!daemon)
    out.push({
      name: 'snaplab create through a daemon',
      argv: 'SNAPLAB_HOST=unix:SOCKET snaplab create',
      baseline: false,
      errors: [],
      note: 'skipped: a daemon already serves this home (one per home); stop it to measure',
    });
  if (!lxc)
    out.push({
      name: 'lxc exec -- /bin/true',
      argv: 'lxc exec NAME -- /bin/true',
      baseline: true,
      errors: [],
      note: 'skipped: lxc not installed (apt-get install lxd-client, and a running LXD, to measure it)',
    });
  return out;
}

/** p50 ratios against the same run's baselines (those it could measure). */
function ratiosOf(out: CliCaseResult[]): Record<string, number> {
  const p50 = (name: string): number | undefined => out.find((c) => c.name.startsWith(name))?.serialMs?.p50;
  const ratio = (a?: number, b?: number): number | undefined => (a && b ? Math.round((a / b) * 100) / 100 : undefined);
  const ratios: Record<string, number | undefined> = {
    'snaplab --version / node -e 0': ratio(p50('snaplab --version'), p50('node -e 0')),
    'snaplab --help (Node CLI) / node -e 0': ratio(p50('snaplab --help'), p50('node -e 0')),
    'exec / nsenter': ratio(p50('snaplab exec -- /bin/true'), p50('nsenter')),
    'exec Node path / exec': ratio(p50('snaplab exec -- /bin/true (Node path)'), p50('snaplab exec -- /bin/true')),
    'ls through a daemon (C) / ls': ratio(p50('snaplab ls through a daemon'), p50('snaplab ls (')),
    'create through a daemon (C) / create': ratio(
      p50('snaplab create through a daemon (C client)'),
      p50('snaplab create (to usable)'),
    ),
    'create through a daemon (C) / curl': ratio(p50('snaplab create through a daemon (C client)'), p50('curl POST')),
  };
  return Object.fromEntries(Object.entries(ratios).filter((e): e is [string, number] => e[1] !== undefined));
}

/**
 * `snaplab serve` on a socket of its own in the bench's home, for the create-through-a-daemon
 * cases; undefined when one already serves this home (one daemon per home: it would refuse).
 */
async function startBenchDaemon(
  snaplab: string,
  env: NodeJS.ProcessEnv,
  tag: string,
): Promise<BenchDaemon | undefined> {
  const socket = join(env.SNAPLAB_HOME!, `${tag}.sock`);
  const proc = spawn(snaplab, ['serve', '--socket', socket, '--default-timeout', '0'], {
    env,
    stdio: ['ignore', 'pipe', 'ignore'],
  });
  const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
  const ready = await new Promise<boolean>((resolve) => {
    proc.stdout!.once('data', () => resolve(true));
    proc.once('exit', () => resolve(false));
    proc.once('error', () => resolve(false));
  });
  const stop = async (): Promise<void> => {
    proc.kill('SIGTERM');
    await exited;
  };
  if (!ready) return void (await stop());
  return { socket, stop };
}

const round1 = (x: number): number => Math.round(x * 10) / 10;

/** The summary as a table, with the ratios under it. */
export function renderCliSummary(s: CliBenchSummary): string {
  const rows = s.cases.map((c) => [
    `${c.name}${c.baseline ? ' (baseline)' : ''}`,
    c.serialMs ? c.serialMs.p50.toFixed(1) : '-',
    c.serialMs ? c.serialMs.p90.toFixed(1) : '-',
    c.parallel ? `${c.parallel.callsPerSecond} (${c.parallel.range[0]}–${c.parallel.range[1]})` : '-',
    c.note ?? (c.errors.length ? `errors: ${c.errors[0]}` : ''),
  ]);
  const head = ['case', 'p50 ms', 'p90 ms', `calls/s, ${s.settings.loops} loops`, 'note'];
  const ratios = Object.entries(s.ratios).map(([k, v]) => `  ${k}: ${v}`);
  return [
    `workload cli: ${s.command}; ${s.settings.rounds} rounds × ${s.settings.serialPerRound} serial runs per case, then ${s.settings.loops} parallel loops for ${s.settings.durationMs / 1000} s`,
    ...pad(head, rows),
    'p50 ratios (same run):',
    ...ratios,
  ].join('\n');
}
