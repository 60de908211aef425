/**
 * Egress (docs/egress.md), never touching a real network: the test makes its own "outside", a
 * network namespace with web servers and a DNS server on documentation addresses, and points
 * snaplab's uplink at it (SNAPLAB_UPLINK_NETNS). Machines run busybox's nc and nslookup.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Lab } from '../src/sdk/lab.js';
import { Daemon } from '../src/server/daemon.js';
import type { SandboxApi } from '../src/sdk/api.js';
import {
  homeTag,
  machineEgressNetns,
  routerNetns,
  slotOf,
  transit,
  uplinkTable,
} from '../src/host/net/egress-rules.js';
import { disposeLab, testLab } from './helpers.js';
import { noted } from '../src/cleanup.js';
import { cli, startDaemon, type TestDaemon } from './daemon-helpers.js';

const UP = `sltest-up-${process.pid}`;
const WEB = '203.0.113.10';
const OTHER = '203.0.113.20';
const DNS = '198.51.100.53';
const sh = (cmd: string, args: string[]): string => {
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')}: ${r.stderr}`);
  return r.stdout;
};
/** A machine's network namespace: its home's tag and the slot its address is in. */
const machineNs = (box: SandboxApi): string => machineEgressNetns(homeTag(lab!.home), slotOf(box.egress!.address));
/** What `f` gives once it gives something (every 100 ms, for at most 10 s). */
async function until<T>(f: () => Promise<T | undefined>, ms = 10_000): Promise<T> {
  for (let i = 0; i < ms / 100; i++) {
    const v = await f();
    if (v !== undefined) return v;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`not before ${ms} ms`);
}
const hostAddress = (): string =>
  /\binet (\d+\.\d+\.\d+\.\d+)\/\d+ .*scope global/.exec(sh('ip', ['-4', '-o', 'addr', 'show']))?.[1] ?? '';

let outside: ChildProcess | undefined;
let hostService: Server | undefined;
let hostHits = 0;
let lab: Lab | undefined;

/** What `nc` got from ADDR:PORT inside the machine, with its exit code and how long it took. */
async function fetchIn(box: SandboxApi, addr: string, port = 8080): Promise<{ ok: boolean; out: string; ms: number }> {
  const t0 = Date.now();
  const r = await box.exec(['sh', '-c', `printf 'GET /p HTTP/1.0\\r\\n\\r\\n' | nc -w 5 ${addr} ${port}`]);
  return { ok: r.exitCode === 0 && r.stdout.includes('outside'), out: r.stdout + r.stderr, ms: Date.now() - t0 };
}

