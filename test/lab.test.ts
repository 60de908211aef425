import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULT_DRIVER, DEFAULT_IMAGE, DEFAULT_LIMITS } from '../src/defaults.js';
import type { CreateOptions, Lab } from '../src/sdk/lab.js';
import type { StorageKind } from '../src/storage/backend.js';
import { disposeLab, testLab } from './helpers.js';
import { orElse } from '../src/cleanup.js';

let lab: Lab;
beforeAll(async () => {
  lab = await testLab();
});
afterAll(async () => {
  await disposeLab(lab);
});

const out = (r: { stdout: string | Buffer }): string => r.stdout.toString().trim();

describe.each<StorageKind>(['btrfs', 'overlay', 'dir'])(
  'create → exec → snapshot → write → restore on %s',
  (storage) => {
    it('restores the snapshot content, not the later write', async () => {
      await using box = await lab.create({ image: 'busybox', storage });
      expect(box.state).toBe('running');
      expect(box.storage).toBe(storage);
      expect(out(await box.exec(['sh', '-c', 'echo one > /root/f; rm /etc/hosts; cat /root/f']))).toBe('one');
      const snap = await box.snapshot(`s-${storage}`);
      await box.exec(['sh', '-c', 'echo two > /root/f; echo new > /root/g']);
      await using copy = await lab.restore(snap.name);
      expect(copy.info.origin).toBe(snap.name);
      expect(out(await copy.exec(['cat', '/root/f']))).toBe('one');
      expect((await copy.exec(['test', '-e', '/root/g'])).exitCode).toBe(1);
      expect((await copy.exec(['test', '-e', '/etc/hosts'])).exitCode).toBe(1);
      // the original keeps its own later state
      expect(out(await box.exec(['cat', '/root/f']))).toBe('two');
      await copy.destroy();
      await lab.removeSnapshot(snap.name);
    });
  },
);

describe('traces', () => {
  it('stores the phases of a create, with the unattributed remainder', async () => {
    await using box = await lab.create();
    const t = (await lab.trace(box.lastTrace!.id))!;
    expect(t.kind).toBe('create');
    const names = t.phases.map((p) => p.name);
    for (const n of [
      'clone rootfs',
      'cgroup',
      'launch',
      'namespaces ready → agent listening',
      'agent connect',
      'first exec',
    ])
      expect(names).toContain(n);
    for (const p of t.phases) expect(p.endMs).toBeGreaterThanOrEqual(p.startMs);
    expect(t.unattributedMs).toBeGreaterThanOrEqual(0);
    expect(t.unattributedMs).toBeLessThanOrEqual(t.totalMs);
  });
});

describe('pause and resume', () => {
  it('freezes the sandbox; exec while paused is refused with a hint; resume brings it back', async () => {
    await using box = await lab.create();
    await box.pause();
    const again = await lab.get(box.name);
    expect(again.state).toBe('paused');
    await expect(again.exec(['true'])).rejects.toMatchObject({ code: 'SANDBOX_PAUSED' });
    await again.resume();
    expect((await again.exec(['echo', 'ok'])).stdout.toString()).toBe('ok\n');
    again.close();
  });
});

describe('an agent connection that ended under a running sandbox', () => {
  it('is opened again by the next call, the sandbox not declared anything', async () => {
    await using box = await lab.create();
    expect(out(await box.exec(['echo', 'one']))).toBe('one');
    const first = await box.agentConnection();
    // a live one is kept: one connection for every call
    expect(first.closed).toBe(false);
    expect(out(await box.exec(['echo', 'again']))).toBe('again');
    expect(await box.agentConnection()).toBe(first);
    // the socket closed under the client (not by it), the machine running on
    // biome-ignore lint/complexity/useLiteralKeys: the client's private socket, closed by this test
    const socket = first['socket'];
    await new Promise((r) => socket.once('close', r).destroy());
    expect(first.closed).toBe(true);
    expect(out(await box.exec(['echo', 'two']))).toBe('two');
    const second = await box.agentConnection();
    expect(second).not.toBe(first);
    expect(second.closed).toBe(false);
    expect(out(await box.exec(['echo', 'three']))).toBe('three');
    expect(await box.agentConnection()).toBe(second);
    expect((await lab.get(box.id)).state).toBe('running');
  });

  it('one opened across a close() is not kept (nothing would close it): that call fails, the next opens its own', async () => {
    await using box = await lab.create();
    const again = await lab.get(box.id); // no connection yet
    const call = again.exec(['true']);
    again.close();
    await expect(call).rejects.toMatchObject({
      code: 'AGENT_UNREACHABLE',
      message: /closed while it was being opened/,
    });
    expect(out(await again.exec(['echo', 'after']))).toBe('after');
    again.close();
  });
});

