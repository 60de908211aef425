import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import {
  cgroupFor,
  createCgroup,
  destroyCgroup,
  detectCgroups,
  freeze,
  isFrozen,
  listSnaplabCgroups,
  oomKills,
  pids,
  probeCgroups,
  removeEmptySnaplabParents,
  snaplabCgroupsOnHost,
  stats,
  thaw,
  type Cgroup,
} from './cgroups.js';
import { pidAlive, readStat, waitGone } from '../procs.js';

// Real kernel, no mocks. Runs against the default root (v1 here, v2 on most hosts) and, on a
// hybrid host, against its unified cgroup2 mount as well (controllers absent there).
const layout = detectCgroups();
const roots: { name: string; root: string }[] = [{ name: `default root (v${layout.version})`, root: layout.root }];
if (layout.version === 1 && layout.unified) roots.push({ name: 'unified cgroup2 mount', root: layout.unified });

const MiB = 1024 * 1024;
const made: Cgroup[] = [];
const children: ChildProcess[] = [];
let seq = 0;
const newId = (): string => `test-${process.pid}-${++seq}`;

async function make(root: string, limits = {}): Promise<Cgroup> {
  const cg = cgroupFor(newId(), { root });
  made.push(cg);
  return createCgroup(cg.id, limits, { root });
}

/** Start `cmd` (sh syntax) already inside the cgroup: sh joins every hierarchy, then execs. */
function spawnIn(cg: Cgroup, cmd: string): ChildProcess {
  const script = `for f in "$@"; do echo $$ > "$f" || exit 99; done; exec ${cmd}`;
  const child = spawn('sh', ['-c', script, 'sh', ...cg.procsFiles], { stdio: ['ignore', 'ignore', 'pipe'] });
  children.push(child);
  return child;
}

function exited(child: ChildProcess): Promise<{ code: number | null; signal: string | null; stderr: string }> {
  let stderr = '';
  child.stderr?.on('data', (b: Buffer) => (stderr += b.toString()));
  return new Promise((resolve) => child.on('close', (code, signal) => resolve({ code, signal, stderr })));
}

async function sleeperIn(cg: Cgroup): Promise<number> {
  const child = spawn('sleep', ['60'], { stdio: 'ignore' });
  children.push(child);
  const pid = child.pid!;
  for (const f of cg.procsFiles) await writeFile(f, String(pid));
  return pid;
}

const read = async (p: string): Promise<string> => (await readFile(p, 'utf8')).trim();

afterEach(async () => {
  for (const cg of made.splice(0)) await destroyCgroup(cg);
  for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});

afterAll(async () => {
  const left = (await listSnaplabCgroups()).filter((id) => id.startsWith(`test-${process.pid}-`));
  expect(left).toEqual([]);
  await removeEmptySnaplabParents();
});

it('probes this host', async () => {
  const p = await probeCgroups();
  expect(p.version).toBe(layout.version);
  expect(p.ok, p.reason).toBe(true);
});