beforeAll(async () => {
  sh('ip', ['netns', 'add', UP]);
  sh('ip', ['-n', UP, 'link', 'set', 'lo', 'up']);
  for (const a of [WEB, OTHER, DNS]) sh('ip', ['-n', UP, 'addr', 'add', `${a}/32`, 'dev', 'lo']);
  mkdirSync(`/etc/netns/${UP}`, { recursive: true });
  writeFileSync(`/etc/netns/${UP}/resolv.conf`, `nameserver ${DNS}\n`);
  outside = spawn(
    'ip',
    [
      'netns',
      'exec',
      UP,
      process.execPath,
      join(import.meta.dirname, 'egress-outside.mjs'),
      `${WEB},${OTHER}`,
      DNS,
      `web.test=${WEB},other.test=${OTHER}`,
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  await new Promise<void>((resolve, reject) => {
    outside!.stdout!.on('data', (b: Buffer) => b.toString().includes('ready') && resolve());
    outside!.once('exit', (c) => reject(new Error(`the outside exited (${c})`)));
  });
  // a service of the host's on loopback: nothing in a machine may reach it
  hostService = createServer((_q, res) => {
    hostHits++;
    res.end('host\n');
  });
  await new Promise<void>((r) => hostService!.listen(0, '127.0.0.1', r));
  process.env.SNAPLAB_UPLINK_NETNS = UP;
  lab = await testLab();
}, 60_000);

afterAll(async () => {
  await disposeLab(lab);
  delete process.env.SNAPLAB_UPLINK_NETNS;
  hostService?.close();
  outside?.kill('SIGKILL');
  spawnSync('ip', ['netns', 'del', UP]);
  rmSync(`/etc/netns/${UP}`, { recursive: true, force: true });
});

describe('egress', () => {
  it('is off by default: a machine has loopback only, and a connect fails at once', async () => {
    const box = await lab!.create();
    expect(box.egress).toBeNull();
    const r = await fetchIn(box, WEB);
    expect(r.ok).toBe(false);
    expect(r.ms).toBeLessThan(3000);
    await expect(box.egressUsage()).rejects.toMatchObject({ code: 'EGRESS_OFF' });
    await box.destroy();
  });

  it('reaches the outside by address and by name, through the router, and counts it', async () => {
    const box = await lab!.create({ egress: true });
    // each end of its link in the other's neighbour table for good: permanent entries are not
    // counted against the kernel's one table of every namespace (gc_thresh3), learned ones are, and
    // ~500 machines talking at once overflowed it (scripts/egress-neighbours.mjs)
    const slot = slotOf(box.egress!.address);
    expect(sh('ip', ['-n', machineNs(box), 'neigh', 'show', 'dev', 'eth0'])).toMatch(
      /^100\.96\.0\.1 lladdr ee:ee:ee:ee:ee:ee PERMANENT/m,
    );
    expect(sh('ip', ['-n', routerNetns(homeTag(lab!.home)), 'neigh', 'show', 'dev', `e${slot}`])).toMatch(
      new RegExp(`^${box.egress!.address.replace(/\./g, '\\.')} lladdr 02:5e:00:[0-9a-f:]{8} PERMANENT`, 'm'),
    );
    expect(box.egress).toMatchObject({ allow: [], deny: [] });
    expect(box.egress!.address).toMatch(/^100\.(9[6-9]|10\d|11[01])\./);
    expect((await fetchIn(box, WEB)).out).toContain(`outside ${WEB} /p`);
    expect((await fetchIn(box, 'web.test')).out).toContain(`outside ${WEB} /p`);
    const ns = await box.exec(['nslookup', 'other.test']);
    expect(ns.stdout).toContain(OTHER);
    // the outside sees the router's address, not the machine's
    const u = await box.egressUsage();
    expect(u.bytesOut).toBeGreaterThan(0);
    expect(u.connections).toBeGreaterThanOrEqual(2);
    await box.destroy();
  });

  it('denies the host, link-local (metadata) and private networks, and a host service on loopback', async () => {
    const box = await lab!.create({ egress: true });
    const port = (hostService!.address() as AddressInfo).port;
    for (const a of [hostAddress(), '169.254.169.254', '10.0.0.1', '192.168.1.1']) {
      const r = await fetchIn(box, a);
      expect(r.ok, a).toBe(false);
      expect(r.ms, `${a} is refused at once, not left to time out`).toBeLessThan(3000);
    }
    expect((await fetchIn(box, '127.0.0.1', port)).ok).toBe(false);
    expect(hostHits).toBe(0);
    expect((await box.egressUsage()).denied).toBeGreaterThanOrEqual(4);
    await box.destroy();
  });

  // the router's set of them is rewritten only when they change (egress-router.ts hostSetCurrent)
  it("takes in the host's addresses as they change: one added after the router was made is in its host set at the next create, and gone after its removal", async () => {
    const router = routerNetns(homeTag(lab!.home));
    const hostSet = (): string => sh('ip', ['netns', 'exec', router, 'nft', 'list', 'set', 'ip', 'snaplab', 'host']);
    const first = await lab!.create({ egress: true }); // the router there, its set written and noted
    const ADDED = '198.51.100.177'; // a documentation address, on the host's loopback for this case
    expect(hostSet()).not.toContain(ADDED);
    sh('ip', ['addr', 'add', `${ADDED}/32`, 'dev', 'lo']);
    try {
      const second = await lab!.create({ egress: true });
      expect(hostSet()).toContain(ADDED);
      await second.destroy();
    } finally {
      sh('ip', ['addr', 'del', `${ADDED}/32`, 'dev', 'lo']);
    }
    const third = await lab!.create({ egress: true });
    expect(hostSet()).not.toContain(ADDED);
    // a router noted by a build that does not write this set's note (its ready note without the
    // token: a daemon not yet restarted after an upgrade), which may make it again under the same
    // namespace inode with another set (here: empty): the set is written at every create then
    const readyNote = join(lab!.home, 'run', 'egress.ready');
    const untokened = `${readFileSync(readyNote, 'utf8').split(' ')[0]}\n`;
    writeFileSync(readyNote, untokened);
    const fourth = await lab!.create({ egress: true });
    sh('ip', ['netns', 'exec', router, 'nft', 'flush', 'set', 'ip', 'snaplab', 'host']);
    writeFileSync(readyNote, untokened);
    expect(hostSet()).not.toContain(hostAddress());
    const fifth = await lab!.create({ egress: true });
    expect(hostSet()).toContain(hostAddress());
    await Promise.all([first, third, fourth, fifth].map((b) => b.destroy()));
  });

  it('keeps to an allow list, a deny list, and deny over allow; host names are resolved', async () => {
    const allow = await lab!.create({ egress: { allow: [WEB] } });
    expect((await fetchIn(allow, WEB)).ok).toBe(true);
    expect((await fetchIn(allow, OTHER)).ok).toBe(false);
    const deny = await lab!.create({ egress: { deny: [`${OTHER}/32`] } });
    expect((await fetchIn(deny, WEB)).ok).toBe(true);
    expect((await fetchIn(deny, OTHER)).ok).toBe(false);
    const both = await lab!.create({ egress: { allow: ['203.0.113.0/24'], deny: [OTHER] } });
    expect((await fetchIn(both, WEB)).ok).toBe(true);
    expect((await fetchIn(both, OTHER)).ok).toBe(false);
    const named = await lab!.create({ egress: { allow: ['web.test'] } });
    expect(named.egress!.allow).toEqual(['web.test']);
    expect((await fetchIn(named, 'web.test')).ok).toBe(true);
    expect((await fetchIn(named, OTHER)).ok).toBe(false);
    // an allow list does not open the host's private networks unless it names them
    expect((await fetchIn(allow, hostAddress())).ok).toBe(false);
    for (const b of [allow, deny, both, named]) await b.destroy();
  });

  it('changes the lists of a running machine at once', async () => {
    const box = await lab!.create({ egress: true });
    expect((await fetchIn(box, OTHER)).ok).toBe(true);
    await box.setEgress({ deny: [OTHER] });
    expect(box.egress!.deny).toEqual([OTHER]);
    expect((await fetchIn(box, OTHER)).ok).toBe(false);
    expect((await fetchIn(box, WEB)).ok).toBe(true);
    await box.setEgress({ allow: [OTHER] });
    expect((await fetchIn(box, OTHER)).ok).toBe(true);
    expect((await fetchIn(box, WEB)).ok).toBe(false);
    const again = await lab!.get(box.name);
    expect(again.egress).toMatchObject({ allow: [OTHER], deny: [] });
    await expect(box.setEgress({ allow: ['not an address!'] })).rejects.toMatchObject({ code: 'BAD_INPUT' });
    await expect(box.setEgress({ allow: ['nowhere.test'] })).rejects.toMatchObject({ code: 'BAD_INPUT' });
    await box.destroy();
  });

  it('a wide allow entry (0.0.0.0/0) opens neither other machines nor the host, metadata or private networks', async () => {
    const wide = await lab!.create({ egress: { allow: ['0.0.0.0/0'] } });
    const other = await lab!.create({ egress: true });
    expect((await fetchIn(wide, WEB)).ok).toBe(true);
    for (const a of [other.egress!.address, hostAddress(), '169.254.169.254', '10.0.0.1', '100.127.0.1'])
      expect((await fetchIn(wide, a)).ok, a).toBe(false);
    // a private range named on purpose is opened (the outside has none: refused there, not here)
    const named = await lab!.create({ egress: { allow: ['10.99.0.0/16'] } });
    const before = (await named.egressUsage()).denied;
    await fetchIn(named, '10.99.1.1');
    expect((await named.egressUsage()).denied).toBe(before);
    for (const b of [wide, other, named]) await b.destroy();
  });

  it('a list change cuts a connection already open to what it no longer allows', async () => {
    const box = await lab!.create({ egress: true });
    const p = await box.spawn(['sh', '-c', `(echo first; sleep 2; echo second) | nc -w 4 ${WEB} 7000`]);
    await new Promise((r) => setTimeout(r, 800));
    await box.setEgress({ deny: [WEB] });
    const r = await p.result;
    expect(r.stdout).toContain('first');
    expect(r.stdout).not.toContain('second');
    await box.destroy();
  });

  it("holds against the machine's own network namespace rewritten: a new address and routes do not pass the router", async () => {
    const box = await lab!.create({ egress: { allow: [WEB] } });
    const other = await lab!.create({ egress: true });
    // a machine's root cannot rewrite it here (no CAP_NET_ADMIN)…
    const tried = await box.exec(['ip', 'addr', 'flush', 'dev', 'eth0']);
    expect(tried.exitCode).not.toBe(0);
    // …and a system machine's could: the host's root, which can do all that and more, does it here
    const ns = machineNs(box);
    const inNs = (cmd: string): ReturnType<typeof spawnSync> =>
      spawnSync('ip', ['netns', 'exec', ns, 'sh', '-c', cmd], { encoding: 'utf8' });
    const spoof = inNs(
      `ip addr flush dev eth0 && ip addr add ${other.egress!.address}/32 dev eth0 && ip route add 100.96.0.1/32 dev eth0 && ip route add default via 100.96.0.1 && nft flush ruleset`,
    );
    expect(spoof.status, String(spoof.stderr)).toBe(0);
    const get = (a: string): boolean =>
      inNs(`printf 'GET /p HTTP/1.0\\r\\n\\r\\n' | busybox nc -w 3 ${a} 8080`).stdout?.includes('outside') === true;
    expect(get(OTHER)).toBe(false);
    expect(get(WEB)).toBe(false); // not even what its list allows, from a stolen address
    expect((await fetchIn(other, OTHER)).ok).toBe(true); // the machine whose address it took is unharmed
    await box.destroy();
    await other.destroy();
  });

  it("a pool's standbys carry its lists; one handed back is given them again, its counters from zero", async () => {
    const pool = await lab!.createPool({
      name: 'out',
      image: 'busybox',
      size: 1,
      limits: {},
      egress: { allow: [WEB] },
    });
    try {
      const get = `printf 'GET /p HTTP/1.0\\r\\n\\r\\n' | nc -w 3`;
      const first = await pool.run(['sh', '-c', `${get} ${WEB} 8080; ${get} ${OTHER} 8080 || echo refused`]);
      expect(first.stdout).toContain(`outside ${WEB}`);
      expect(first.stdout).toContain('refused');
      expect(first.recycled).toBe(true);
      // while a run holds the standby, its lists are opened up; handed back, it has the pool's again
      const running = pool.run(['sleep', '3']);
      const taken = await until(async () =>
        (await lab!.list()).find((b) => b.state === 'running' && b.egress !== null),
      );
      await taken.setEgress({ allow: [OTHER] });
      expect((await running).recycled).toBe(true);
      const back = (await lab!.list()).find((b) => b.id === taken.id)!;
      expect(back.egress).toMatchObject({ allow: [WEB], deny: [] });
      expect(await back.egressUsage()).toMatchObject({ bytesOut: 0, connections: 0, denied: 0 });
      // a pool this process keeps (a daemon's) resets the firewall after the run's answer, not before
      const standbys = (await lab!.list()).filter((b) => b.state === 'paused' && b.egress !== null);
      expect(standbys).toHaveLength(1); // the one the next run takes
      pool.start();
      const kept = pool.run(['sh', '-c', `sleep 3; ${get} ${WEB} 8080`]);
      const held = await until(async () =>
        (await lab!.list()).find((b) => b.id === standbys[0]!.id && b.state === 'running'),
      );
      await held.setEgress({ allow: [OTHER] });
      const answer = await kept;
      expect(answer.recycled).toBe(true);
      expect(answer.trace.phases.map((p) => p.name)).not.toContain('egress reset');
      const again = await until(async () => {
        const b = (await lab!.list()).find((x) => x.id === held.id);
        return b?.state === 'paused' ? b : undefined;
      });
      expect(again.egress).toMatchObject({ allow: [WEB], deny: [] });
      expect(await again.egressUsage()).toMatchObject({ bytesOut: 0, connections: 0, denied: 0 });
      await pool.stop();
    } finally {
      await pool.remove();
    }
  });

  it("a scenario network's uplink: its machines reach out as its lists allow, across a standby reset; down and gc leave nothing", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'snaplab-test-egress-'));
    const file = join(dir, 'up.yaml');
    writeFileSync(
      file,
      `name: upl
networks:
  lan: { subnet: 10.79.1.0/24, uplink: { allow: [${WEB}] } }
  back: { subnet: 10.79.2.0/24 }
machines:
  a: { networks: { lan: { address: 10.79.1.10 }, back: { address: 10.79.2.10 } } }
  b: { networks: { back: { address: 10.79.2.20 } } }
  c: { driver: qemu, networks: { lan: { address: 10.79.1.30 } } }
`,
    );
    try {
      const s = await lab!.up(file);
      const get = async (m: string, addr: string): Promise<boolean> => (await fetchIn(await s.machine(m), addr)).ok;
      expect(await get('a', WEB)).toBe(true);
      expect(await get('a', OTHER)).toBe(false);
      expect(await get('b', WEB)).toBe(false); // not on the uplink's network: no egress
      expect(await get('c', WEB)).toBe(true); // a VM: its guest through a tap beside its network's
      expect(await get('c', OTHER)).toBe(false);
      expect((await (await s.machine('c')).exec(['ping', '-c1', '-W2', '10.79.1.10'])).exitCode).toBe(0);
      // its scenario links are as they were: a reaches b over back
      expect((await (await s.machine('a')).exec(['ping', '-c1', '-W2', '10.79.2.20'])).exitCode).toBe(0);
      await s.snapshot('base');
      const ready = async (): Promise<string | undefined> =>
        (await s.status()).standby?.state === 'ready' ? 'ready' : undefined;
      await until(ready, 60_000);
      expect((await s.reset()).standby).toBe('swapped');
      expect(await get('a', WEB)).toBe(true);
      expect(await get('a', OTHER)).toBe(false);
      expect(await get('c', WEB)).toBe(true);
      expect(await get('c', OTHER)).toBe(false);
      // a reset without a standby raises each machine again in its namespace: the old link goes first
      expect((await s.reset(undefined, { standby: 0 })).standby).not.toBe('swapped');
      expect(await get('a', WEB)).toBe(true);
      expect(await get('c', WEB)).toBe(true);
      expect(await get('c', OTHER)).toBe(false);
      await s.down();
      await lab!.gc();
      expect(sh('ip', ['netns', 'list'])).not.toContain(routerNetns(homeTag(lab!.home)));
    } finally {
      for (const x of lab!.scenarios()) await x.down().catch(noted(`take ${x.name} down`));
      rmSync(dir, { recursive: true, force: true });
    }
  }, 180_000);

  it("a VM's guest reaches out through a tap in its namespace, as its lists allow; a memory snapshot continues with egress only", async () => {
    const vm = await lab!.create({ driver: 'qemu', egress: { deny: [OTHER] }, name: 'vm-out' });
    try {
      expect(vm.egress!.address).toMatch(/^100\.(9[6-9]|10\d|11[01])\./);
      // the guest's own address is the same in every VM; the router sees the slot's
      expect((await vm.exec(['ip', '-4', '-o', 'addr', 'show'])).stdout.toString()).toContain('100.126.0.2/30');
      expect((await fetchIn(vm, WEB)).out).toContain(`outside ${WEB} /p`);
      expect((await fetchIn(vm, 'web.test')).out).toContain(`outside ${WEB} /p`);
      for (const a of [OTHER, hostAddress(), '169.254.169.254']) expect((await fetchIn(vm, a)).ok, a).toBe(false);
      // the guest's ARP requests from made-up senders put nothing in the host's one neighbour table
      // (without the tap's ARP rule: one STALE entry each in its namespace, counted host-wide)
      const probe = join(tmpdir(), `sltest-arp-${process.pid}`);
      const built = spawnSync('gcc', ['-O2', '-static', '-o', probe, join(import.meta.dirname, 'egress-flood.c')], {
        encoding: 'utf8',
      });
      try {
        expect(built.status, built.stderr).toBe(0);
        await vm.putFile('/flood', readFileSync(probe), 0o755);
      } finally {
        rmSync(probe, { force: true });
      }
      expect((await vm.exec(['/flood', 'arp', '100.126.0.1', '300'])).stdout.toString()).toMatch(/^ok 300 /);
      const vmNs = machineEgressNetns(homeTag(lab!.home), slotOf(vm.egress!.address));
      expect(
        sh('ip', ['-n', vmNs, 'neigh', 'show'])
          .split('\n')
          .filter((l) => l.startsWith('10.200.')),
      ).toEqual([]);
      expect((await fetchIn(vm, WEB)).ok).toBe(true);
      const u = await vm.egressUsage();
      expect(u.connections).toBeGreaterThanOrEqual(2);
      expect(u.denied).toBeGreaterThanOrEqual(3);
      await vm.snapshot('vm-out-mem', { memory: true });
      await expect(lab!.restore('vm-out-mem', { name: 'vm-out-bare' })).rejects.toMatchObject({
        code: 'BAD_INPUT',
        hint: expect.stringContaining('--egress'),
      });
      const again = await lab!.restore('vm-out-mem', { name: 'vm-out-r', egress: { allow: [], deny: [] } });
      try {
        // its own lists on another slot: what the first one's deny list refused, it reaches
        expect((await fetchIn(again, OTHER)).out).toContain(`outside ${OTHER} /p`);
      } finally {
        await again.destroy();
      }
    } finally {
      await vm.destroy();
      await lab!.removeSnapshot('vm-out-mem').catch(noted('remove vm-out-mem'));
    }
    expect(sh('ip', ['netns', 'list'])).not.toMatch(new RegExp(`${routerNetns(homeTag(lab!.home))}-\\d`));
  }, 300_000);

  it("a pool of VM standbys with egress: each taken one reaches out as the pool's lists allow", async () => {
    const pool = await lab!.createPool({
      name: 'vm-eg',
      image: 'busybox',
      size: 1,
      driver: 'qemu',
      limits: {},
      egress: { allow: [WEB], deny: [] },
    });
    try {
      const box = await lab!.create({ pool: 'vm-eg' }); // a standby: a restore of the pool's booted VM
      try {
        expect(box.egress).toMatchObject({ allow: [WEB] });
        expect((await fetchIn(box, WEB)).out).toContain(`outside ${WEB} /p`);
        expect((await fetchIn(box, OTHER)).ok).toBe(false);
      } finally {
        await box.destroy();
      }
    } finally {
      await pool.remove();
    }
  }, 300_000);

  it('goes through a daemon: create with lists, GET and PUT /sandboxes/:id/egress, the CLI', async () => {
    let d: TestDaemon | undefined;
    try {
      d = await startDaemon(lab!.home);
      const remote = await Lab.connect({ url: `unix:${d.socket}` });
      const box = await remote.create({ egress: { allow: [WEB] }, timeoutS: 0 });
      expect(box.egress).toMatchObject({ allow: [WEB], deny: [] });
      expect((await fetchIn(box, WEB)).ok).toBe(true);
      await box.setEgress({ allow: [OTHER] });
      expect(box.egress!.allow).toEqual([OTHER]);
      expect((await fetchIn(box, WEB)).ok).toBe(false);
      const u = await box.egressUsage();
      expect(u).toMatchObject({ address: box.egress!.address, allow: [OTHER] });
      expect(u.denied).toBeGreaterThan(0);
      // a bad list is the schema's 400, or the lab's BAD_INPUT: refused either way, nothing made
      const bad = spawnSync(
        'curl',
        [
          '-sS',
          '--unix-socket',
          d.socket,
          '-H',
          'content-type: application/json',
          '-d',
          '{"egress":{"allow":["300.1.2.3"]}}',
          'http://x/sandboxes',
        ],
        { encoding: 'utf8' },
      );
      expect(JSON.parse(bad.stdout)).toMatchObject({ code: 'BAD_INPUT' });
      const shown = cli(lab!.home, ['egress', box.name, '--deny', WEB, '--json'], undefined, {
        SNAPLAB_HOST: `unix:${d.socket}`,
      });
      expect(shown.code, shown.err).toBe(0);
      expect(JSON.parse(shown.out)).toMatchObject({ allow: [OTHER], deny: [WEB] });
      // ls says so, through the daemon (the C command) and embedded (Node) alike
      for (const env of [{ SNAPLAB_HOST: `unix:${d.socket}` }, {}] as Record<string, string>[]) {
        const ls = cli(lab!.home, ['ls'], undefined, env);
        expect(ls.out.split('\n').find((l) => l.includes(box.name))).toMatch(/ egress$/);
      }
      // the daemon's metrics sum them over the machines there are
      const metrics = spawnSync('curl', ['-sS', '--unix-socket', d.socket, 'http://x/metrics'], {
        encoding: 'utf8',
      }).stdout;
      expect(metrics).toMatch(/^snaplab_egress_machines [1-9]\d*$/m);
      expect(Number(/^snaplab_egress_bytes_out (\d+)$/m.exec(metrics)?.[1])).toBeGreaterThan(0);
      expect(Number(/^snaplab_egress_denied (\d+)$/m.exec(metrics)?.[1])).toBeGreaterThan(0);
      expect((await remote.list()).map((b) => b.name)).toContain(box.name);
      await box.destroy();
    } finally {
      await d?.stop();
    }
  });

  it('a key made with --no-egress: egress refused (403, limit egress) on every path, sandboxes without it made; E2B defaults to none', async () => {
    const home = lab!.home;
    const key = (name: string, ...flags: string[]): string => {
      const r = cli(home, ['key', 'create', name, '--e2b', ...flags]);
      expect(r.code, r.err).toBe(0);
      return r.out.trim();
    };
    const closed = key('closed', '--no-egress');
    const open = key('open');
    const ls = cli(home, ['key', 'ls']).out.split('\n');
    expect(ls.find((l) => l.startsWith('closed '))).toMatch(/ no-egress /);
    expect(ls.find((l) => l.startsWith('open '))).not.toMatch(/no-egress/);
    expect(cli(home, ['pool', 'create', 'outward', '--size', '0', '--egress']).code).toBe(0);
    let d: TestDaemon | undefined;
    const made: SandboxApi[] = [];
    try {
      d = await startDaemon(home, ['--e2b-listen', '127.0.0.1:0']);
      const raw = await fetch(`${d.url}/sandboxes`, {
        method: 'POST',
        headers: { authorization: `Bearer ${closed}`, 'content-type': 'application/json' },
        body: JSON.stringify({ egress: true }),
      });
      expect(raw.status).toBe(403);
      expect(await raw.json()).toMatchObject({
        code: 'FORBIDDEN',
        limit: 'egress',
        hint: expect.stringMatching(/leave out egress/),
      });
      const refused = { code: 'FORBIDDEN', limit: 'egress' };
      const c = await Lab.connect({ url: d.url, token: closed });
      await expect(c.create({ egress: { allow: [WEB] } })).rejects.toMatchObject(refused);
      await expect(c.create({ pool: 'outward' })).rejects.toMatchObject({
        ...refused,
        message: expect.stringMatching(/pool outward/),
      });
      const box = await c.create({ timeoutS: 0 });
      made.push(box);
      expect(box.egress).toBeNull();
      await expect(box.setEgress({ allow: [WEB] })).rejects.toMatchObject(refused);
      await box.snapshot('closed-snap');
      await expect(c.restore('closed-snap', { egress: true })).rejects.toMatchObject(refused);
      // a key made without the flag still has egress
      const outward = await (await Lab.connect({ url: d.url, token: open })).create({ egress: true, timeoutS: 0 });
      made.push(outward);
      expect((await fetchIn(outward, WEB)).ok).toBe(true);
      // E2B's default (internet access) is this key's default, none; asked for, it is refused
      const { Sandbox } = await import('e2b');
      const opts = { apiKey: closed, apiUrl: d.e2bUrl, sandboxUrl: d.e2bUrl };
      // a create is one create: the front reads the key's ceiling once (GET /whoami), it does not
      // learn it from a refused create (the daemon's count of 403s on /sandboxes stays)
      const daemonUrl = d.url;
      const refusedCreates = async (): Promise<number> => {
        const m = await (
          await fetch(`${daemonUrl}/metrics`, { headers: { authorization: `Bearer ${closed}` } })
        ).text();
        return Number(/^snaplab_http_requests_total\{route="\/sandboxes",status="403"\} (\d+)$/m.exec(m)?.[1] ?? 0);
      };
      const refusedBefore = await refusedCreates();
      expect(refusedBefore).toBeGreaterThan(0); // the refusals above are counted there
      const sbx = await Sandbox.create('busybox', opts);
      try {
        expect((await c.get(sbx.sandboxId)).egress).toBeNull();
        expect((await sbx.getInfo()).allowInternetAccess).toBe(false);
      } finally {
        await sbx.kill();
      }
      // true is what SDKs before 2.15 send on every create: this key's default, none, and said so
      const asked = await Sandbox.create('busybox', { ...opts, allowInternetAccess: true });
      try {
        expect((await asked.getInfo()).allowInternetAccess).toBe(false);
      } finally {
        await asked.kill();
      }
      expect(await refusedCreates()).toBe(refusedBefore);
      await expect(Sandbox.create('busybox', { ...opts, network: { allowOut: [WEB] } })).rejects.toThrow(
        /^403: .*egress/,
      );
    } finally {
      for (const b of made) await b.destroy();
      await lab!.removeSnapshot('closed-snap').catch(noted('remove the test snapshot'));
      cli(home, ['pool', 'rm', 'outward']);
      await d?.stop();
    }
  }, 120_000);

  it('an rm whose egress rules cannot be removed leaves the sandbox dead with why, and a later rm finishes', async () => {
    const box = await lab!.create({ name: 'stuck-rules', egress: {} });
    const router = routerNetns(homeTag(lab!.home));
    const chain = `m${slotOf(box.egress!.address)}`;
    // a chain of someone else's that jumps to the machine's: nft refuses to delete the machine's (EBUSY)
    const nft = (script: string): void => {
      const r = spawnSync('ip', ['netns', 'exec', router, 'nft', '-f', '-'], { input: script, encoding: 'utf8' });
      expect(r.status, r.stderr).toBe(0);
    };
    nft(`add chain ip snaplab holder\nadd rule ip snaplab holder jump ${chain}\n`);
    await expect(box.destroy()).rejects.toThrow(/egress/);
    // its volume went with the egress link's removal under way: not left `removing` by a live process
    const left = (await lab!.list()).find((b) => b.name === 'stuck-rules');
    expect([left?.state, left?.reason]).toEqual([
      'dead',
      expect.stringMatching(/^removal failed: .*snaplab rm stuck-rules/),
    ]);
    nft('delete chain ip snaplab holder\n');
    await (await lab!.get('stuck-rules')).destroy();
    expect((await lab!.list()).some((b) => b.name === 'stuck-rules')).toBe(false);
    expect(sh('ip', ['netns', 'exec', router, 'nft', 'list', 'table', 'ip', 'snaplab'])).not.toContain(
      `chain ${chain} `,
    );
  });

  it('leaves nothing after a create killed at any point, once gc has run', async () => {
    const tag = homeTag(lab!.home);
    for (const delay of [30, 80, 140, 200, 260, 330]) {
      const p = spawn(
        process.execPath,
        [join(import.meta.dirname, '..', 'dist', 'bin', 'snaplab.js'), 'create', '--egress'],
        {
          env: { ...process.env, SNAPLAB_HOME: lab!.home },
          stdio: 'ignore',
        },
      );
      const exited = new Promise((r) => p.once('exit', r));
      await new Promise((r) => setTimeout(r, delay));
      p.kill('SIGKILL'); // (a create done by then is removed below)
      await exited;
    }
    for (const b of await lab!.list()) await b.destroy();
    await lab!.gc();
    const netns = sh('ip', ['netns', 'list']);
    expect(netns).not.toContain(routerNetns(tag));
    expect(sh('ip', ['netns', 'exec', UP, 'nft', 'list', 'tables'])).not.toContain(uplinkTable(tag));
    expect(sh('ip', ['-n', UP, '-o', 'link', 'show'])).not.toContain(`sle${tag}`);
    expect(sh('ip', ['netns', 'exec', UP, 'sysctl', '-n', 'net.ipv4.ip_forward']).trim()).toBe('0');
  }, 180_000);

  // it turned the uplink's forwarding on, failed at its first rule, and left forwarding on (a
  // stock host's E2B create with internet access, test/stock-host.test.ts)
  it('a create with egress on a host without nftables says what to install and changes nothing there', async () => {
    const tag = homeTag(lab!.home);
    const forwarding = (): string => sh('ip', ['netns', 'exec', UP, 'sysctl', '-n', 'net.ipv4.ip_forward']).trim();
    expect(forwarding()).toBe('0');
    const before = (await lab!.list()).length;
    // this process's PATH without nft: links to every other program on it (the lab finds them
    // there; the first of a name wins, as on PATH, a broken link's name included)
    const bare = mkdtempSync(join(tmpdir(), 'sltest-no-nft-'));
    const path = process.env.PATH ?? '';
    try {
      const linked = new Set<string>(['nft']);
      for (const dir of path.split(':').filter((d) => d && existsSync(d)))
        for (const f of readdirSync(dir))
          if (!linked.has(f)) {
            linked.add(f);
            symlinkSync(join(dir, f), join(bare, f));
          }
      process.env.PATH = bare;
      await expect(lab!.create({ egress: {} })).rejects.toMatchObject({
        code: 'MISSING_TOOL',
        hint: expect.stringMatching(/^apt-get install nftables/),
      });
    } finally {
      process.env.PATH = path;
      rmSync(bare, { recursive: true, force: true });
    }
    expect(forwarding()).toBe('0');
    expect(sh('ip', ['netns', 'list'])).not.toContain(routerNetns(tag));
    expect(sh('ip', ['-n', UP, '-o', 'link', 'show'])).not.toContain(`sle${tag}`);
    expect((await lab!.list()).length).toBe(before);
  }, 60_000);

  // docs/egress.md "Flows": every connection a machine opens is tracked by the uplink's (the host's)
  // table too, M entries for all of the host's own connections; one machine filled it at line rate
  describe('caps on connections', () => {
    const flood = join(tmpdir(), `sltest-egress-flood-${process.pid}`);
    beforeAll(() => {
      const built = spawnSync('gcc', ['-O2', '-static', '-o', flood, join(import.meta.dirname, 'egress-flood.c')], {
        encoding: 'utf8',
      });
      if (built.status !== 0) throw new Error(`gcc egress-flood.c: ${built.stderr}`);
    });
    afterAll(() => rmSync(flood, { force: true }));

    /** A lab of its own whose router and machines are made with these caps (SNAPLAB_EGRESS_CAPS). */
    async function capped<T>(caps: string, f: (l: Lab) => Promise<T>): Promise<T> {
      const l = await testLab();
      process.env.SNAPLAB_EGRESS_CAPS = caps;
      try {
        return await f(l);
      } finally {
        delete process.env.SNAPLAB_EGRESS_CAPS;
        await disposeLab(l);
      }
    }
    const withFlood = async (l: Lab): Promise<SandboxApi> => {
      const box = await l.create({ egress: true });
      await box.putFile('/flood', readFileSync(flood), 0o755);
      return box;
    };
    /** The uplink's tracked connections of this protocol from a home's router (/proc/net/nf_conntrack's lines). */
    const tracked = (home: string, proto: 'udp' | 'tcp'): string[] =>
      sh('ip', ['netns', 'exec', UP, 'cat', '/proc/net/nf_conntrack'])
        .split('\n')
        .filter((l) => new RegExp(`^ipv4 +2 ${proto} .*?src=${transit(homeTag(home)).router} `).test(l));
    /** The uplink's established connections to the outside's echo port (7000), from this lab's router. */
    const echoOpen = (): string[] => tracked(lab!.home, 'tcp').filter((l) => / ESTABLISHED .* dport=7000 /.test(l));
    /** The router's own entries of a machine's connections to the echo port. */
    const routedToEcho = (box: SandboxApi): string[] =>
      sh('ip', ['netns', 'exec', routerNetns(homeTag(lab!.home)), 'cat', '/proc/net/nf_conntrack'])
        .split('\n')
        .filter((l) => l.includes(`src=${box.egress!.address} `) && / dport=7000 /.test(l));
    /** The FINs and resets of the machine in `slot` go nowhere, as a system machine's root can make them. */
    const dropClosings = (slot: number): void => {
      sh('ip', [
        'netns',
        'exec',
        routerNetns(homeTag(lab!.home)),
        'nft',
        'insert',
        'rule',
        'ip',
        'snaplab',
        `m${slot}`,
        'tcp flags & (fin | rst) != 0 drop',
      ]);
    };
    const ran = async (box: SandboxApi, argv: string[]): Promise<{ ok: number; refused: number }> => {
      const r = await box.exec(argv);
      const m = /ok (\d+) refused (\d+)/.exec(r.stdout);
      if (!m) throw new Error(`egress-flood: ${r.stdout}${r.stderr}`);
      return { ok: Number(m[1]), refused: Number(m[2]) };
    };

    it("a machine's new connections over its rate are refused: a flood leaves its burst in the host's table, and its neighbour goes on", async () => {
      const home = await capped('1/20/1000,1000/1000', async (l) => {
        const box = await withFlood(l);
        const other = await l.create({ egress: true });
        await ran(box, ['/flood', 'udp', WEB, '300']);
        // (without the cap: all 300)
        const n = tracked(l.home, 'udp').length;
        expect(n).toBeGreaterThanOrEqual(20);
        expect(n).toBeLessThanOrEqual(25);
        expect((await box.egressUsage()).denied).toBeGreaterThanOrEqual(270);
        expect((await fetchIn(other, WEB)).ok).toBe(true);
        // new lists keep what the cap counted (each change gave a full burst again): to another address
        await box.setEgress({ allow: [], deny: ['198.51.100.99'] });
        await ran(box, ['/flood', 'udp', OTHER, '300']);
        expect(tracked(l.home, 'udp').length - n).toBeLessThanOrEqual(8);
        // flows of the router's own, which no machine's forget covers: the router's removal's
        const own = spawnSync('ip', ['netns', 'exec', routerNetns(homeTag(l.home)), flood, 'udp', DNS, '5'], {
          encoding: 'utf8',
        });
        expect(own.stdout).toMatch(/ok 5 /);
        expect(tracked(l.home, 'udp').filter((x) => x.includes(`dst=${DNS} `))).toHaveLength(5);
        return l.home;
      });
      // the router gone (gc, with its last machine), so are its flows in the host's table (without
      // that: its own 5, for the rest of their 30 s)
      expect(tracked(home, 'udp')).toEqual([]);
    }, 120_000);

    it("a removed machine's connections leave the host's table with it, even ones whose end never reached the outside", async () => {
      const box = await withFlood(lab!);
      const before = echoOpen().length;
      dropClosings(slotOf(box.egress!.address));
      await box.spawn(['/flood', 'tcp', WEB, '7000', '5', '60']);
      await until(async () => (echoOpen().length >= before + 5 ? true : undefined));
      await box.destroy();
      // (without: 5 more, for the uplink's established timeout, 5 days; with: gone within moments)
      await until(async () => (echoOpen().length <= before ? true : undefined), 5000);
    }, 60_000);

    it('a reset that would die at the router (a TTL of 1) is dropped before its table sees it: the connection stays counted, and goes with its machine', async () => {
      const box = await withFlood(lab!);
      const before = echoOpen().length;
      expect(await ran(box, ['/flood', 'rst1', WEB, '7000', '3'])).toEqual({ ok: 3, refused: 0 });
      const routed = routedToEcho(box);
      expect(routed).toHaveLength(3);
      // (without: CLOSE, no longer counted as open, its entry gone in 10 s, the host's left established)
      for (const l of routed) expect(l).toMatch(/ ESTABLISHED /);
      expect(echoOpen().length).toBe(before + 3);
      await box.destroy();
      await until(async () => (echoOpen().length <= before ? true : undefined), 5000);
    }, 60_000);

    it('a reset in a frame to everyone (which a router does not forward) is dropped before its table sees it', async () => {
      const box = await withFlood(lab!);
      try {
        // (AF_PACKET on eth0: a sandbox holds CAP_NET_RAW in its own namespace)
        await box.exec(['sh', '-c', `/flood rstbcast ${WEB} 7000 4 > /tmp/rb 2>&1 &`]);
        await until(
          async () => ((await box.exec(['cat', '/tmp/rb'])).stdout.includes('sent') ? true : undefined),
          5000,
        );
        const routed = routedToEcho(box);
        expect(routed, (await box.exec(['cat', '/tmp/rb'])).stdout).toHaveLength(1);
        // (without: CLOSE in the router's table, the host's left established)
        expect(routed[0]).toMatch(/ ESTABLISHED /);
      } finally {
        await box.destroy();
      }
    }, 60_000);

    it("a standby handed back: its last user's connections leave the host's table", async () => {
      const pool = await lab!.createPool({ name: 'flows', image: 'busybox', size: 1, limits: {}, egress: {} });
      try {
        const standby = await until(async () =>
          (await lab!.list()).find((b) => b.pool === 'flows' && b.state === 'paused' && b.egress !== null),
        );
        const before = echoOpen().length;
        dropClosings(slotOf(standby.egress!.address));
        // (ended before the run does: a standby with processes left is not handed back, it is removed)
        const run = await pool.run([
          'sh',
          '-c',
          `for i in 1 2 3; do (sleep 30 | nc ${WEB} 7000 &); done; sleep 1; killall nc sleep; sleep 0.2`,
        ]);
        expect(run.recycled).toBe(true);
        // (without: 3 more, for the uplink's established timeout, 5 days; with: gone within moments)
        await until(async () => (echoOpen().length <= before ? true : undefined), 5000);
      } finally {
        await pool.remove();
      }
    }, 60_000);

    it("connections whose closing the router took in and then refused (a list changed under them) leave the host's table at the next sweep: a daemon's every minute, gc's", async () => {
      const box = await withFlood(lab!);
      // a neighbour's live connections, which no sweep may take
      const live = await withFlood(lab!);
      const daemonLab = await Lab.open({ home: lab!.home });
      const d = new Daemon(daemonLab, { tickMs: 3_600_000 });
      try {
        const idle = echoOpen().length;
        await live.spawn(['/flood', 'tcp', WEB, '7000', '3', '600']);
        await until(async () => (echoOpen().length >= idle + 3 ? true : undefined));
        await d.start();
        /** Connections held to the outside, then cut: the outside denied, the holder killed (its FINs refused after the router's table took them). */
        const leak = async (): Promise<number> => {
          const before = echoOpen().length;
          await box.setEgress({ allow: [], deny: [] });
          await box.spawn(['/flood', 'tcp', WEB, '7000', '4', '600']);
          await until(async () => (echoOpen().length >= before + 4 ? true : undefined));
          await box.setEgress({ allow: [], deny: [WEB] });
          await box.exec(['killall', 'flood']);
          // the router's entries closed (its reset back to the machine) and, 10 s on, gone
          await until(async () => (routedToEcho(box).length === 0 ? true : undefined), 30_000);
          // the host's are still there (the leak the sweep is for: without it, for 5 days)
          expect(echoOpen().length).toBe(before + 4);
          return before;
        };
        const first = await leak();
        // a daemon's tick sweeps at its full checks: every 60th tick (the first was start's)
        for (let i = 0; i < 59; i++) await d.tick();
        await d.swept();
        expect(echoOpen().length).toBe(first + 4);
        await d.tick();
        await d.swept();
        expect(echoOpen().length).toBe(first);
        // gc sweeps too, and says so
        const second = await leak();
        const gc = await lab!.gc();
        expect(gc.removed).toContainEqual(expect.stringMatching(/^4 flows of egress router .* the router had ended$/));
        expect(echoOpen().length).toBe(second);
        // the neighbour's are there still, in both tables
        expect(routedToEcho(live).filter((l) => / ESTABLISHED /.test(l))).toHaveLength(3);
      } finally {
        d.close();
        await box.destroy();
        await live.destroy();
      }
    }, 180_000);

    it("ARP requests from made-up senders put nothing in the host's one neighbour table", async () => {
      const box = await withFlood(lab!);
      const neighbours = (): string[] =>
        sh('ip', ['-n', routerNetns(homeTag(lab!.home)), 'neigh', 'show'])
          .split('\n')
          .filter(Boolean);
      try {
        // (without the router's ARP rule: 1 024 STALE entries, the host's table full, "neighbor
        // table overflow", a new entry anywhere on the host refused)
        expect(await ran(box, ['/flood', 'arp', '100.96.0.1', '1100'])).toEqual({ ok: 1100, refused: 0 });
        expect(neighbours().filter((l) => l.startsWith('10.200.'))).toEqual([]);
        // the machine still reaches out (its link needs no ARP: both ends are permanent)
        expect((await fetchIn(box, WEB)).ok).toBe(true);
      } finally {
        await box.destroy();
      }
    }, 60_000);

    it("a machine's open connections over its cap are refused at once; one that closes makes room", async () => {
      await capped('1000/1000/8,1000/1000', async (l) => {
        const box = await withFlood(l);
        // (without the cap: ok 12)
        expect(await ran(box, ['/flood', 'tcp', WEB, '7000', '12', '1'])).toEqual({ ok: 8, refused: 4 });
        expect(await ran(box, ['/flood', 'tcp', WEB, '7000', '8', '0'])).toEqual({ ok: 8, refused: 0 });
      });
    }, 120_000);

    it("a home's machines together are held to the home's cap, counted in the router's flows_refused", async () => {
      await capped('1000/1000/1000,1/30', async (l) => {
        const a = await withFlood(l);
        const b = await withFlood(l);
        await ran(a, ['/flood', 'udp', WEB, '20']);
        expect(tracked(l.home, 'udp').length).toBe(20);
        await ran(b, ['/flood', 'udp', OTHER, '40']);
        const n = tracked(l.home, 'udp').length;
        expect(n).toBeGreaterThanOrEqual(30);
        expect(n).toBeLessThanOrEqual(33);
        const counter = sh('ip', [
          'netns',
          'exec',
          routerNetns(homeTag(l.home)),
          'nft',
          'list',
          'counter',
          'ip',
          'snaplab',
          'flows_refused',
        ]);
        expect(Number(/packets (\d+)/.exec(counter)?.[1])).toBeGreaterThanOrEqual(25);
      });
    }, 120_000);

    /** A counter of the test's own in a namespace: nft's count of what `match` matches at `hook`. */
    function probeCounter(ns: string, hook: string, priority: number, match: string): () => number {
      const table = `sltest_probe_${hook}`;
      const r = spawnSync('ip', ['netns', 'exec', ns, 'nft', '-f', '-'], {
        input: `table ip ${table} {\n chain c {\n type filter hook ${hook} priority ${priority}; policy accept;\n ${match} counter\n }\n}\n`,
        encoding: 'utf8',
      });
      if (r.status !== 0) throw new Error(`nft: ${r.stderr}`);
      return () =>
        Number(/packets (\d+)/.exec(sh('ip', ['netns', 'exec', ns, 'nft', 'list', 'table', 'ip', table]))?.[1]);
    }

    it('a packet the connection table cannot place (an ICMP error about no flow) goes no further than the router', async () => {
      const box = await withFlood(lab!);
      const router = routerNetns(homeTag(lab!.home));
      const leaving = probeCounter(router, 'postrouting', 300, 'oifname "up0" ip saddr 100.96.0.0/12');
      try {
        const before = (await box.egressUsage()).denied;
        // (a raw packet: a sandbox has CAP_NET_RAW in its own namespace)
        expect(await ran(box, ['/flood', 'icmperr', box.egress!.address, WEB])).toEqual({ ok: 1, refused: 0 });
        // (without the rule: 1, leaving untranslated, past the marks' check and the caps)
        expect(leaving()).toBe(0);
        expect((await box.egressUsage()).denied).toBeGreaterThan(before);
      } finally {
        sh('ip', ['netns', 'exec', router, 'nft', 'delete', 'table', 'ip', 'sltest_probe_postrouting']);
        await box.destroy();
      }
    }, 60_000);

    it("the uplink takes nothing from the router's link but the router's own address", async () => {
      const box = await lab!.create({ egress: true }); // (the router, made if it is not there)
      const tag = homeTag(lab!.home);
      const arrived = probeCounter(UP, 'prerouting', -100, `iifname "sle${tag}" ip saddr 100.96.0.99`);
      try {
        // sent by the router's namespace itself, as if a machine's packet had passed it untranslated
        const r = spawnSync('ip', ['netns', 'exec', routerNetns(tag), flood, 'icmperr', '100.96.0.99', WEB], {
          encoding: 'utf8',
        });
        expect(r.stdout).toMatch(/ok 1 /);
        // (without the rule: 1)
        expect(arrived()).toBe(0);
      } finally {
        sh('ip', ['netns', 'exec', UP, 'nft', 'delete', 'table', 'ip', 'sltest_probe_prerouting']);
        await box.destroy();
      }
    }, 60_000);

    it("a machine's closed connection leaves the host's table within 30 s, not the kernel's 120", async () => {
      const box = await lab!.create({ egress: true });
      expect((await fetchIn(box, WEB)).ok).toBe(true);
      const closed = tracked(lab!.home, 'tcp').filter((l) => / dport=8080 /.test(l) && /TIME_WAIT|CLOSE/.test(l));
      expect(closed.length).toBeGreaterThan(0);
      // "ipv4 2 tcp 6 SECONDS STATE …"
      for (const l of closed) expect(Number(l.split(/ +/)[4])).toBeLessThanOrEqual(30);
      await box.destroy();
    }, 60_000);

    it("a router an earlier build made, without the caps or the ARP rule, is given them by the next create; the uplink's established timeout is kept", async () => {
      const l = await testLab();
      const established = 'net.netfilter.nf_conntrack_tcp_timeout_established';
      const was = sh('ip', ['netns', 'exec', UP, 'sysctl', '-n', established]).trim();
      try {
        const tag = homeTag(l.home);
        // an uplink whose established connections last 2 hours: a machine's keep that (nft's
        // policy would give them 5 days for a state it does not name)
        sh('ip', ['netns', 'exec', UP, 'sysctl', '-qw', `${established}=7200`]);
        await (await l.create({ egress: true })).destroy();
        expect(sh('ip', ['netns', 'exec', UP, 'nft', 'list', 'table', 'ip', uplinkTable(tag)])).toMatch(
          /policy = \{[^}]* established : 7200, /,
        );
        // as an earlier build left it: no home cap, no closing timeouts, machines' links open to
        // ARP, a note without a generation (then `capped`, the build before this one's, on the way)
        const router = routerNetns(tag);
        sh('ip', ['netns', 'exec', router, 'nft', 'delete', 'chain', 'ip', 'snaplab', 'flows']);
        sh('ip', ['netns', 'exec', router, 'nft', 'delete', 'table', 'arp', 'snaplab']);
        sh('ip', ['netns', 'exec', UP, 'nft', 'delete', 'chain', 'ip', uplinkTable(tag), 'prerouting']);
        const note = join(l.home, 'run', 'egress.ready');
        writeFileSync(note, readFileSync(note, 'utf8').replace(' capped-arp', ''));
        // a machine of a build older still, whose link's ends learn each other by ARP (no
        // permanent entry at the router's end): the router is not closed to ARP while it is there
        const old = await l.create({ egress: true });
        const oldLink = `e${slotOf(old.egress!.address)}`;
        sh('ip', ['-n', router, 'neigh', 'del', old.egress!.address, 'dev', oldLink]);
        // a process of its own (this one remembers the router as seen)
        const made = cli(l.home, ['create', '--egress', '--json']);
        expect(made.code, made.err).toBe(0);
        expect(spawnSync('ip', ['netns', 'exec', router, 'nft', 'list', 'table', 'arp', 'snaplab']).status).not.toBe(0);
        expect(readFileSync(note, 'utf8')).toMatch(/ capped\n$/);
        // (with the rule: the router's answer to its request for the machine dropped, the machine cut off)
        sh('ip', ['-n', router, 'neigh', 'flush', 'dev', oldLink]);
        expect((await fetchIn(old, WEB)).ok).toBe(true);
        await old.destroy();
        const again = cli(l.home, ['create', '--egress', '--json']);
        expect(again.code, again.err).toBe(0);
        expect(sh('ip', ['netns', 'exec', router, 'nft', 'list', 'chain', 'ip', 'snaplab', 'flows'])).toMatch(
          /limit rate over \d+\/second burst \d+ packets counter name "flows_refused" reject/,
        );
        expect(sh('ip', ['netns', 'exec', UP, 'nft', 'list', 'chain', 'ip', uplinkTable(tag), 'prerouting'])).toMatch(
          /ct timeout set "closing"/,
        );
        expect(sh('ip', ['netns', 'exec', router, 'nft', 'list', 'table', 'arp', 'snaplab'])).toMatch(
          /iifname != "up0" drop/,
        );
        expect(readFileSync(note, 'utf8')).toMatch(/ capped-arp\n$/);
      } finally {
        sh('ip', ['netns', 'exec', UP, 'sysctl', '-qw', `${established}=${was}`]);
        await disposeLab(l);
      }
    }, 120_000);
  });
});
