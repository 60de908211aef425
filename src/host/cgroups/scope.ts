import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, rmdir } from 'node:fs/promises';
import { SnaplabError } from '../../errors.js';
import { cgError, errno, poll, readText, writeText } from './fs.js';
import { run } from '../run.js';
import { signal } from '../procs.js';

/**
 * Where snaplab's cgroups live on a host whose PID 1 is systemd (cgroup v2): a scope unit with
 * `Delegate=yes`, `snaplab.scope` in `snaplab.slice`, that holds every sandbox and VM of the host
 * (systemd's CGROUP_DELEGATION.md calls this the "continents" option). Below the root cgroup,
 * which systemd owns, a `systemctl daemon-reload` or another unit's settings could take back what
 * snaplab wrote (a controller in a subtree_control); below a delegated unit they never do, and
 * `systemctl status snaplab.scope`, `systemd-cgls` and a drop-in for snaplab.slice (a MemoryMax=
 * over all sandboxes) work as for any unit.
 *
 * A scope lives while it holds a process, so a keeper (`sleep infinity`, in the leaf `keeper`:
 * the scope itself must hold no process for its subtree to have controllers) holds it; the
 * sandboxes' cgroups are under `snaplab/` beside it. gc stops the keeper once no sandbox is left,
 * and systemd then removes the scope and its empty cgroups. Made with systemd-run, which asks
 * systemd over D-Bus (StartTransientUnit): no D-Bus client in snaplab.
 */

export const SCOPE_UNIT = 'snaplab.scope';
export const SCOPE_SLICE = 'snaplab.slice';
/** The scope's cgroup below the cgroup2 root (systemd's naming, checked against the keeper's own cgroup when made). */
export const SCOPE_PATH = `/${SCOPE_SLICE}/${SCOPE_UNIT}`;
const KEEPER = 'keeper';
const READY_MS = 15_000;

/** Is PID 1 systemd (sd_booted(3): /run/systemd/system exists)? SNAPLAB_CGROUP_SCOPE=0 opts out. */
export function systemdManagesCgroups(): boolean {
  return process.env.SNAPLAB_CGROUP_SCOPE !== '0' && existsSync('/run/systemd/system');
}

async function keeperPids(scopeDir: string): Promise<number[]> {
  return ((await readText(`${scopeDir}/${KEEPER}/cgroup.procs`)) ?? '').split('\n').filter(Boolean).map(Number);
}

const inflight = new Map<string, Promise<void>>();

/**
 * The scope with its keeper in place: made when missing (once per process, and again after gc
 * stopped it); a scope that lost its keeper (killed by hand, or gc racing a create that had
 * already put a sandbox in it) gets a new one.
 */
export function ensureScope(scopeDir: string): Promise<void> {
  let p = inflight.get(scopeDir);
  if (!p) {
    p = makeScope(scopeDir).finally(() => inflight.delete(scopeDir));
    inflight.set(scopeDir, p);
  }
  return p;
}

/**
 * The scope's properties. Delegate=yes: the subtree is snaplab's. TasksMax=infinity: the default
 * (DefaultTasksMax, 15% of the host's threads) would cap all sandboxes together. An OOM kill in a
 * sandbox does not stop the scope: a review feared systemd 252 (Debian 12) would, as it stops a
 * user's session scope (systemd#25376), but the stock-host test shows the scope, its keeper and a
 * neighbour living on after one, also without MemoryAccounting=no (tried in a scratch run); from
 * 253 a delegated scope's OOMPolicy= defaults to continue.
 */
const SCOPE_PROPERTIES = ['Delegate=yes', 'TasksMax=infinity'];