describe('a sandbox that died', () => {
  it('is reported dead with a reason, and exec says so', async () => {
    const box = await lab.create();
    process.kill(box.info.pid!, 'SIGKILL');
    await new Promise((r) => setTimeout(r, 200));
    const listed = (await lab.list()).find((b) => b.id === box.id)!;
    expect(listed.state).toBe('dead');
    expect(listed.info.reason).toMatch(/init process is gone/);
    await expect((await lab.get(box.id)).exec(['true'])).rejects.toMatchObject({ code: 'SANDBOX_DEAD' });
    await (await lab.get(box.id)).destroy();
  });
});

describe('gc beside creates', () => {
  it('leaves alone what a create that began after gc started has made (found by the soak)', async () => {
    // gc reads the live records once, then removes the cgroups and run directories of the others:
    // a create in between used to lose its cgroup (its processes killed) or its run directory
    let stop = false;
    const gcs = (async () => {
      let n = 0;
      while (!stop) {
        await lab.gc();
        n++;
      }
      return n;
    })();
    try {
      for (let i = 0; i < 12; i++) {
        const boxes = await Promise.all([lab.create(), lab.create()]);
        for (const b of boxes) {
          expect(out(await b.exec(['echo', 'alive'])), b.name).toBe('alive');
          await b.destroy();
        }
      }
    } finally {
      stop = true;
    }
    expect(await gcs).toBeGreaterThan(3);
  }, 120_000);
});

describe('an rm of what another step still holds', () => {
  it("is refused (SANDBOX_BUSY) while a live process raises it as a pool's standby, waits while one removes it; its end is the rm's", async () => {
    const { processStartTime } = await import('../src/host/procs.js');
    const box = await lab.create();
    const holder = spawn('sleep', ['60']);
    try {
      const start = (await processStartTime(holder.pid!))!;
      const store = lab.context.store;
      // a standby its pool is still raising: the raiser would write it back as ready
      store.updateSandbox(box.id, {
        state: 'running',
        reason: `raising a standby (pid ${holder.pid})`,
        owner: { pid: holder.pid!, start, op: 'hold' },
      });
      await expect((await lab.get(box.id)).destroy()).rejects.toMatchObject({
        code: 'SANDBOX_BUSY',
        message: `sandbox ${box.name} is still being raised as a standby (by pid ${holder.pid})`,
      });
      // another process's removal under way (two at once each deleted the volume, and one failed):
      // waited for; here its process dies, and the rm takes it over
      store.updateSandbox(box.id, {
        state: 'removing',
        reason: null,
        owner: { pid: holder.pid!, start, op: 'remove' },
      });
      let settled = false;
      const rm = (await lab.get(box.id)).destroy().finally(() => (settled = true));
      await new Promise((r) => setTimeout(r, 300));
      expect(settled, 'the rm waits').toBe(false);
      holder.kill('SIGKILL');
      await rm;
      expect(store.getSandbox(box.id)).toBeUndefined();
    } finally {
      holder.kill('SIGKILL');
      if (lab.context.store.getSandbox(box.id)) {
        lab.context.store.updateSandbox(box.id, { state: 'running', reason: null, owner: null });
        await box.destroy();
      }
    }
  });
});

describe("gc's mark", () => {
  it('a mark left by a dead gc, by a reused pid or by this process after a failure does not hold creates back', async () => {
    const { spawn } = await import('node:child_process');
    const store = lab.context.store;
    // a pid now held by a process that started after the mark was written: a reuse
    const later = spawn('sleep', ['30']);
    const add = (id: string, pid: number, at: number): void =>
      void store.db
        .prepare('INSERT INTO inflight (id, pid, kind, started_at) VALUES (?, ?, ?, ?)')
        .run(id, pid, 'gc', at);
    try {
      add('stale-reuse', later.pid!, Date.now() - 60_000);
      add('stale-dead', 2 ** 22 + 7, Date.now()); // above any pid_max: no such process
      store.beginInflight('stale-mine', 'gc'); // this process's, not held by a running gc
      const t0 = Date.now();
      const box = await lab.create();
      expect(Date.now() - t0).toBeLessThan(30_000);
      expect(out(await box.exec(['echo', 'made'])), 'made').toBe('made');
      await box.destroy();
      expect(store.listInflight().map((o) => o.id)).toEqual([]); // the stale marks were dropped
    } finally {
      later.kill('SIGKILL');
      for (const id of ['stale-reuse', 'stale-dead', 'stale-mine']) store.endInflight(id);
    }
  });
});

