import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, readFile } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { join } from 'node:path';
import { destroyCgroup } from '../host/cgroups/destroy.js';
import { nspawnCgroup, nspawnCgroupDirs, nspawnRunName } from '../host/cgroups/nspawn.js';
import { processStartTime } from '../host/procs.js';
import { SYSTEMD_PATHS } from '../lab/lifecycle/system.js';
import { run, which } from '../host/run.js';
import type { Arm, LoopLimits } from './baselines.js';
import { closedLoop } from './loop.js';
import { orElse } from '../cleanup.js';

/** SIGRTMIN+3: systemd's "halt" (systemd(1)); Node has no name for it */
const SIGRTMIN_3 = 37;
const HALT_GRACE_MS = 10_000;
const BOOT_TIMEOUT_MS = 120_000;

/** The container's PID 1: systemd-nspawn's child, once it has exec'd systemd. */
async function leaderOf(nspawn: number, end: number, gone: () => boolean): Promise<number> {
  while (Date.now() < end && !gone()) {
    const kids = (
      await readFile(`/proc/${nspawn}/task/${nspawn}/children`, 'utf8').catch(orElse('', 'readFile', 'ENOENT', 'ESRCH'))
    )
      .trim()
      .split(/\s+/)
      .filter(Boolean)
      .map(Number);
    for (const k of kids) {
      if (
        (await readFile(`/proc/${k}/comm`, 'utf8').catch(orElse('', 'readFile', 'ENOENT', 'ESRCH'))).trim() ===
        'systemd'
      )
        return k;
    }
    await sleep(5);
  }
  throw new Error(
    gone() ? 'systemd-nspawn exited before its systemd started' : 'systemd-nspawn started no systemd in time',
  );
}

/** `systemctl is-system-running --wait` inside the container, retried while its systemd is not listening yet. */
async function waitRunning(leader: number, end: number): Promise<string> {
  for (;;) {
    const r = await run('nsenter', ['-t', String(leader), '-a', 'systemctl', 'is-system-running', '--wait'], {
      allowFail: true,
      timeoutMs: Math.max(1, end - Date.now()),
    });
    const state = `${r.stdout}${r.stderr}`.trim().split('\n').pop() ?? '';
    if (state === 'running' || state === 'degraded') return state;
    if (!/^offline$|Failed to connect to bus/.test(state) || Date.now() > end)
      throw new Error(`the container's systemd says ${JSON.stringify(state)}`);
    await sleep(20);
  }
}

/**
 * One boot of `tree` under systemd-nspawn to systemd running: the in-run peer of a system
 * machine's raise (issue #13 asks for it where LXD cannot be installed). The tree is not
 * written: `--volatile=overlay` puts a tmpfs over it, as snaplab's clone keeps the image's tree
 * apart. Its own network namespace, as a machine has. Halted with SIGRTMIN+3 after, outside the
 * time measured (snaplab's raise latency does not hold its destroy either).
 */
async function bootOnce(nspawn: string, tree: string, name: string): Promise<number> {
  const dirs = nspawnCgroupDirs(name);
  const t0 = performance.now();
  let child: ReturnType<typeof spawn> | undefined;
  let exited: Promise<void> = Promise.resolve();
  let leader = 0;
  let done = false;
  try {
    for (const d of dirs) await mkdir(d);
    // the shell joins the run's cgroups, then becomes systemd-nspawn: nothing of it runs outside them
    const enter = dirs.map((d) => `echo $$ > ${d}/cgroup.procs`).join(' && ');
    child = spawn(
      'sh',
      [
        '-c',
        `${enter} && exec "$0" "$@"`,
        nspawn,
        '--quiet',
        '--boot',
        '--register=no',
        '--keep-unit',
        '--private-network',
        '--volatile=overlay',
        '-M',
        name,
        '-D',
        tree,
        '--console=passive',
      ],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
    let err = '';
    child.stderr!.on('data', (b: Buffer) => (err = (err + b.toString()).slice(-2000)));
    exited = new Promise((resolve) => child!.once('exit', () => resolve()));
    let gone = false;
    void exited.then(() => (gone = true));
    const end = Date.now() + BOOT_TIMEOUT_MS;
    leader = await leaderOf(child.pid!, end, () => gone).catch((e: Error) =>
      Promise.reject(new Error(`${e.message}: ${err.trim()}`)),
    );
    await waitRunning(leader, end);
    const ms = performance.now() - t0;
    done = true;
    return ms;
  } finally {
    // halted as a machine is (SIGRTMIN+3) when it came up; a run that failed is killed outright,
    // and its cgroup goes as a machine's does (it throws if something stays)
    if (done && leader) {
      process.kill(leader, SIGRTMIN_3);
      if (child && child.exitCode === null && child.signalCode === null) {
        const killed = setTimeout(() => child!.kill('SIGKILL'), HALT_GRACE_MS);
        await exited;
        clearTimeout(killed);
      }
    }
    await destroyCgroup(nspawnCgroup(name), HALT_GRACE_MS);
    await exited;
  }
}

/** systemd-nspawn --boot of the image's tree, where Debian's systemd-container is installed. */
export async function nspawnArm(tree: string, lim: LoopLimits): Promise<Arm | string> {
  const nspawn = await which('systemd-nspawn');
  if (!nspawn) return 'systemd-nspawn not installed (apt-get install systemd-container to measure it)';
  if (!(await which('nsenter'))) return 'nsenter not found (util-linux)';
  if (!SYSTEMD_PATHS.some((p) => existsSync(join(tree, p)))) return `the image has no systemd (${tree})`;
  let n = 0;
  const start = (await processStartTime(process.pid)) ?? 0;
  return {
    name: 'nspawn',
    note: `systemd-nspawn --boot --volatile=overlay --private-network of the image's tree to is-system-running (${nspawn})`,
    run: (c) =>
      closedLoop(c, lim, async () => ({
        latencyMs: await bootOnce(nspawn, tree, nspawnRunName(process.pid, start, n++)),
      })),
  };
}
