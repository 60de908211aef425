/**
 * A machine is declared dead only on evidence. A process out of file descriptors reads EMFILE
 * from /proc; that once read as "its init is gone": a daemon flooded to its fd limit recorded
 * every sandbox of the host dead and removed a running VM's RAM file (issue 30). Here the
 * reconciling process is a real one, under `prlimit --nofile`, that fills its table before it
 * lists and collects: the machines it cannot see must stay running, with every file they use.
 */
import { spawn, spawnSync } from 'node:child_process';
import Database from 'better-sqlite3';
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { ramPrefix } from '../src/drivers/qemu/ram.js';
import { snaplabCgroupsOnHost } from '../src/host/cgroups/host.js';
import { cgroupFor, isFrozen } from '../src/host/cgroups/cgroups.js';
import { SNAPLAB } from './cli-command.js';
import type { Lab } from '../src/sdk/lab.js';
import type { Sandbox } from '../src/sdk/sandbox.js';
import { disposeLab, testLab } from './helpers.js';

let lab: Lab;
let box: Sandbox;
let vm: Sandbox;
beforeAll(async () => {
  lab = await testLab();
  box = await lab.create({ image: 'busybox', name: 'plain' });
  vm = await lab.create({ driver: 'qemu', name: 'vm' });
}, 240_000);
afterAll(async () => {
  await disposeLab(lab);
}, 120_000);

// the built library (npm test builds first) in a process whose fd table is full when it reconciles
const SCRIPT = `
  import { closeSync, openSync } from 'node:fs';
  import { Lab } from ${JSON.stringify(join(import.meta.dirname, '..', 'dist', 'sdk', 'index.js'))};
  const lab = await Lab.open({ home: process.env.SNAPLAB_HOME });
  await lab.list(); // the store and whatever else the lab opens lazily are open now
  const held = [];
  for (;;) {
    try { held.push(openSync('/dev/null', 'r')); } catch (e) { if (e.code === 'EMFILE') break; throw e; }
  }
  const out = { held: held.length };
  out.list = (await lab.list()).map((b) => [b.name, b.state, b.reason]);
  out.gc = await lab.gc().then((r) => r.removed, (e) => 'failed: ' + (e.code ?? '') + ' ' + e.message);
  out.after = (await lab.list()).map((b) => [b.name, b.state]);
  for (const fd of held) closeSync(fd);
  lab.close();
  process.stdout.write(JSON.stringify(out));
`;

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const ramFiles = (): string[] => readdirSync('/dev/shm').filter((n) => n.startsWith(ramPrefix(lab.home)));

it('procfs reads failing with EMFILE leave running machines running, with their files', async () => {
  const ram = ramFiles();
  expect(ram).toHaveLength(1);
  const r = spawnSync('prlimit', ['--nofile=200', process.execPath, '--input-type=module', '-e', SCRIPT], {
    env: { ...process.env, SNAPLAB_HOME: lab.home },
    encoding: 'utf8',
    timeout: 120_000,
  });
  expect(r.status, r.stderr).toBe(0);
  const out = JSON.parse(r.stdout) as { held: number; list: string[][]; gc: unknown; after: string[][] };
  expect(out.held).toBeGreaterThan(100);
  // it could not tell, said so, and changed nothing
  expect(out.list.map(([name, state]) => [name, state])).toEqual([
    ['plain', 'running'],
    ['vm', 'running'],
  ]);
  expect(r.stderr).toMatch(
    /reconcile plain \(kept as running\): HOST_UNREADABLE: cannot tell whether process \d+ runs/,
  );
  expect(out.after).toEqual([
    ['plain', 'running'],
    ['vm', 'running'],
  ]);
  expect(JSON.stringify(out.gc)).not.toMatch(/cgroup|run directory|RAM/);
  // seen from a process with descriptors to spare: both machines run, whole
  const now = await lab.list();
  expect(now.map((b) => [b.name, b.state])).toEqual([
    ['plain', 'running'],
    ['vm', 'running'],
  ]);
  expect(ramFiles()).toEqual(ram);
  for (const b of [box, vm]) {
    expect(existsSync(join(lab.home, 'run', b.id))).toBe(true);
    expect((await snaplabCgroupsOnHost()).some((c) => c.id === b.id)).toBe(true);
    expect((await b.exec(['echo', 'still here'])).stdout.trim()).toBe('still here');
  }
}, 180_000);

// A snapshot freezes its machine, copies its storage, thaws it. Killed in between, it left the
// machine frozen while its record said running: exec hung, ls and gc said nothing, and resume
// returned at once ("running"). Its freeze mark is the evidence: the next ls thaws it.
it('a snapshot killed while its machine is frozen: the next ls thaws it (and resume would)', async () => {
  const frozen = await lab.create({ image: 'busybox', name: 'frozen', storage: 'dir' });
  // a tree whose copy takes long enough to be caught frozen
  expect((await frozen.exec(['dd', 'if=/dev/zero', 'of=/big', 'bs=1M', 'count=400'])).exitCode).toBe(0);
  const cg = cgroupFor(frozen.id);
  const env = { ...process.env, SNAPLAB_HOME: lab.home, SNAPLAB_NO_FAST: '1' };
  const snap = spawn(SNAPLAB, ['snapshot', 'frozen', '--name', 'frozen-snap'], { env, stdio: 'ignore' });
  const exited = new Promise((r) => snap.once('exit', r));
  for (const end = Date.now() + 30_000; !(await isFrozen(cg)); await sleep(2))
    if (Date.now() > end) throw new Error('the snapshot never froze its machine');
  snap.kill('SIGKILL');
  await exited;
  expect(await isFrozen(cg)).toBe(true);
  // a second snapshot, stopped while it has the machine frozen (its own mark beside the dead one):
  // ls must leave it frozen, for that snapshot's copy is under way
  const db = new Database(join(lab.home, 'state.db'), { readonly: true, fileMustExist: true });
  const marks = db.prepare('SELECT COUNT(*) AS n FROM inflight WHERE kind = ?');
  const second = spawn(SNAPLAB, ['snapshot', 'frozen', '--name', 'frozen-snap2'], { env, stdio: 'ignore' });
  const secondExited = new Promise((r) => second.once('exit', r));
  for (const end = Date.now() + 30_000; (marks.get(`freeze ${frozen.id}`) as { n: number }).n < 2; await sleep(2))
    if (Date.now() > end) throw new Error('the second snapshot never froze the machine');
  second.kill('SIGSTOP');
  db.close();
  const during = spawnSync(SNAPLAB, ['ls'], { env, encoding: 'utf8' });
  expect(during.status, during.stderr).toBe(0);
  expect(await isFrozen(cg)).toBe(true);
  second.kill('SIGCONT');
  await secondExited;
  expect(second.exitCode).toBe(0);
  const listed = spawnSync(SNAPLAB, ['ls'], { env, encoding: 'utf8' });
  expect(listed.status, listed.stderr).toBe(0);
  expect(listed.stdout).toMatch(/frozen +running/);
  expect(await isFrozen(cg)).toBe(false);
  expect((await frozen.exec(['echo', 'thawed'])).stdout.trim()).toBe('thawed');
  await frozen.destroy();
  await lab.removeSnapshot('frozen-snap2');
  // what the killed snapshot half made (its copy) goes with gc
  await lab.gc();
}, 180_000);
