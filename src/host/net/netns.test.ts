import { randomBytes } from 'node:crypto';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { isSnaplabError } from '../../errors.js';
import { run } from '../run.js';
import {
  addBridge,
  attach,
  block,
  createNetns,
  deleteNetns,
  detach,
  listSnaplabNetns,
  netnsPath,
  probeNetem,
  probeNetworking,
  runIn,
  setImpairment,
  unblock,
  unwire,
  wire,
  type WirePlan,
} from './netns.js';

// Only 10.77.x.x, only inside namespaces made here; the host's namespace is never touched.
const prefix = `snaplab-test-${randomBytes(3).toString('hex')}-`;
const ns = (n: string): string => prefix + n;
let hostLinks = '';

const hostLinkList = async (): Promise<string> => (await run('ip', ['-o', 'link', 'show'])).stdout;
const links = async (netns: string): Promise<string[]> =>
  (await run('ip', ['-n', netns, '-o', 'link', 'show'])).stdout
    .split('\n')
    .filter(Boolean)
    .map((l) => (l.split(': ')[1] ?? '').split('@')[0] ?? '')
    .sort();
const ping = (from: string, to: string) =>
  runIn(ns(from), ['busybox', 'ping', '-c1', '-W1', to], { allowFail: true, timeoutMs: 5000 });
const ours = async (): Promise<string[]> => (await listSnaplabNetns()).filter((n) => n.startsWith(prefix));

beforeAll(async () => {
  hostLinks = await hostLinkList();
});

afterAll(async () => {
  for (const n of await ours()) await deleteNetns(n);
  expect(await ours()).toEqual([]);
  expect(await hostLinkList()).toBe(hostLinks);
});

const netem = await probeNetem();

describe('names', () => {
  it('refuses a namespace that does not start with snaplab-', async () => {
    for (const bad of ['test-x', 'other', '']) {
      const e = await createNetns(bad).catch((x: unknown) => x);
      expect(isSnaplabError(e, 'BAD_INPUT')).toBe(true);
    }
    await expect(createNetns('snaplab-a/b')).rejects.toMatchObject({ code: 'BAD_INPUT' });
    expect(() => netnsPath('nope')).toThrow(/snaplab-/);
    expect(netnsPath('snaplab-x')).toBe('/run/netns/snaplab-x');
  });

  it('refuses interface names longer than 15 characters and bad addresses', async () => {
    const base = { bridgeNetns: ns('n'), machineNetns: ns('m'), guestIf: 'eth0', address: '10.77.1.2/24' };
    await expect(attach({ ...base, hostIf: 'a-very-long-name0' })).rejects.toMatchObject({ code: 'BAD_INPUT' });
    await expect(attach({ ...base, hostIf: 'v0', address: '10.77.1.2' })).rejects.toMatchObject({ code: 'BAD_INPUT' });
    await expect(attach({ ...base, hostIf: 'v0', address: '10.77.1.256/24' })).rejects.toMatchObject({
      code: 'BAD_INPUT',
    });
    await expect(block(ns('m'), ['not-an-ip'])).rejects.toMatchObject({ code: 'BAD_INPUT' });
  });
});

describe('namespaces', () => {
  afterEach(async () => {
    for (const n of await ours()) await deleteNetns(n);
  });

  it('creates a namespace with loopback up, refuses a second of the same name with a hint, deletes idempotently', async () => {
    const name = ns('twice');
    expect(await createNetns(name)).toBe(`/run/netns/${name}`);
    expect(await ours()).toEqual([name]);
    expect((await run('ip', ['-n', name, '-o', 'link', 'show', 'lo'])).stdout).toMatch(/LOOPBACK,UP/);
    const e = await createNetns(name).catch((x: unknown) => x);
    expect(isSnaplabError(e, 'HOST_COMMAND_FAILED')).toBe(true);
    expect((e as { hint?: string }).hint).toMatch(/ip netns del/);
    await deleteNetns(name);
    await deleteNetns(name);
    expect(await ours()).toEqual([]);
  });

  it('probes networking with a scratch namespace it removes', async () => {
    const before = await listSnaplabNetns();
    expect(await probeNetworking()).toMatchObject({ ok: true });
    expect(await listSnaplabNetns()).toEqual(before);
    expect(typeof netem.ok).toBe('boolean');
  });
});

