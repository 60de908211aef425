/**
 * stop and start on both libraries (embedded, and remote through a real `snaplab serve` with an
 * API key): the files stay, the processes do not (a fresh boot, a new PID 1), the id, name,
 * labels, limits and egress address are the same; bad states are refused with codes; a failed
 * start removes what it made; gc finds a stopped machine's leftovers; the daemon tells of both.
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Lab } from '../src/sdk/lab.js';
import type { LabApi, SandboxApi } from '../src/sdk/api.js';
import type { Sandbox } from '../src/sdk/sandbox.js';
import { cgroupFor } from '../src/host/cgroups/cgroups.js';
import { handledElsewhere } from '../src/cleanup.js';
import { bothLabs, cli, eventsOf, removeHome, sleep, until, type TestDaemon } from './daemon-helpers.js';
import { SNAPLAB } from './cli-command.js';

let home: string;
let daemon: TestDaemon;
let token: string;
const labs: Record<string, LabApi> = {};

beforeAll(async () => {
  ({ home, daemon, token } = await bothLabs('stopstart', 'read,exec', labs));
}, 120_000);

afterAll(async () => {
  for (const lab of Object.values(labs)) lab.close();
  await daemon?.stop();
  cli(home, ['rm', '--all']);
  cli(home, ['image', 'rm', '--force', 'busybox']);
  cli(home, ['gc']);
  removeHome(home);
});

/** The start time of the machine's PID 1 (/proc/1/stat field 22): a new init has a new one. */
async function initStart(box: SandboxApi): Promise<string> {
  const stat = (await box.exec(['cat', '/proc/1/stat'])).stdout;
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]!;
}

const out = async (box: SandboxApi, script: string): Promise<string> => (await box.exec(['sh', '-c', script])).stdout;

describe.each(['embedded', 'remote'])('stop and start, %s', (kind) => {
  const lab = (): LabApi => labs[kind]!;

  it('keeps its files and who it is; its processes are not kept (a fresh boot, a new PID 1)', async () => {
    const box = await lab().create({
      name: `ss-${kind}`,
      image: 'busybox',
      labels: { suite: 'stop-start' },
      limits: { memoryBytes: 128 << 20, pids: 200 },
    });
    try {
      await box.exec(['sh', '-c', 'echo kept > /root/f']);
      const bg = await box.spawn(['sleep', '1000']);
      // it ends with the machine: its result rejects then, and is not waited for
      bg.result.catch(handledElsewhere);
      const bgPid = await bg.pid;
      const before = { init: await initStart(box), pid: box.toJSON().pid };
      await box.stop();
      await box.refresh();
      expect([box.state, box.stopped]).toEqual(['dead', true]);
      // nothing runs: its cgroup is gone (remote too: the same host)
      for (const dir of cgroupFor(box.id).dirs) expect(existsSync(dir)).toBe(false);
      await expect(box.exec(['true'])).rejects.toMatchObject({ code: 'SANDBOX_STOPPED' });
      await expect(box.stop()).rejects.toMatchObject({ code: 'SANDBOX_STOPPED', hint: expect.stringMatching(/start/) });
      await box.start();
      const again = await lab().get(box.id);
      expect([again.state, again.stopped, again.name, again.labels, again.limits]).toEqual([
        'running',
        false,
        `ss-${kind}`,
        { suite: 'stop-start' },
        box.limits,
      ]);
      expect(await out(again, 'cat /root/f')).toBe('kept\n');
      // the background command went with the old boot, and PID 1 is another process
      expect(await out(again, `ps -o pid,args | grep -c '[s]leep 1000' || true`)).toBe('0\n');
      expect(await out(again, `test -d /proc/${bgPid} && echo there || echo gone`)).toBe('gone\n');
      expect(await initStart(again)).not.toBe(before.init);
      expect(again.toJSON().pid).not.toBe(before.pid);
      await expect(again.start()).rejects.toMatchObject({
        code: 'SANDBOX_RUNNING',
        hint: expect.stringMatching(/stop/),
      });
      await again.pause();
      await expect(again.start()).rejects.toMatchObject({
        code: 'SANDBOX_RUNNING',
        hint: expect.stringMatching(/resume/),
      });
      await again.resume();
      // and again: stop and start are repeatable
      await again.stop();
      await again.start();
      expect(await out(again, 'cat /root/f')).toBe('kept\n');
    } finally {
      await box.destroy();
    }
  }, 120_000);

  it('keeps its egress address across a stop and a start', async () => {
    const box = await lab().create({ image: 'busybox', egress: true });
    try {
      const address = box.egress!.address;
      const inside = (): Promise<string> => out(box, 'ip addr show eth0');
      expect(await inside()).toContain(address);
      await box.stop();
      await box.start();
      await box.refresh();
      expect(box.egress!.address).toBe(address);
      expect(await inside()).toContain(address);
    } finally {
      await box.destroy();
    }
  }, 120_000);
});

