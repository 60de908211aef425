import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { listSnaplabNetns } from '../src/host/net/netns.js';
import type { Lab } from '../src/sdk/lab.js';
import { disposeLab, testLab } from './helpers.js';
import { noted } from '../src/cleanup.js';

let lab: Lab;
let dir: string;
beforeAll(async () => {
  lab = await testLab();
  dir = mkdtempSync(join(tmpdir(), 'snaplab-test-scn-'));
});
afterAll(async () => {
  for (const s of lab?.scenarios() ?? []) await s.down().catch(noted(`take scenario ${s.name} down`));
  await disposeLab(lab);
  rmSync(dir, { recursive: true, force: true });
});

function file(name: string, text: string): string {
  const p = join(dir, name);
  writeFileSync(p, text);
  return p;
}

// a: on net1 and net2; b: net1 only; c: net2 only. b and c share no network.
const THREE = `
name: tri
networks:
  net1: { subnet: 10.77.1.0/24 }
  net2: { subnet: 10.77.2.0/24 }
machines:
  a:
    networks: { net1: {}, net2: {} }
    start:
      - run: echo started > /tmp/started
  b:
    networks: { net1: { address: 10.77.1.50 } }
  c:
    networks: { net2: {} }
`;

const ping = async (lab: Lab, from: string, to: string): Promise<number> =>
  (await (await lab.scenario('tri').machine(from)).exec(['ping', '-c', '1', '-W', '1', to])).exitCode;

describe('a scenario', () => {
  it('raises machines that reach each other by name over a shared network, and not otherwise', async () => {
    const s = await lab.up(file('tri.yaml', THREE));
    const st = await s.status();
    expect(st.machines.map((m) => m.state)).toEqual(['running', 'running', 'running']);
    expect(st.machines.find((m) => m.machine === 'b')!.addresses).toEqual([{ network: 'net1', address: '10.77.1.50' }]);
    expect(await ping(lab, 'a', 'b')).toBe(0);
    expect(await ping(lab, 'a', 'c')).toBe(0);
    expect(await ping(lab, 'b', 'a')).toBe(0);
    const c = st.machines.find((m) => m.machine === 'c')!.addresses[0]!.address;
    expect(await ping(lab, 'b', c)).not.toBe(0); // b and c share no network
    expect((await (await s.machine('b')).exec(['ping', '-c', '1', '-W', '1', 'c'])).exitCode).not.toBe(0); // nor a name
  });

  it('blocks and unblocks traffic between two machines', async () => {
    const s = lab.scenario('tri');
    // blocks are IPv4 routes: no IPv6 link-local address may exist to go around them
    expect(
      (await (await s.machine('a')).exec(['ip', '-6', 'addr', 'show', 'dev', 'eth0'])).stdout.toString(),
    ).not.toMatch(/fe80/);
    await s.block('a', 'b');
    expect(await ping(lab, 'a', 'b')).not.toBe(0);
    expect(await ping(lab, 'a', 'c')).toBe(0);
    await s.unblock('a', 'b');
    expect(await ping(lab, 'a', 'b')).toBe(0);
  });

  it('reset discards every change after the snapshot on every machine, keeps addresses, reruns start', async () => {
    const s = lab.scenario('tri');
    for (const m of ['a', 'b', 'c']) await (await s.machine(m)).exec(['sh', '-c', 'echo before > /root/state']);
    const snap = await s.snapshot('base');
    expect((snap.manifest as { machines: unknown[] }).machines).toHaveLength(3);
    for (const m of ['a', 'b', 'c'])
      await (await s.machine(m)).exec(['sh', '-c', 'echo after > /root/state; echo x > /root/new']);
    const r = await s.reset();
    expect(r.snapshot).toBe('base');
    for (const m of ['a', 'b', 'c']) {
      const box = await s.machine(m);
      expect((await box.exec(['cat', '/root/state'])).stdout.toString()).toBe('before\n');
      expect((await box.exec(['test', '-e', '/root/new'])).exitCode).toBe(1);
    }
    expect((await (await s.machine('a')).exec(['cat', '/tmp/started'])).stdout.toString()).toBe('started\n');
    expect(await ping(lab, 'a', '10.77.1.50')).toBe(0);
    expect(await ping(lab, 'a', 'b')).toBe(0);
  });

  it('down and gc leave no namespaces, bridges, veths, mounts or processes', async () => {
    await lab.scenario('tri').down();
    await lab.gc();
    expect((await listSnaplabNetns()).length).toBe(0);
    expect(readdirSync(join(lab.home, 'run')).filter((d) => d !== 'net')).toEqual([]);
  });
});

describe('a failing scenario', () => {
  it('a readiness check that fails fails up with the machine, the check and its output, and leaves nothing', async () => {
    const bad = file(
      'bad.yaml',
      `
name: bad
networks: { n: { subnet: 10.77.3.0/24 } }
machines:
  ok: { networks: { n: {} } }
  broken:
    networks: { n: {} }
    ready:
      - command: sh -c "echo not yet; exit 1"
        timeout: 300ms
`,
    );
    await expect(lab.up(bad)).rejects.toMatchObject({
      code: 'SCENARIO_FAILED',
      message: expect.stringMatching(/broken[\s\S]*readiness check[\s\S]*not yet/),
    });
    expect(lab.scenarios()).toEqual([]);
    expect((await lab.list()).length).toBe(0);
    expect((await listSnaplabNetns()).length).toBe(0);
  });

  it('a VM machine with less memory than a VM boots in is refused before anything is made; up --driver qemu changes only machines that name no driver', async () => {
    const small = file(
      'small.yaml',
      `
name: small
machines:
  box: { driver: namespaces, memory: 32M }
  vm: { memory: 64M }
`,
    );
    await expect(lab.up(small, { driver: 'qemu' })).rejects.toMatchObject({
      code: 'BAD_SIZE',
      message: 'machine vm, a VM, needs at least 96 MiB of memory, not 64 MiB',
      hint: expect.stringMatching(/memory: 96M/),
    });
    await expect(lab.up(small, { driver: 'firecracker' })).rejects.toMatchObject({
      code: 'BAD_INPUT',
      message: expect.stringMatching(/unknown driver "firecracker"/),
      hint: expect.stringMatching(/namespaces or qemu/),
    });
    expect(lab.scenarios()).toEqual([]);
    expect((await listSnaplabNetns()).length).toBe(0);
  });

  it('a malformed file is refused with its line number, before anything is made', async () => {
    const p = file('typo.yaml', `networks:\n  n: { subnet: 10.77.4.0/24 }\nmachines:\n  m:\n    netwrks: {}\n`);
    await expect(lab.up(p)).rejects.toMatchObject({
      code: 'SCENARIO_INVALID',
      message: expect.stringMatching(/typo\.yaml:5:/),
    });
  });
});
