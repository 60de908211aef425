import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync, readlinkSync } from 'node:fs';
import { chmod, copyFile, mkdir, mkdtemp, readdir, rm, symlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AgentClient } from '../agent/client.js';
import { snaplabCgroupsOnHost } from '../host/cgroups/host.js';
import { sameProcess } from '../host/procs.js';
import { run, which } from '../host/run.js';
import { Trace } from '../timing/trace.js';
import {
  type Driver,
  type LiveObjects,
  MACHINE_AGENT_PATH,
  type MachineSpec,
  type MemoryImage,
  type RaisedMachine,
} from './driver.js';
import { baseDiskPath } from './qemu/disk.js';
import { ramPrefix } from './qemu/ram.js';
import { createDrivers, DRIVER_NAMES, driverInfo } from './registry.js';
import { orElse } from '../cleanup.js';

/**
 * One suite for every driver (as storage/contract.test.ts is for every backend): each driver is
 * raised, used and removed through the Driver contract alone, and its capability flags are checked
 * against what its machines do. The namespaces run is the whole suite; the qemu run boots one VM
 * (30-60 s under emulation here) that its cases share, and skips what would need more boots.
 */
interface Run {
  driver: string;
  /** how long a raise may take */
  raiseMs: number;
  /** case → why this driver's run leaves it out */
  skip: Partial<Record<'twoMachines', string>>;
  /** files this driver derives from an image volume (they must go with forgetImage and gc) */
  derived: (home: string, volumeId: string) => string[];
  /** files this driver keeps for a machine outside its run directory (they must go with destroy and gc) */
  machineFiles: (home: string, id: string) => Promise<string[]>;
}

const RUNS: Run[] = [
  { driver: 'namespaces', raiseMs: 20_000, skip: {}, derived: () => [], machineFiles: async () => [] },
  {
    driver: 'qemu',
    raiseMs: 240_000,
    skip: {
      twoMachines: 'a second boot costs 30-60 s under emulation (TCG); test/qemu.test.ts runs VMs side by side',
    },
    derived: (home, volumeId) => [baseDiskPath(home, volumeId)],
    machineFiles: async (home, id) =>
      (await readdir('/dev/shm').catch(orElse([] as string[], 'readdir /dev/shm', 'ENOENT')))
        .filter((n) => n === `${ramPrefix(home)}${id}.ram`)
        .map((n) => join('/dev/shm', n)),
  },
];

const MiB = 2 ** 20;
const newId = (): string => randomBytes(6).toString('hex');
const bootId = (): string => readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();

/** An image tree: Debian's static busybox and its applets, as the built-in image has them. */
async function busyboxTree(root: string): Promise<void> {
  const busybox = (await which('busybox')) ?? '/bin/busybox';
  for (const d of ['bin', 'dev', 'etc', 'proc', 'root', 'run', 'sys', 'tmp'])
    await mkdir(join(root, d), { recursive: true });
  await chmod(join(root, 'tmp'), 0o1777);
  await copyFile(busybox, join(root, 'bin/busybox'));
  await chmod(join(root, 'bin/busybox'), 0o755);
  for (const applet of (await run('busybox', ['--list-full'])).stdout.split('\n').filter(Boolean)) {
    const target = join(root, applet);
    if (applet === 'bin/busybox' || existsSync(target)) continue;
    await mkdir(join(target, '..'), { recursive: true });
    await symlink(relative(join(target, '..'), join(root, 'bin/busybox')), target);
  }
}

async function sh(agent: AgentClient, script: string): Promise<{ code: number; out: string }> {
  const r = await agent.exec({ argv: ['/bin/sh', '-c', script], env: ['PATH=/bin:/sbin:/usr/bin:/usr/sbin'] }).result;
  return { code: r.exitCode ?? -1, out: r.stdout.toString().trim() };
}

const hasCgroup = async (id: string): Promise<boolean> => (await snaplabCgroupsOnHost()).some((c) => c.id === id);