describe('stop and start, the embedded lab alone', () => {
  const lab = (): Lab => labs.embedded as Lab;

  it('a start that fails removes what it made and leaves the machine stopped; it can be removed', async () => {
    const box = (await lab().create({ image: 'busybox', egress: true })) as Sandbox;
    try {
      // a start writes its resolver (egress): a directory in its place makes the start fail
      await box.exec(['sh', '-c', 'rm -f /etc/resolv.conf && mkdir /etc/resolv.conf']);
      await box.stop();
      await expect(box.start()).rejects.toThrow();
      await box.refresh();
      expect([box.state, box.stopped]).toEqual(['dead', true]);
      expect(existsSync(join(home, 'run', box.id))).toBe(false);
      for (const dir of cgroupFor(box.id).dirs) expect(existsSync(dir)).toBe(false);
      const failed = (await lab().traces({ targets: [box.name] })).find((t) => t.kind === 'start');
      expect(failed?.error).toBeTruthy();
    } finally {
      await box.destroy();
    }
    expect(existsSync(join(home, 'run', box.id))).toBe(false);
  }, 120_000);

  it("gc removes a stopped machine's host leftovers and keeps the machine, which starts again", async () => {
    const box = await lab().create({ image: 'busybox' });
    try {
      await box.exec(['sh', '-c', 'echo kept > /root/f']);
      await box.stop();
      // what a crash could leave: a run directory
      mkdirSync(join(home, 'run', box.id), { recursive: true });
      const { removed } = await lab().gc();
      expect(removed).toContain(`run directory ${join(home, 'run', box.id)}`);
      await box.start();
      expect(await out(box, 'cat /root/f')).toBe('kept\n');
    } finally {
      await box.destroy();
    }
  }, 120_000);

  it('a start whose process is killed half-way is stopped again by the next reader, and starts after', async () => {
    const box = await lab().create({ image: 'busybox' });
    try {
      await box.exec(['sh', '-c', 'echo kept > /root/f']);
      await box.stop();
      const child = spawn(SNAPLAB, ['start', box.name], {
        env: { ...process.env, SNAPLAB_HOME: home },
        stdio: 'ignore',
      });
      const exited = new Promise((r) => child.once('exit', r));
      // killed as soon as its record says it is being started
      let seen = '';
      for (const end = Date.now() + 20_000; seen !== 'creating' && Date.now() < end; await sleep(2))
        seen = (await lab().get(box.id, { check: false })).state;
      child.kill('SIGKILL');
      await exited;
      expect(seen).toBe('creating');
      const after = await lab().get(box.id); // reconciled: its owner is gone
      expect([after.state, after.stopped]).toEqual(['dead', true]);
      for (const dir of cgroupFor(box.id).dirs) expect(existsSync(dir)).toBe(false);
      await after.start();
      expect(await out(after, 'cat /root/f')).toBe('kept\n');
    } finally {
      await box.destroy();
    }
  }, 120_000);

  it('a VM (qemu) stops with its disk and starts again on it: a fresh boot', async () => {
    const vm = await lab().create({ driver: 'qemu', image: 'busybox' });
    try {
      await vm.exec(['sh', '-c', 'echo kept > /root/f']);
      const boot = await out(vm, 'cat /proc/sys/kernel/random/boot_id');
      await vm.stop(); // (the guest syncs first)
      await vm.start();
      expect(await out(vm, 'cat /root/f')).toBe('kept\n');
      expect(await out(vm, 'cat /proc/sys/kernel/random/boot_id')).not.toBe(boot);
    } finally {
      await vm.destroy();
    }
  }, 400_000);

  it('the daemon tells of a stop and a start on its event stream', async () => {
    const remote = labs.remote!;
    const box = await remote.create({ name: 'ss-events', image: 'busybox' });
    try {
      await box.stop();
      await box.start();
      const types = (await eventsOf(daemon.url, token, 'ss-events', (es) => es.some((e) => e.type === 'started'))).map(
        (e) => e.type,
      );
      expect(types).toEqual(expect.arrayContaining(['stopped', 'started']));
      expect(types.indexOf('stopped')).toBeLessThan(types.indexOf('started'));
    } finally {
      await box.destroy();
    }
  }, 120_000);
});

