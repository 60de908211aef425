import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { connect } from 'node:net';
import { mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { noted } from '../src/cleanup.js';
import { bindMount } from '../src/host/mounts.js';
import { netnsPath } from '../src/host/net/names.js';
import { listSnaplabNetns } from '../src/host/net/netns.js';
import { renameNetns } from '../src/host/net/ns.js';
import { machineNetns } from '../src/scenario/names.js';
import type { Store } from '../src/store/store.js';
import { rangesOf } from '../src/host/userns/registry.js';
import type { Lab } from '../src/sdk/lab.js';
import { SNAPLAB } from './cli-command.js';
import { disposeLab, testLab } from './helpers.js';

let lab: Lab;
let dir: string;
beforeAll(async () => {
  lab = await testLab();
  dir = mkdtempSync(join(tmpdir(), 'snaplab-test-standby-'));
});
afterAll(async () => {
  for (const s of lab?.scenarios() ?? []) await s.down().catch(noted(`take scenario ${s.name} down`));
  await disposeLab(lab);
  rmSync(dir, { recursive: true, force: true });
});

const PAIR = (name: string, extra = ''): string => `
name: ${name}
${extra}
networks:
  net: { subnet: 10.78.1.0/24 }
machines:
  a:
    networks: { net: { address: 10.78.1.10 } }
    start:
      - run: httpd -p 8080 -h /tmp && cat /proc/sys/kernel/random/uuid > /tmp/started
    ready:
      - tcp: 8080
  b:
    networks: { net: { address: 10.78.1.20 } }
`;

function file(name: string, text: string): string {
  const p = join(dir, `${name}.yaml`);
  writeFileSync(p, text);
  return p;
}

async function standbyState(name: string): Promise<string | null> {
  return (await lab.scenario(name).status()).standby?.state ?? null;
}

/** Wait until the scenario's standby is `state` (a worker raises it in the background). */
async function waitStandby(name: string, state: string | null, ms = 60_000): Promise<void> {
  const end = Date.now() + ms;
  let now = await standbyState(name);
  while (now !== state && Date.now() < end) {
    await new Promise((r) => setTimeout(r, 100));
    now = await standbyState(name);
  }
  expect(now, `the standby of ${name}`).toBe(state);
}

const sh = async (name: string, m: string, cmd: string): Promise<{ exitCode: number; out: string }> => {
  const r = await (await lab.scenario(name).machine(m)).exec(['sh', '-c', cmd]);
  return { exitCode: r.exitCode, out: r.stdout.toString().trim() };
};

const home = (): string => (lab as unknown as { ctx: { home: string } }).ctx.home;

describe('standby resets', () => {
  it('a reset swaps the ready standby in: the snapshot files, fresh start steps, same addresses, no fault carried, nothing raised on its path', async () => {
    const s = await lab.up(file('sw', PAIR('sw')));
    await sh('sw', 'a', 'echo kept > /root/state');
    await s.snapshot('base');
    await waitStandby('sw', 'ready');
    const before = await s.status();
    const oldIds = await Promise.all(['a', 'b'].map(async (m) => (await s.machine(m)).id));
    await sh('sw', 'a', 'echo later > /root/state; echo junk > /root/junk');
    await s.block('a', 'b');
    expect((await sh('sw', 'a', 'ping -c1 -W1 10.78.1.20')).exitCode).not.toBe(0);

    const r = await s.reset();
    expect(r.standby).toBe('swapped');
    const phases = r.trace.phases.map((p) => p.name);
    expect(phases).toContain('swap');
    expect(phases.filter((p) => p.startsWith('raise '))).toEqual([]);

    const after = await s.status();
    expect(after.machines.map((m) => [m.machine, m.state, m.addresses])).toEqual(
      before.machines.map((m) => [m.machine, 'running', m.addresses]),
    );
    expect(after.blocked).toEqual([]);
    const newIds = await Promise.all(['a', 'b'].map(async (m) => (await s.machine(m)).id));
    expect(newIds.filter((id) => oldIds.includes(id))).toEqual([]);
    expect((await sh('sw', 'a', 'cat /root/state; ls /root/junk 2>&1')).out).toMatch(/^kept\n.*No such file/);
    expect((await sh('sw', 'a', 'cat /tmp/started')).exitCode).toBe(0);
    expect((await sh('sw', 'b', 'ping -c1 -W1 10.78.1.10 && wget -q -O- http://a:8080/started')).exitCode).toBe(0);
    expect((await sh('sw', 'a', 'hostname')).out).toBe('a');

    // the old machines go off the reset's path; the next standby is raised
    await waitStandby('sw', 'ready');
    const names = (await lab.list()).map((b) => b.name);
    expect(names.filter((n) => n.startsWith('sw.')).sort()).toEqual(['sw.a', 'sw.a_standby', 'sw.b', 'sw.b_standby']);
    for (const id of oldIds) expect((await lab.list()).some((b) => b.id === id)).toBe(false);
    expect((await listSnaplabNetns()).filter((n) => /-x-/.test(n))).toEqual([]);
  });

  it('without a standby ready (or with standby 0) a reset raises the machines again and says why; faults set since the snapshot are cleared', async () => {
    const s = lab.scenario('sw');
    await s.block('a', 'b');
    await sh('sw', 'a', 'echo later > /root/state');
    const r = await s.reset(undefined, { standby: 0 });
    expect(r.standby).toBe('none: standbys are off');
    expect(r.trace.phases.map((p) => p.name)).toEqual(expect.arrayContaining(['raise a', 'raise b']));
    expect((await s.status()).standby).toBe(null);
    expect((await s.status()).blocked).toEqual([]);
    expect((await sh('sw', 'a', 'cat /root/state')).out).toBe('kept');
    expect((await sh('sw', 'a', 'ping -c1 -W1 10.78.1.20')).exitCode).toBe(0);
    expect((await lab.list()).filter((b) => b.name.endsWith('_standby'))).toEqual([]);
    expect((await listSnaplabNetns()).filter((n) => /-s-/.test(n))).toEqual([]);
  });

  it('a reset requested while the standby is raised waits for it (or falls back), never half', async () => {
    const s = lab.scenario('sw');
    const first = await s.reset(); // queues a raise
    expect(first.standby).toMatch(/^none: /);
    const r = await s.reset(); // right after: the raise is queued or under way
    expect(['swapped', 'none: its standby is queued'].some((x) => r.standby.startsWith(x.split(':')[0]!))).toBe(true);
    const st = await s.status();
    expect(st.machines.every((m) => m.state === 'running')).toBe(true);
    expect((await sh('sw', 'a', 'cat /root/state')).out).toBe('kept');
    await waitStandby('sw', 'ready');
  });

  it('a swap killed between binding the standby namespace to the live name and unbinding it is finished by the next reset', async () => {
    await waitStandby('sw', 'ready');
    const store = (lab as unknown as { ctx: { store: Store } }).ctx.store;
    const scn = store.getScenario('sw')!;
    const [live, standby, aside] = (['live', 'standby', 'aside'] as const).map((c) => machineNetns(scn.id, 0, c));
    const was = statSync(netnsPath(standby!)).ino;
    // what swapStandby had done when it was killed: the scenario swapping, machine a's live
    // namespace set aside, its standby one bound to the live name and not yet unbound there
    store.setScenarioStandby('sw', { ...scn.standby!, state: 'swapping', aside: [] });
    await renameNetns(live!, aside!);
    writeFileSync(netnsPath(live!), '');
    await bindMount(netnsPath(standby!), netnsPath(live!));
    expect(statSync(netnsPath(live!)).ino).toBe(was);

    const r = await lab.scenario('sw').reset();
    expect(r.snapshot).toBe('base');
    const st = await lab.scenario('sw').status();
    expect(st.machines.every((m) => m.state === 'running')).toBe(true);
    expect((await sh('sw', 'b', 'wget -q -O- http://a:8080/started')).exitCode).toBe(0);
    // the standby's namespace is the live one now (the reset raised the machines again into it)
    expect(statSync(netnsPath(live!)).ino).toBe(was);
    await waitStandby('sw', 'ready');
    expect((await listSnaplabNetns()).filter((n) => n.includes(scn.id) && /-x-/.test(n))).toEqual([]);
  });

  it('kill -9 of `snaplab reset` at any point: status is one scenario, the next reset works, down and gc leave nothing', async () => {
    const env = { ...process.env, SNAPLAB_HOME: home() };
    for (const delay of [0, 200, 260, 300, 340, 380, 420, 480, 560, 700]) {
      await waitStandby('sw', 'ready');
      const child = spawn(SNAPLAB, ['reset', 'sw'], { env, stdio: 'ignore' });
      const closed = once(child, 'close');
      await new Promise((r) => setTimeout(r, delay));
      child.kill('SIGKILL');
      await closed;
      const st = await lab.scenario('sw').status();
      expect(st.machines.map((m) => m.machine)).toEqual(['a', 'b']);
      const r = await lab.scenario('sw').reset();
      expect(r.snapshot).toBe('base');
      const ok = await lab.scenario('sw').status();
      expect(ok.state, `after a kill at ${delay} ms`).toBe('up');
      expect(ok.machines.every((m) => m.state === 'running')).toBe(true);
      expect((await sh('sw', 'b', 'wget -q -O- http://a:8080/started')).exitCode).toBe(0);
    }
    const { id } = (
      lab as unknown as { ctx: { store: { getScenario(n: string): { id: string } } } }
    ).ctx.store.getScenario('sw');
    await lab.scenario('sw').down();
    const gc = spawnSync(SNAPLAB, ['gc', '--json'], { env, encoding: 'utf8' });
    expect(gc.status, gc.stderr).toBe(0);
    // a kill that lands while a machine claims its uid range leaves the claim's unfinished write,
    // and one between a removed machine's record and its range's release leaves that range's claim
    // (record first: a range is never freed while a record names it); only gc can tell either is
    // its dead process's (docs/architecture.md, principle 6); nothing else
    const removed = (JSON.parse(gc.stdout) as { removed: string[] }).removed;
    const crashLeftover = (r: string): boolean =>
      /^unfinished user namespace claim \S+ \(its process is gone\)$/.test(r) ||
      /^user namespace range \d+ \(sandbox [0-9a-f]+ of \S+, which is gone\)$/.test(r);
    expect(removed.filter((r) => !crashLeftover(r))).toEqual([]);
    expect((await listSnaplabNetns()).filter((n) => n.includes(id))).toEqual([]);
    expect([...(await rangesOf(home())).values()].filter((h) => h.includes(id))).toEqual([]);
    expect((await lab.list()).filter((b) => b.name.startsWith('sw.'))).toEqual([]);
  });

  it('a port-forward follows the machine through a swap (a held connection ends, a new one reaches the new machine) and ends when the scenario goes', async () => {
    const s = await lab.up(file('pf', PAIR('pf').replaceAll('10.78.1', '10.78.4')));
    await s.snapshot('base');
    await waitStandby('pf', 'ready');
    const env = { ...process.env, SNAPLAB_HOME: home() };
    const fwd = spawn(SNAPLAB, ['port-forward', 'pf/a', ':8080'], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    const closed = once(fwd, 'close');
    onTestFinished(() => void fwd.kill('SIGKILL'));
    let err = '';
    fwd.stderr.on('data', (b: Buffer) => (err += b.toString()));
    const [line] = (await once(fwd.stdout, 'data')) as [Buffer];
    const port = Number(/127\.0\.0\.1:(\d+)/.exec(line.toString())![1]);
    const fetchStarted = async (): Promise<string> => (await fetch(`http://127.0.0.1:${port}/started`)).text();
    const first = await fetchStarted();
    // a connection held open across the swap
    const held = connect(port, '127.0.0.1');
    await once(held, 'connect');
    const heldEnd = once(held, 'close');
    expect((await s.reset()).standby).toBe('swapped');
    await heldEnd; // the old machine is gone: its connection ended, nothing hangs
    const second = await fetchStarted();
    expect(second).not.toBe(first); // another machine's start step wrote it
    await s.down();
    const [code] = (await closed) as [number];
    expect(code).not.toBe(0);
    expect(err).toMatch(/pf\/a was removed: the forward ends/);
  });

  it('down while a standby is being raised stops the raise and leaves nothing', async () => {
    const s = await lab.up(file('dn', PAIR('dn').replace('10.78.1', '10.78.2').replaceAll('10.78.1', '10.78.2')));
    const { id } = (
      lab as unknown as { ctx: { store: { getScenario(n: string): { id: string } } } }
    ).ctx.store.getScenario('dn');
    await s.snapshot('base');
    expect(['queued', 'raising', 'ready']).toContain(await standbyState('dn'));
    await s.down();
    expect((await lab.list()).filter((b) => b.name.startsWith('dn.'))).toEqual([]);
    expect((await listSnaplabNetns()).filter((n) => n.includes(id))).toEqual([]);
    expect([...(await rangesOf(home())).values()].filter((h) => h.includes(id))).toEqual([]);
  });

  it('`standby: 0` in the file keeps none; `snaplab standby` turns it on and raises one in the foreground', async () => {
    const s = await lab.up(file('off', PAIR('off', 'standby: 0').replaceAll('10.78.1', '10.78.3')));
    await s.snapshot('base');
    expect((await s.status()).standby).toBe(null);
    expect((await s.status()).standbyWanted).toBe(false);
    expect((await s.reset()).standby).toBe('none: standbys are off');
    const t = await s.raiseStandby();
    expect(t?.phases.map((p) => p.name)).toEqual(expect.arrayContaining(['networks', 'raise a', 'ready a']));
    expect(await standbyState('off')).toBe('ready');
    expect((await s.reset()).standby).toBe('swapped');
    await s.removeStandby();
    await waitStandby('off', null);
    await s.down();
  });
});