describe.each(roots)('on the $name', ({ root }) => {
  const v = detectCgroups(root).version;
  const has = (c: string): boolean => detectCgroups(root).controllers.includes(c);

  it('creates with limits; files hold them, or the reason they were skipped', async () => {
    const cg = await make(root, { memoryBytes: 64 * MiB, pids: 5, cpus: 0.5 });
    for (const d of cg.dirs) expect(existsSync(d)).toBe(true);
    const { memory, pids: p, cpu } = cg.controllerDirs;
    if (v === 1) {
      expect(await read(`${memory}/memory.limit_in_bytes`)).toBe(String(64 * MiB));
      if (existsSync(`${memory}/memory.memsw.limit_in_bytes`)) {
        expect(await read(`${memory}/memory.memsw.limit_in_bytes`)).toBe(String(64 * MiB));
      }
      expect(await read(`${p}/pids.max`)).toBe('5');
      expect(await read(`${cpu}/cpu.cfs_quota_us`)).toBe('50000');
    } else {
      if (memory) expect(await read(`${memory}/memory.max`)).toBe(String(64 * MiB));
      if (p) expect(await read(`${p}/pids.max`)).toBe('5');
      if (cpu) expect(await read(`${cpu}/cpu.max`)).toBe('50000 100000');
      for (const c of ['memory', 'pids', 'cpu'] as const) {
        if (!has(c)) expect(cg.skipped.join('\n')).toMatch(new RegExp(`the ${c} controller is not available`));
      }
    }
    await expect(createCgroup(cg.id, {}, { root })).rejects.toMatchObject({ code: 'CGROUP_FAILED' });
  });

  it('lists a moved-in process, reports stats, and destroy kills it and removes the dirs', async () => {
    const cg = await make(root);
    const pid = await sleeperIn(cg);
    expect(await pids(cg)).toEqual([pid]);
    const s = await stats(cg);
    expect(s.cpuUsec).toBeGreaterThanOrEqual(0);
    if (has('pids')) expect(s.pids).toBe(1);
    expect(await listSnaplabCgroups()).toContain(cg.id);
    expect((await snaplabCgroupsOnHost()).find((c) => c.id === cg.id && c.root === cg.root)?.dirs).toEqual(cg.dirs);
    await destroyCgroup(cg);
    expect(await waitGone(pid, 1000)).toBe(true);
    for (const d of cg.dirs) expect(existsSync(d)).toBe(false);
    expect(await listSnaplabCgroups()).not.toContain(cg.id);
    await destroyCgroup(cg); // idempotent
  });

  it('freezes and thaws', async () => {
    const cg = await make(root);
    const child = spawnIn(cg, 'sh -c "while :; do :; done"');
    await expect.poll(() => pids(cg)).toHaveLength(1);
    await freeze(cg);
    expect(await isFrozen(cg)).toBe(true);
    if (v === 1) expect(await read(`${cg.controllerDirs.freezer}/freezer.state`)).toBe('FROZEN');
    else expect(await read(`${cg.dirs[0]}/cgroup.events`)).toMatch(/^frozen 1$/m);
    const before = (await stats(cg)).cpuUsec!;
    await new Promise((r) => setTimeout(r, 100));
    expect((await stats(cg)).cpuUsec).toBe(before); // a frozen busy loop uses no CPU
    expect((await readStat(child.pid!))?.state).not.toBe('R');
    await thaw(cg);
    expect(await isFrozen(cg)).toBe(false);
    await expect.poll(async () => (await stats(cg)).cpuUsec!).toBeGreaterThan(before);
  });

  it('destroys nested cgroups a sandbox made inside its own', async () => {
    const cg = await make(root);
    for (const d of cg.dirs) await mkdir(`${d}/inner`);
    const child = spawn('sleep', ['60'], { stdio: 'ignore' });
    children.push(child);
    for (const d of cg.dirs) await writeFile(`${d}/inner/cgroup.procs`, String(child.pid));
    expect(await pids(cg)).toEqual([child.pid]);
    await destroyCgroup(cg);
    expect(await pidAlive(child.pid!)).toBe(false);
    for (const d of cg.dirs) expect(existsSync(d)).toBe(false);
  });

  it('destroys a frozen cgroup', async () => {
    const cg = await make(root);
    const pid = await sleeperIn(cg);
    await freeze(cg);
    await destroyCgroup(cg);
    expect(await pidAlive(pid)).toBe(false);
    for (const d of cg.dirs) expect(existsSync(d)).toBe(false);
  });

  it.runIf(has('memory'))('OOM-kills a memory hog instead of letting it grow', async () => {
    const cg = await make(root, { memoryBytes: 64 * MiB });
    expect(oomKills(cg)).toBe(0);
    // dd allocates one 300 MB buffer and fills it from /dev/zero: anonymous memory, no page cache
    const r = await exited(spawnIn(cg, 'dd if=/dev/zero of=/dev/null bs=300M count=1'));
    expect(r.signal).toBe('SIGKILL');
    expect(oomKills(cg)).toBeGreaterThanOrEqual(1);
  });

  it.runIf(has('pids'))('refuses forks beyond the pids limit', async () => {
    const cg = await make(root, { pids: 5 });
    const r = await exited(spawnIn(cg, 'sh -c "for i in 1 2 3 4 5 6 7 8; do sleep 60 2>/dev/null & done; wait"'));
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/fork/i);
    expect((await pids(cg)).length).toBeLessThanOrEqual(5);
    expect((await pids(cg)).length).toBeGreaterThan(0);
  });
});

it('rejects bad ids and limits', async () => {
  expect(() => cgroupFor('../etc')).toThrow(/bad cgroup id/);
  await expect(createCgroup(newId(), { memoryBytes: -1 })).rejects.toMatchObject({ code: 'BAD_INPUT' });
});
