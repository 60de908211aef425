import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { readFile, rmdir } from 'node:fs/promises';
import { SnaplabError } from '../errors.js';
import { cgError, errno, poll, readText } from './cgroups-fs.js';
import { signal } from './procs.js';

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

/** The scope, made when missing (its keeper in place): once per process, and again after gc stopped it. */
export function ensureScope(scopeDir: string): Promise<void> {
  let p = inflight.get(scopeDir);
  if (!p) {
    p = makeScope(scopeDir).finally(() => inflight.delete(scopeDir));
    inflight.set(scopeDir, p);
  }
  return p;
}

async function makeScope(scopeDir: string): Promise<void> {
  if ((await keeperPids(scopeDir)).length) return;
  // the keeper moves itself into its leaf before it sleeps; two creates at once both try, and
  // systemd refuses the second ("unit already exists"): both then wait for the one keeper
  const script = `d=/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup) && mkdir -p "$d/${KEEPER}" && echo $$ > "$d/${KEEPER}/cgroup.procs" && exec sleep infinity 2>/dev/null`;
  const args = ['--scope', '--quiet', '--collect', `--unit=${SCOPE_UNIT}`, `--slice=${SCOPE_SLICE}`, '--property=Delegate=yes',
    '--description=snaplab sandboxes and VMs (gc stops it when none is left)', '--', 'sh', '-c', script];
  const child = spawn('systemd-run', args, { detached: true, stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  let exited: number | null | undefined;
  child.stderr!.on('data', (b: Buffer) => (stderr += b.toString()));
  child.on('exit', (code) => (exited = code));
  child.on('error', (e) => {
    stderr += e.message;
    exited = -1;
  });
  child.unref();
  const ready = await poll(async () => (await keeperPids(scopeDir)).length > 0, READY_MS);
  child.stderr!.destroy();
  if (!ready) {
    throw new SnaplabError('CGROUP_FAILED', `cannot make the systemd scope ${SCOPE_UNIT} for snaplab's cgroups${exited !== undefined ? ` (systemd-run exited ${exited})` : ''}: ${stderr.trim() || 'no keeper appeared in ' + scopeDir}`,
      `is systemd running as PID 1 with cgroup v2 (systemctl status)? SNAPLAB_CGROUP_SCOPE=0 puts snaplab's cgroups under the root cgroup instead`);
  }
  const [pid] = await keeperPids(scopeDir);
  const own = await readFile(`/proc/${pid}/cgroup`, 'utf8').catch(() => '');
  if (!own.includes(`0::${SCOPE_PATH}/${KEEPER}`)) {
    throw cgError(`the systemd scope ${SCOPE_UNIT} is not at ${scopeDir} (its keeper is in ${own.trim()}); this systemd names cgroups differently`);
  }
}

/**
 * Stop the scope when it holds no sandbox (gc, test teardown): its `snaplab/` parent removed, the
 * keeper killed; systemd then removes the scope. A create racing with this finds the parent gone
 * and makes the scope again.
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