function driverContract(r: Run): void {
  let top: string;
  let home: string;
  let tree: string;
  let driver: Driver;
  const imageVolume = `img${randomBytes(4).toString('hex')}`;
  let spec: MachineSpec;
  let vm: RaisedMachine | undefined;
  const made: string[] = []; // every machine id this run made: none may remain
  const allDead: LiveObjects = { sandbox: () => false, imageVolume: () => false };

  const specFor = async (id: string): Promise<MachineSpec> => {
    const rootfs = join(top, 'volumes', id);
    await mkdir(rootfs, { recursive: true });
    // a namespace machine's root is the volume's tree; a VM's volume holds its disk (made from the image)
    if (driver.capabilities.rootIsVolumeTree) await run('cp', ['-a', `${tree}/.`, rootfs]);
    made.push(id);
    return {
      id,
      hostname: `contract-${id.slice(0, 4)}`,
      limits: { memoryBytes: driver.memory.defaultBytes ?? 256 * MiB, pids: 256 },
      rootfs,
      source: { id: imageVolume, path: tree, image: true },
    };
  };

  beforeAll(async () => {
    top = await mkdtemp(join(tmpdir(), `snaplab-test-driver-${r.driver}-`));
    home = join(top, 'home');
    tree = join(top, 'image');
    await mkdir(join(home, 'run'), { recursive: true });
    await busyboxTree(tree);
    driver = createDrivers(home).get(r.driver)!;
    spec = await specFor(newId());
    vm = await driver.raise(spec, new Trace('raise', spec.id));
  }, r.raiseMs + 60_000);

  afterAll(async () => {
    void vm?.agent.close();
    for (const id of made) await driver.destroy({ id, pid: 0, pidStart: 0 });
    await driver.gc(allDead);
    for (const id of made) {
      expect(await hasCgroup(id), `cgroup of ${id}`).toBe(false);
      expect(existsSync(join(home, 'run', id)), `run directory of ${id}`).toBe(false);
    }
    await rm(top, { recursive: true, force: true });
  }, 120_000);

  it('probes ok on this host', async () => {
    const a = await driver.probe();
    expect(a.ok, a.reason).toBe(true);
  });

  it('is the registry’s driver of that name, with its info', () => {
    expect(driver.name).toBe(r.driver);
    expect(DRIVER_NAMES).toContain(r.driver);
    expect(driver.consoleLog).toMatch(/^[\w.-]+$/);
  });

  it('raises a machine whose agent runs commands with their exit codes, under its hostname', async () => {
    const { agent, handle } = vm!;
    expect(handle.id).toBe(spec.id);
    expect(await sameProcess(handle.pid, handle.pidStart)).toBe(true);
    expect(await sh(agent, 'echo hello; exit 3')).toEqual({ code: 3, out: 'hello' });
    expect((await sh(agent, 'hostname')).out).toBe(spec.hostname);
    const first = await agent.exec({ argv: [MACHINE_AGENT_PATH, '--version'], env: [] }).result;
    expect(first.exitCode).toBe(0);
    expect(await driver.inspect(handle)).toEqual({ state: 'alive' });
  });

  it('connect gives another client of the same machine', async () => {
    const other = await driver.connect(vm!.handle);
    try {
      await sh(vm!.agent, 'echo one > /tmp/shared');
      expect((await sh(other, 'cat /tmp/shared')).out).toBe('one');
    } finally {
      await other.close();
    }
  });

  it('its console log is in its run directory', () => {
    expect(existsSync(join(home, 'run', spec.id, driver.consoleLog))).toBe(true);
  });

  it('pause stops every process; resume lets them run again', async () => {
    const { agent, handle } = vm!;
    await driver.pause(handle);
    const answer = sh(agent, 'echo awake');
    try {
      const early = await Promise.race([answer, new Promise((res) => setTimeout(() => res('none'), 500))]);
      expect(early).toBe('none');
    } finally {
      await driver.resume(handle);
    }
    expect((await answer).out).toBe('awake');
  });

  it('clockStopsWhilePaused is true to behaviour: the machine’s clock across a 3 s pause', async () => {
    const { agent, handle } = vm!;
    const before = Number((await sh(agent, 'date +%s')).out);
    const t0 = Date.now();
    await driver.pause(handle);
    await new Promise((res) => setTimeout(res, 3000));
    await driver.resume(handle);
    const after = Number((await sh(agent, 'date +%s')).out);
    const hostS = (Date.now() - t0) / 1000;
    // 1 s of slack each way: `date +%s` truncates, and the exec itself takes time under emulation
    if (driver.capabilities.clockStopsWhilePaused) expect(after - before).toBeLessThan(hostS - 1.5);
    else expect(after - before).toBeGreaterThanOrEqual(Math.floor(hostS) - 1);
  });

  it('ownKernel is true to behaviour: the machine’s boot id is the host’s unless it runs a kernel of its own', async () => {
    const inside = (await sh(vm!.agent, 'cat /proc/sys/kernel/random/boot_id')).out;
    expect(inside !== bootId()).toBe(driver.capabilities.ownKernel);
  });

  it('rootIsVolumeTree is true to behaviour: what the machine writes to / is in the volume’s tree', async () => {
    expect((await sh(vm!.agent, 'echo mark > /contract-mark && sync && echo ok')).out).toBe('ok');
    expect(existsSync(join(spec.rootfs, 'contract-mark'))).toBe(driver.capabilities.rootIsVolumeTree);
  });

  it('pidIsMachineInit and hostRootWithoutUserns are true to behaviour (no user namespace asked)', () => {
    const { pid } = vm!.handle;
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const nspid = /^NSpid:\s+(.*)$/m.exec(status)![1]!.trim().split(/\s+/);
    const isInit = nspid.length > 1 && nspid.at(-1) === '1';
    expect(isInit).toBe(driver.capabilities.pidIsMachineInit);
    if (isInit) expect(readlinkSync(`/proc/${pid}/ns/pid`)).not.toBe(readlinkSync('/proc/self/ns/pid'));
    // root inside is the host's root exactly when the machine's init runs as uid 0 on the host
    const uid = Number(/^Uid:\s+(\d+)/m.exec(status)![1]);
    expect(uid === 0 && isInit).toBe(driver.capabilities.hostRootWithoutUserns);
  });

  it('memorySnapshot is true to its verbs', () => {
    expect(typeof driver.snapshotMemory === 'function').toBe(driver.capabilities.memorySnapshot);
    expect(typeof driver.restoreMemory === 'function').toBe(driver.capabilities.memorySnapshot);
  });

  // the lab's order (sdk/sandbox.ts snapshot): paused, volume copied, memory written, resumed
  const memory = driverInfo(r.driver).capabilities.memorySnapshot;
  it.skipIf(!memory)(
    `a memory restore continues the machine on the host's clock, under a name of its own${memory ? '' : ' (skipped: the driver has no memory snapshots)'}`,
    async () => {
      const { agent, handle } = vm!;
      await sh(agent, 'echo before-snapshot > /tmp/memory-mark');
      const copy = await specFor(newId());
      await driver.pause(handle);
      let image: MemoryImage;
      try {
        await run('cp', ['-a', '--reflink=auto', `${spec.rootfs}/.`, copy.rootfs]);
        image = await driver.snapshotMemory!(handle, join(top, 'memory', copy.id), new Trace('snapshot', spec.id));
      } finally {
        await driver.resume(handle);
      }
      await new Promise((res) => setTimeout(res, 2000)); // the snapshot's clock falls behind
      const restored = await driver.restoreMemory!(copy, image, new Trace('restore', copy.id));
      try {
        expect((await sh(restored.agent, 'cat /tmp/memory-mark')).out).toBe('before-snapshot');
        expect((await sh(restored.agent, 'hostname')).out).toBe(copy.hostname);
        const skew = Number((await sh(restored.agent, 'date +%s')).out) - Date.now() / 1000;
        expect(Math.abs(skew)).toBeLessThan(2);
        expect((await sh(agent, 'hostname')).out).toBe(spec.hostname); // the original runs on as itself
      } finally {
        void restored.agent.close();
        await driver.destroy(restored.handle);
      }
    },
    120_000,
  );

  it.skipIf(!!r.skip.twoMachines)(
    `two machines side by side are apart: own hostname, own files${r.skip.twoMachines ? ` (skipped: ${r.skip.twoMachines})` : ''}`,
    async () => {
      const s = await specFor(newId());
      const second = await driver.raise(s, new Trace('raise', s.id));
      try {
        await sh(second.agent, 'echo second > /tmp/who');
        await sh(vm!.agent, 'echo first > /tmp/who');
        expect((await sh(second.agent, 'hostname; cat /tmp/who')).out).toBe(`${s.hostname}\nsecond`);
        expect((await sh(vm!.agent, 'hostname; cat /tmp/who')).out).toBe(`${spec.hostname}\nfirst`);
      } finally {
        void second.agent.close();
        await driver.destroy(second.handle);
      }
    },
  );

  it('gc keeps what is live: the machine runs on, the image’s derived files stay', async () => {
    const removed = await driver.gc({ sandbox: (id) => id === spec.id, imageVolume: (id) => id === imageVolume });
    expect(removed.filter((x) => x.includes(spec.id) || x.includes(imageVolume))).toEqual([]);
    expect(await driver.inspect(vm!.handle)).toEqual({ state: 'alive' });
    for (const f of r.derived(home, imageVolume)) expect(existsSync(f), f).toBe(true);
  });

  it('destroy kills the machine and removes its host objects, keeps its root volume, and is idempotent (the lab’s stop)', async () => {
    const { handle } = vm!;
    void vm!.agent.close();
    vm = undefined;
    await driver.destroy(handle);
    expect(await sameProcess(handle.pid, handle.pidStart)).toBe(false);
    expect(await hasCgroup(handle.id)).toBe(false);
    expect(existsSync(join(home, 'run', handle.id))).toBe(false);
    expect(await r.machineFiles(home, handle.id)).toEqual([]);
    expect(existsSync(spec.rootfs)).toBe(true);
    const dead = await driver.inspect(handle);
    expect(dead).toEqual({ state: 'dead', reason: expect.stringMatching(/gone/) });
    await driver.destroy(handle);
  });

  it('forgetImage removes what the driver derived from an image volume, and is idempotent', async () => {
    const derived = r.derived(home, imageVolume);
    for (const f of derived) expect(existsSync(f), f).toBe(true);
    await driver.forgetImage(imageVolume);
    await driver.forgetImage(imageVolume);
    for (const f of derived) expect(existsSync(f), f).toBe(false);
  });

  it('an abort during raise rejects with the signal’s reason; destroy then leaves nothing', async () => {
    const s = await specFor(newId());
    const ac = new AbortController();
    const reason = new Error('contract abort');
    const raising = driver.raise(s, new Trace('raise', s.id), ac.signal);
    // a VM is aborted in its boot (QEMU running: its launch takes well under 1.5 s, a boot under
    // emulation 4 s or more; at 5 s a quiet host had booted it), a namespace machine at once
    setTimeout(() => ac.abort(reason), driver.capabilities.ownKernel ? 1500 : 0);
    const t0 = Date.now();
    await expect(raising).rejects.toBe(reason);
    expect(Date.now() - t0).toBeLessThan(driver.capabilities.ownKernel ? 15_000 : 5000);
    await driver.destroy({ id: s.id, pid: 0, pidStart: 0 });
    expect(await hasCgroup(s.id)).toBe(false);
    expect(existsSync(join(home, 'run', s.id))).toBe(false);
    expect(await r.machineFiles(home, s.id)).toEqual([]);
  }, 60_000);

  it('gc removes what the driver left of machines that are not live (a prepare without raise, derived files)', async () => {
    const s = await specFor(newId());
    await driver.prepare(s, new Trace('raise', s.id));
    expect(existsSync(join(home, 'run', s.id))).toBe(true);
    const other = await specFor(newId());
    await driver.prepare(other, new Trace('raise', other.id));
    // the aborted raise above got as far as making the image's derived files again
    const derived = r.derived(home, imageVolume);
    for (const f of derived) expect(existsSync(f), f).toBe(true);
    const removed = await driver.gc({ sandbox: (id) => id === other.id, imageVolume: () => false });
    expect(removed.some((x) => x.includes(s.id))).toBe(true);
    for (const f of derived) expect(existsSync(f), f).toBe(false);
    expect(await hasCgroup(s.id)).toBe(false);
    expect(existsSync(join(home, 'run', s.id))).toBe(false);
    expect(await hasCgroup(other.id)).toBe(true);
    expect(existsSync(join(home, 'run', other.id))).toBe(true);
    await driver.destroy({ id: other.id, pid: 0, pidStart: 0 });
    expect(await driver.gc(allDead)).toEqual([]);
  });
}

for (const r of RUNS) describe(`driver contract: ${r.driver}`, () => driverContract(r));