describe('a timeout that stops (onTimeout stop), through the daemon', () => {
  /** The sandbox when it is stopped, else nothing. */
  const stopped = async (idOrName: string): Promise<SandboxApi | undefined> => {
    const b = await labs.remote!.get(idOrName);
    return b.stopped ? b : undefined;
  };

  it('the API: stopped at its end (told why), its clock still until a start, which boots it afresh on its files', async () => {
    const remote = labs.remote!;
    const box = await remote.create({ name: 'ss-ttl', image: 'busybox', timeoutS: 600, onTimeout: 'stop' });
    try {
      expect(box.onTimeout).toBe('stop');
      await box.exec(['sh', '-c', 'echo kept > /root/f']);
      const init = await initStart(box);
      // POST …/timeout with the action named
      await box.setTimeout(1, 'stop');
      const after = await until('stopped at its timeout', () => stopped(box.id), 30_000);
      expect([after.state, after.stopped, after.expiresAt, after.onTimeout]).toEqual(['dead', true, null, 'stop']);
      // its clock stands still while it is stopped: past its timeout again, it is there, stopped
      await sleep(2500);
      expect((await stopped(box.id))?.state).toBe('dead');
      const events = await eventsOf(daemon.url, token, box.id, (es) => es.some((e) => e.type === 'stopped'));
      expect(events.map((e) => e.type)).toEqual(['created', 'ready', 'timeout', 'stopped']);
      expect(events.at(-1)!.reason).toMatch(/timeout of 1 s ended/);
      // a start: the files it had, a new PID 1, and its clock runs again (to another stop); long
      // enough first that the reaper does not stop it while it is read
      await after.setTimeout(600, 'stop');
      await after.start();
      expect(await out(after, 'cat /root/f')).toBe('kept\n');
      expect(await initStart(after)).not.toBe(init);
      expect(after.expiresAt).not.toBeNull();
      await after.setTimeout(1, 'stop');
      await until('stopped again at its timeout', () => stopped(box.id), 30_000);
    } finally {
      await box.destroy();
    }
  }, 120_000);

  it('one dead by itself (its init killed) when its timeout ends is kept, not removed: a stop keeps files', async () => {
    const remote = labs.remote!;
    const box = await remote.create({ name: 'ss-dead', image: 'busybox', timeoutS: 6, onTimeout: 'stop' });
    try {
      process.kill(box.toJSON().pid as number, 'SIGKILL');
      await until('seen dead', async () => ((await remote.get(box.id)).state === 'dead' ? true : undefined), 10_000);
      await sleep(8000); // past its timeout, with the reaper's tick
      // still there, dead (stopped too, when the reaper came before its death was read: files kept either way)
      expect((await remote.get(box.id)).state).toBe('dead');
      const events = await eventsOf(daemon.url, token, box.id, (es) => es.some((e) => e.type === 'timeout'));
      expect(events.map((e) => e.type)).not.toContain('destroyed');
    } finally {
      await box.destroy();
    }
  }, 60_000);

  it('the CLI: `create --on-timeout stop` on both paths (the C command and Node) makes one that stops', async () => {
    const env = { SNAPLAB_HOST: daemon.url, SNAPLAB_TOKEN: token };
    // with no node on PATH only the C command can answer; SNAPLAB_NO_FAST: Node's
    const made = [
      cli(home, ['create', '--name', 'ss-c', '--timeout', '1', '--on-timeout', 'stop', '--json'], undefined, {
        ...env,
        PATH: '/nonexistent',
      }),
      cli(home, ['create', '--name', 'ss-node', '--timeout', '1', '--on-timeout', 'stop', '--json'], undefined, {
        ...env,
        SNAPLAB_NO_FAST: '1',
      }),
    ];
    try {
      for (const r of made) {
        expect(r.code, r.err).toBe(0);
        expect(JSON.parse(r.out)).toMatchObject({ timeoutS: 1, onTimeout: 'stop' });
      }
      for (const name of ['ss-c', 'ss-node']) await until(`${name} stopped`, () => stopped(name), 30_000);
      const bad = cli(home, ['create', '--on-timeout', 'sleep'], undefined, env);
      expect([bad.code, bad.err]).toEqual([
        2,
        expect.stringMatching(/unknown --on-timeout "sleep"\nhint: kill, pause or stop/),
      ]);
    } finally {
      for (const name of ['ss-c', 'ss-node']) cli(home, ['rm', name], undefined, env);
    }
  }, 120_000);
});
