import { spawn } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { run, which } from '../host/run.js';
import { closedLoop, type LoopResult } from './loop.js';
import { failureMeans } from '../cleanup.js';

export const BASELINES = ['bare-spawn', 'raw-namespace', 'runc', 'lxc'] as const;
/** what a scenario reset replaces */
export const SCENARIO_BASELINES = ['no-standby', 'down+up'] as const;
/** what a system machine's raise (--init systemd) is measured against: the same tree booted by systemd-nspawn */
export const SYSTEM_BASELINES = ['nspawn'] as const;
/** what a restore replaces: booting the same machine to usable */
export const RESTORE_BASELINES = ['boot', ...BASELINES] as const;
export type BaselineName =
  | (typeof RESTORE_BASELINES)[number]
  | (typeof SCENARIO_BASELINES)[number]
  | (typeof SYSTEM_BASELINES)[number];

export interface LoopLimits {
  durationMs: number;
  count?: number;
}

/** Something measured on every rung of the ladder beside the workload. */
export interface Arm {
  name: string;
  note?: string;
  run(concurrency: number): Promise<LoopResult>;
  dispose?(): Promise<void>;
}

/** Spawn cmd args to exit 0, `concurrency` at a time, in a closed loop. */
export function spawnLoop(concurrency: number, lim: LoopLimits, cmd: string, args: string[]): Promise<LoopResult> {
  return closedLoop(
    concurrency,
    lim,
    () =>
      new Promise<undefined>((resolve, reject) => {
        const c = spawn(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'] });
        let err = '';
        c.stderr!.on('data', (b: Buffer) => (err += b.toString()));
        c.on('error', reject);
        c.on('exit', (code, sig) =>
          code === 0 ? resolve(undefined) : reject(new Error(`${cmd}: ${sig ?? `exit ${code}`} ${err.trim()}`)),
        );
      }),
  );
}

/** The bare host spawning the same argv with the same concurrency: the limit for `exec`. */
export function bareSpawn(argv: string[], lim: LoopLimits): Arm {
  return {
    name: 'bare-spawn',
    note: 'node child_process.spawn on the host',
    run: (c) => spawnLoop(c, lim, argv[0]!, argv.slice(1)),
  };
}

/** The same namespaces and argv, chrooted into the image, with no snaplab: the limit for `fresh-exec`. */
export function rawNamespace(argv: string[], rootfs: string, lim: LoopLimits): Arm {
  const args = ['--fork', '--pid', '--mount', '--uts', '--ipc', '--net', `--root=${rootfs}`, ...argv];
  return {
    name: 'raw-namespace',
    note: 'unshare --fork --pid --mount --uts --ipc --net --root=<busybox rootfs>',
    run: (c) => spawnLoop(c, lim, 'unshare', args),
  };
}

/** runc, when installed: a bundle on the busybox rootfs (read-only), one `runc run` per operation. */
export async function runcArm(argv: string[], rootfs: string, lim: LoopLimits): Promise<Arm | string> {
  const runc = await which('runc');
  if (!runc) return 'runc not installed (apt-get install runc to measure it)';
  const dir = await mkdtemp(join(tmpdir(), 'snaplab-bench-runc-'));
  try {
    await run(runc, ['spec', '--bundle', dir]);
    const spec = JSON.parse(await readFile(join(dir, 'config.json'), 'utf8')) as {
      root: { path: string; readonly: boolean };
      process: { args: string[]; terminal: boolean };
    };
    spec.root = { path: rootfs, readonly: true };
    spec.process.args = argv;
    spec.process.terminal = false;
    await writeFile(join(dir, 'config.json'), JSON.stringify(spec));
  } catch (e) {
    await rm(dir, { recursive: true, force: true });
    return `runc spec failed: ${(e as Error).message}`;
  }
  let n = 0;
  const state = join(dir, 'state');
  return {
    name: 'runc',
    note: `runc run of a bundle on the busybox rootfs (${runc})`,
    run: (c) =>
      closedLoop(c, lim, () =>
        run(runc, ['--root', state, 'run', '--bundle', dir, `snaplab-bench-${process.pid}-${n++}`]).then(
          () => undefined,
        ),
      ),
    dispose: () => rm(dir, { recursive: true, force: true }),
  };
}

/** LXD, when `lxc info` answers quickly: `lxc exec` in one running container (a peer for exec). */
export async function lxcArm(argv: string[], lim: LoopLimits): Promise<Arm | string> {
  if (!(await which('lxc'))) return 'lxc (LXD) not installed';
  const info = await run('lxc', ['info'], { allowFail: true, timeoutMs: 2000 }).catch(failureMeans(undefined));
  if (info?.code !== 0) return 'lxc installed but `lxc info` does not answer';
  const image = process.env.SNAPLAB_BENCH_LXC_IMAGE ?? 'images:alpine/edge';
  const name = `snaplab-bench-${process.pid}`;
  const launched = await run('lxc', ['launch', image, name, '--ephemeral'], {
    allowFail: true,
    timeoutMs: 120_000,
  }).catch((e: Error) => ({ code: 1, stderr: e.message }));
  if (launched.code !== 0) return `lxc launch ${image} failed (set SNAPLAB_BENCH_LXC_IMAGE): ${launched.stderr.trim()}`;
  return {
    name: 'lxc',
    note: `lxc exec in a running ${image} container`,
    run: (c) => spawnLoop(c, lim, 'lxc', ['exec', name, '--', ...argv]),
    dispose: async () => void (await run('lxc', ['stop', name, '--force'], { allowFail: true })),
  };
}