describe("gc and doctor's probe cgroup", () => {
  it("removes the probe cgroup of a doctor that is gone, not a live one's", async () => {
    const { existsSync, mkdirSync, rmdirSync } = await import('node:fs');
    const { detectCgroups, DEFAULT_ROOT } = await import('../src/host/cgroups/detect.js');
    const { probeParent } = await import('../src/host/cgroups/host.js');
    const { ensureScope, SCOPE_PATH } = await import('../src/host/cgroups/scope.js');
    const layout = detectCgroups(DEFAULT_ROOT);
    const parent = probeParent(layout);
    // on a systemd host the probe goes in snaplab's scope, which gc stops when idle (with what is in it)
    const scoped = layout.base.endsWith(SCOPE_PATH);
    if (scoped) await ensureScope(layout.base);
    const dead = `${parent}/snaplab-probe-${2 ** 22 + 7}`; // above any pid_max: no such process
    const live = `${parent}/snaplab-probe-${process.pid}`;
    mkdirSync(dead);
    mkdirSync(live);
    try {
      await lab.gc();
      // (gone whichever gc removed it: another test file's may run at the same time)
      expect(existsSync(dead)).toBe(false);
      if (!scoped) expect(existsSync(live)).toBe(true);
    } finally {
      for (const d of [dead, live]) if (existsSync(d)) rmdirSync(d);
    }
  });
});

describe('bad input', () => {
  it('names the problem with a code and a hint', async () => {
    await expect(lab.create({ image: 'nope' })).rejects.toMatchObject({
      code: 'IMAGE_NOT_FOUND',
      hint: expect.stringContaining('image import'),
    });
    await expect(lab.get('nope')).rejects.toMatchObject({ code: 'SANDBOX_NOT_FOUND' });
    await expect(lab.restore('nope')).rejects.toMatchObject({ code: 'SNAPSHOT_NOT_FOUND' });
    await expect(lab.create({ name: 'bad name!' })).rejects.toMatchObject({ code: 'BAD_NAME' });
    await using box = await lab.create({ name: 'taken' });
    await expect(lab.create({ name: 'taken' })).rejects.toMatchObject({ code: 'SANDBOX_EXISTS' });
    await box.snapshot('snap-taken');
    await expect(box.snapshot('snap-taken')).rejects.toMatchObject({ code: 'SNAPSHOT_EXISTS' });
    await expect(box.exec([])).rejects.toMatchObject({ code: 'BAD_INPUT' });
    await lab.removeSnapshot('snap-taken');
    // nothing was lost: the sandbox still works
    expect((await box.exec(['true'])).exitCode).toBe(0);
  });
});

describe('defaults (src/defaults.ts, resolved by resolveCreate)', () => {
  it('a create that asks nothing gets the default image, driver and limits; a snapshot given past the types is restored, not ignored', async () => {
    await using box = await lab.create();
    expect(box.image).toBe(DEFAULT_IMAGE);
    expect(box.driver).toBe(DEFAULT_DRIVER);
    expect(box.info.limits).toMatchObject(DEFAULT_LIMITS);
    const snap = await box.snapshot('snap-defaults');
    // a JavaScript caller (or a daemon's body) may give a snapshot to create: it used to make a fresh busybox
    await using copy = await lab.create({ snapshot: snap.name } as CreateOptions);
    expect(copy.info.origin).toBe(snap.name);
    await copy.destroy();
    await lab.removeSnapshot(snap.name);
  });
});

// the built library (npm test builds first) in a process of its own, which must end by itself
const SCRIPT = `
  import { Lab } from ${JSON.stringify(join(import.meta.dirname, '..', 'dist', 'sdk', 'index.js'))};
  const lab = await Lab.open({ home: process.env.SNAPLAB_HOME });
  const box = await lab.create({ image: 'busybox', name: 'left-running' });
  await box.exec(['true']);
  // a command under way holds the process until it ends; not awaited here
  void box.exec(['sh', '-c', 'sleep 0.5; echo late'], { onStdout: (b) => process.stdout.write(b) });
  lab.close();
`;

describe('a script that leaves its sandboxes running', () => {
  it('ends by itself once its commands have (an idle agent connection holds nothing), the sandbox running on', async () => {
    const child = spawn(process.execPath, ['--input-type=module', '-e', SCRIPT], {
      env: { ...process.env, SNAPLAB_HOME: lab.home },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let stdout = '';
    child.stdout.on('data', (b: Buffer) => (stdout += b));
    // it ends by itself well within this, or is killed (and the test fails on how it ended)
    const killer = setTimeout(() => child.kill('SIGKILL'), 20_000);
    try {
      const [code, signal] = await new Promise<[number | null, string | null]>((r) =>
        child.once('exit', (c, s) => r([c, s])),
      );
      expect([code, signal]).toEqual([0, null]);
      // the command it did not wait for had ended with its output first
      expect(stdout).toBe('late\n');
      expect((await lab.get('left-running')).state).toBe('running');
    } finally {
      clearTimeout(killer);
      await (
        await lab.get('left-running').catch(orElse(undefined, 'get left-running', 'SANDBOX_NOT_FOUND'))
      )?.destroy();
    }
  }, 60_000);
});