describe('a scenario network', () => {
  // netA and netB both carry 10.77.1.0/24 but are separate wires; netC is 10.77.2.0/24.
  // m1, m2 on A; m3 on B and C; m4 on A and C.
  beforeAll(async () => {
    await Promise.all(['netA', 'netB', 'netC', 'm1', 'm2', 'm3', 'm4'].map((n) => createNetns(ns(n))));
    await Promise.all(['netA', 'netB', 'netC'].map((n) => addBridge(ns(n))));
    const at = (net: string, m: string, hostIf: string, guestIf: string, address: string) =>
      attach({ bridgeNetns: ns(net), machineNetns: ns(m), hostIf, guestIf, address });
    await Promise.all([
      at('netA', 'm1', 'v-m1', 'eth0', '10.77.1.10/24'),
      at('netA', 'm2', 'v-m2', 'eth0', '10.77.1.11/24'),
      at('netB', 'm3', 'v-m3', 'eth0', '10.77.1.12/24'),
      at('netC', 'm3', 'v-m3', 'eth1', '10.77.2.12/24'),
      at('netA', 'm4', 'v-m4', 'eth0', '10.77.1.13/24'),
      at('netC', 'm4', 'v-m4', 'eth1', '10.77.2.13/24'),
    ]);
  });

  afterAll(async () => {
    for (const n of await ours()) await deleteNetns(n);
  });

  it('connects machines on one bridge, and nothing else', async () => {
    expect((await ping('m1', '10.77.1.11')).code).toBe(0);
    expect((await ping('m2', '10.77.1.10')).code).toBe(0);
    // Same subnet, other bridge: no way through.
    expect((await ping('m3', '10.77.1.11')).code).not.toBe(0);
    expect((await ping('m1', '10.77.1.12')).code).not.toBe(0);
    // No default route, no forwarding through a machine on both networks.
    expect((await ping('m1', '10.77.2.12')).code).not.toBe(0);
    const routes = (await run('ip', ['-n', ns('m1'), 'route', 'show'])).stdout;
    expect(routes).not.toMatch(/default/);
  });

  it('lets a machine on two networks reach both', async () => {
    expect((await ping('m4', '10.77.1.10')).code).toBe(0);
    expect((await ping('m4', '10.77.2.12')).code).toBe(0);
    expect(await links(ns('m4'))).toEqual(['eth0', 'eth1', 'lo']);
    expect(await links(ns('netA'))).toEqual(['br0', 'lo', 'v-m1', 'v-m2', 'v-m4']);
  });

  it('blocks and unblocks, idempotently, both ways', async () => {
    await block(ns('m1'), ['10.77.1.11']);
    await block(ns('m1'), ['10.77.1.11']);
    expect((await ping('m1', '10.77.1.11')).code).not.toBe(0);
    expect((await ping('m2', '10.77.1.10')).code).not.toBe(0); // the reply is dropped
    expect((await ping('m1', '10.77.1.13')).code).toBe(0); // others unaffected
    await unblock(ns('m1'), ['10.77.1.11', '10.77.1.99']);
    await unblock(ns('m1'), ['10.77.1.11']);
    expect((await ping('m1', '10.77.1.11')).code).toBe(0);
  });

  it('refuses to attach over an existing interface name and leaves the existing one', async () => {
    const e = await attach({
      bridgeNetns: ns('netA'),
      machineNetns: ns('m3'),
      hostIf: 'v-m1',
      guestIf: 'eth2',
      address: '10.77.1.20/24',
    }).catch((x: unknown) => x);
    expect(isSnaplabError(e, 'HOST_COMMAND_FAILED')).toBe(true);
    expect((e as { hint?: string }).hint).toMatch(/exists already/);
    expect((await ping('m1', '10.77.1.11')).code).toBe(0);
  });

  it.runIf(netem.ok)('delays a machine’s traffic with netem, and clears it', async () => {
    await setImpairment(ns('m1'), 'eth0', { delayMs: 100 });
    const slow = await ping('m1', '10.77.1.11');
    expect(slow.code).toBe(0);
    expect(Number(/time=([\d.]+) ms/.exec(slow.stdout)?.[1])).toBeGreaterThanOrEqual(100);
    await setImpairment(ns('m1'), 'eth0', null);
    await setImpairment(ns('m1'), 'eth0', null);
    const fast = await ping('m1', '10.77.1.11');
    expect(Number(/time=([\d.]+) ms/.exec(fast.stdout)?.[1])).toBeLessThan(100);
  });

  it.runIf(!netem.ok)(`says netem is unavailable with a fix (netem: ${netem.reason})`, async () => {
    expect(netem.fix).toBeTruthy();
    await expect(setImpairment(ns('m1'), 'eth0', { delayMs: 100 })).rejects.toMatchObject({
      code: 'DRIVER_UNAVAILABLE',
    });
    await setImpairment(ns('m1'), 'eth0', null); // nothing to clear is fine
  });

  it('detaches, and deleting a namespace removes its veths at once', async () => {
    await detach(ns('netA'), 'v-m4');
    await detach(ns('netA'), 'v-m4');
    expect(await links(ns('m4'))).toEqual(['eth1', 'lo']);
    await deleteNetns(ns('m2'));
    expect(await links(ns('netA'))).toEqual(['br0', 'lo', 'v-m1']);
    // The name is free again straight away.
    await createNetns(ns('m2'));
    await attach({
      bridgeNetns: ns('netA'),
      machineNetns: ns('m2'),
      hostIf: 'v-m2',
      guestIf: 'eth0',
      address: '10.77.1.11/24',
    });
    expect((await ping('m1', '10.77.1.11')).code).toBe(0);
    await deleteNetns(ns('netC'));
    expect(await links(ns('m3'))).toEqual(['eth0', 'lo']);
    expect(await links(ns('m4'))).toEqual(['lo']);
  });
});