async function makeScope(scopeDir: string): Promise<void> {
  if ((await keeperPids(scopeDir)).length) return;
  const deadline = performance.now() + READY_MS;
  let why = '';
  while (performance.now() < deadline) {
    if (existsSync(scopeDir)) {
      await adoptScope(scopeDir);
      return;
    }
    why = await startScope(scopeDir, deadline);
    if (!why) return;
    await new Promise((r) => setTimeout(r, 100)); // a scope still being stopped: systemd refuses its name until then
  }
  const placed = await run('systemctl', ['show', '-p', 'ControlGroup', '--value', SCOPE_UNIT], {
    allowFail: true,
  }).then(
    (r) => r.stdout.trim(),
    () => '',
  );
  throw new SnaplabError(
    'CGROUP_FAILED',
    `cannot make the systemd scope ${SCOPE_UNIT} for snaplab's cgroups: ${why || 'no keeper appeared'}${placed && placed !== SCOPE_PATH ? ` (systemd put it at ${placed}, not ${SCOPE_PATH})` : ''}`,
    "is systemd running as PID 1 with cgroup v2 (systemctl status)? SNAPLAB_CGROUP_SCOPE=0 puts snaplab's cgroups under the root cgroup instead",
  );
}

/** systemd-run makes the scope around the keeper, which moves itself into its leaf; '' when it is there. */
async function startScope(scopeDir: string, deadline: number): Promise<string> {
  const script = `d=/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup) && mkdir -p "$d/${KEEPER}" && echo $$ > "$d/${KEEPER}/cgroup.procs" && exec sleep infinity 2>/dev/null`;
  const args = [
    '--scope',
    '--quiet',
    '--collect',
    `--unit=${SCOPE_UNIT}`,
    `--slice=${SCOPE_SLICE}`,
    ...SCOPE_PROPERTIES.map((p) => `--property=${p}`),
    '--description=snaplab sandboxes and VMs (gc stops it when none is left)',
    '--',
    'sh',
    '-c',
    script,
  ];
  // cwd /: the keeper lives on, and must not hold the caller's directory (a mount) busy
  const child = spawn('systemd-run', args, { detached: true, cwd: '/', stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  let exited: number | null | undefined;
  child.stderr!.on('data', (b: Buffer) => (stderr += b.toString()));
  child.on('exit', (code) => (exited = code));
  child.on('error', (e) => {
    stderr += e.message;
    exited = -1;
  });
  child.unref();
  // systemd-run execs the keeper: an exit is a refusal (another process made the scope first, or
  // one is still being stopped), and the loop above looks again
  await poll(
    async () => exited !== undefined || (await keeperPids(scopeDir)).length > 0,
    Math.max(0, deadline - performance.now()),
  );
  child.stderr!.destroy();
  if ((await keeperPids(scopeDir)).length) return '';
  return `systemd-run ${exited === undefined ? 'made no keeper' : `exited ${exited}`}: ${stderr.trim()}`;
}

/** A scope that is there without a keeper: a new keeper, put in its leaf by us. */
async function adoptScope(scopeDir: string): Promise<void> {
  await mkdir(`${scopeDir}/${KEEPER}`, { recursive: true });
  const keeper = spawn('sleep', ['infinity'], { detached: true, cwd: '/', stdio: 'ignore' });
  keeper.unref();
  try {
    await writeText(`${scopeDir}/${KEEPER}/cgroup.procs`, String(keeper.pid));
  } catch (e) {
    keeper.kill('SIGKILL');
    throw cgError(`cannot put a keeper in the systemd scope ${SCOPE_UNIT} at ${scopeDir}`, e);
  }
}

/**
 * Stop the scope when it holds no sandbox (gc, test teardown): its `snaplab/` parent removed, the
 * keeper killed; systemd then removes the scope. A create racing with this either finds the
 * scope gone and makes it again, or has put its sandbox in first, and the next create gives the
 * scope a new keeper (adoptScope); a create whose empty cgroup systemd removed in between fails
 * with ENOENT and leaves nothing.
 */
export async function stopScopeIfIdle(scopeDir: string): Promise<void> {
  try {
    await rmdir(`${scopeDir}/snaplab`);
  } catch (e) {
    if (errno(e) !== 'ENOENT') return; // EBUSY: sandboxes live there
  }
  const pids = await keeperPids(scopeDir);
  for (const p of pids) signal(p, 'SIGKILL');
  await poll(async () => !existsSync(scopeDir), 5000);
}