describe('wire and unwire a whole scenario', () => {
  const plan = (): WirePlan => ({
    networks: [{ netns: ns('w-front') }, { netns: ns('w-back'), bridge: 'br-back' }],
    machines: ['a', 'b', 'c', 'd'].map((m, i) => ({
      netns: ns(`w-${m}`),
      links: [
        { bridgeNetns: ns('w-front'), hostIf: `v-${m}`, guestIf: 'eth0', address: `10.77.1.${10 + i}/24` },
        ...(i < 2
          ? [{ bridgeNetns: ns('w-back'), hostIf: `v-${m}`, guestIf: 'eth1', address: `10.77.2.${10 + i}/24` }]
          : []),
      ],
    })),
  });
  const names = (p: WirePlan) => [...p.networks.map((n) => n.netns), ...p.machines.map((m) => m.netns)];

  afterEach(async () => {
    for (const n of await ours()) await deleteNetns(n);
  });

  it('raises four machines on two networks in one go, and removes them in one go', async () => {
    const p = plan();
    const t0 = performance.now();
    await wire(p);
    const wired = performance.now() - t0;
    expect(await ours()).toEqual(names(p).sort());
    expect((await run('ip', ['-n', ns('w-a'), '-o', 'link', 'show', 'lo'])).stdout).toMatch(/LOOPBACK,UP/);
    expect((await ping('w-a', '10.77.1.13')).code).toBe(0);
    expect((await ping('w-d', '10.77.2.10')).code).not.toBe(0); // d is not on the back network
    expect((await ping('w-b', '10.77.2.10')).code).toBe(0);
    const t1 = performance.now();
    await unwire(names(p));
    const unwired = performance.now() - t1;
    await unwire(names(p));
    expect(await ours()).toEqual([]);
    console.log(`wire 4 machines / 2 networks: ${wired.toFixed(1)} ms; unwire: ${unwired.toFixed(1)} ms`);
  });

  it('removes what it made when a step fails', async () => {
    const p = plan();
    p.machines[1]!.links[0]!.address = '10.77.1.10/24'; // same address as a: fine for ip, but ...
    p.machines[1]!.links[0]!.hostIf = 'v-a'; // ... the bridge-side name is taken
    const e = await wire(p).catch((x: unknown) => x);
    expect(isSnaplabError(e, 'HOST_COMMAND_FAILED')).toBe(true);
    expect(await ours()).toEqual([]);
    await createNetns(ns('w-c'));
    await expect(wire(plan())).rejects.toMatchObject({
      code: 'HOST_COMMAND_FAILED',
      hint: expect.stringMatching(/left over/),
    });
    expect(await ours()).toEqual([ns('w-c')]); // the one it did not make stays
  });
});
