import { spawnSync } from 'node:child_process';
import { randomInt, randomUUID } from 'node:crypto';
import {
  chownSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  rmSync,
  readFileSync,
  statSync,
  symlinkSync,
  unlinkSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { tmpdir } from 'node:os';
import { Lab } from '../src/sdk/lab.js';
import type { SnaplabError } from '../src/errors.js';
import { mountFs } from '../src/host/mounts.js';
import { unmountAll } from '../src/storage/mounts.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { pids } from '../src/host/cgroups/destroy.js';
import { cgroupFor } from '../src/host/cgroups/cgroups.js';
import { USERNS_SIZE, USERNS_SLOTS, slotBase, slotOf } from '../src/host/userns/id-ranges.js';
import { REGISTRY } from '../src/host/userns/registry.js';
import type { Sandbox } from '../src/sdk/sandbox.js';
import type { SandboxApi } from '../src/sdk/api.js';
import { createMany, removeMany } from '../src/sdk/bulk.js';
import { listCursor } from '../src/sdk/paging.js';
import { disposeLab, testLab } from './helpers.js';
import { SNAPLAB, snaplabInPrivateMounts, snaplabWithNosuidDev } from './cli-command.js';
import { failureMeans, noted } from '../src/cleanup.js';

// Root inside is not root outside: each namespace sandbox in a user namespace of its own, its root
// filesystem idmapped so that files keep their owners on disk. Real namespaces and mounts.
let lab: Lab;
beforeAll(async () => {
  lab = await testLab();
});
afterAll(async () => {
  await disposeLab(lab);
});

const out = async (box: Sandbox, argv: string[]): Promise<string> => {
  const r = await box.exec(argv);
  expect(r.exitCode, r.stderr.toString()).toBe(0);
  return r.stdout.toString().trim();
};
/** real, effective, saved and filesystem uids of a host process */
const hostUids = (pid: number): number[] =>
  /^Uid:\s+(.*)$/m
    .exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]!
    .split(/\s+/)
    .map(Number);

/** Where a file of the sandbox's root is on the host's disk (an overlay clone is mounted only inside: its upper dir). */
function onDisk(lab: Lab, box: Sandbox, rel: string): string {
  const v = box.info.volume!;
  return v.kind === 'overlay' ? join(lab.context.backend('overlay').stack!(v).upper, rel) : join(v.path, rel);
}

describe.each(['btrfs', 'dir', 'overlay'] as const)('a sandbox on %s in a user namespace', (storage) => {
  it('maps root inside to an unprivileged range outside; its processes run as that range on the host', async () => {
    await using box = await lab.create({ storage });
    const base = box.info.uidBase!;
    expect(base).toBeGreaterThanOrEqual(slotBase(0));
    expect((await out(box, ['cat', '/proc/self/uid_map'])).split(/\s+/).map(Number)).toEqual([0, base, USERNS_SIZE]);
    expect((await out(box, ['cat', '/proc/self/gid_map'])).split(/\s+/).map(Number)).toEqual([0, base, USERNS_SIZE]);
    expect(await out(box, ['id', '-u'])).toBe('0');
    expect(hostUids(box.info.pid!)).toEqual([base, base, base, base]);
    expect(box.toJSON().userns).toEqual({ uidBase: base, size: USERNS_SIZE });
  });

  it('keeps files owned on disk as in the image: root inside writes 0, through the idmap', async () => {
    await using box = await lab.create({ storage });
    expect(await out(box, ['stat', '-c', '%u:%g', '/etc/passwd'])).toBe('0:0'); // the image's, no chown
    await out(box, [
      'sh',
      '-c',
      'echo made > /root/made && chown 1000:1000 /root/made.1 2>/dev/null; touch /root/u && chown 1000:1001 /root/u',
    ]);
    expect([statSync(onDisk(lab, box, 'root/made')).uid, statSync(onDisk(lab, box, 'root/made')).gid]).toEqual([0, 0]);
    expect([statSync(onDisk(lab, box, 'root/u')).uid, statSync(onDisk(lab, box, 'root/u')).gid]).toEqual([1000, 1001]);
    // so a snapshot restored into another range reads the same owners
    await box.snapshot(`own-${storage}`);
    const copy = await lab.restore(`own-${storage}`);
    expect(copy.info.uidBase).not.toBe(box.info.uidBase);
    expect(await out(copy, ['stat', '-c', '%u:%g %n', '/root/made', '/root/u'])).toBe(
      '0:0 /root/made\n1000:1001 /root/u',
    );
    await copy.destroy(); // (an overlay snapshot's layer stays while a clone stacks it)
    await lab.removeSnapshot(`own-${storage}`);
  });

  it('a setuid-root binary gives nothing (no_new_privs), and no process inside is host root', async () => {
    await using box = await lab.create({ storage });
    const base = box.info.uidBase!;
    await out(box, ['sh', '-c', 'cp /bin/busybox /root/busybox.suid && chmod 4755 /root/busybox.suid']);
    expect(await out(box, ['su', '-s', '/bin/sh', 'nobody', '-c', '/root/busybox.suid id -u'])).toBe('65534');
    const r = box
      .exec(['su', '-s', '/bin/sh', 'nobody', '-c', 'exec /root/busybox.suid sleep 30'])
      .catch(failureMeans(undefined)); // ends with the sandbox
    let uids: number[] = [];
    for (let i = 0; i < 200 && !uids.includes(base + 65534); i++) {
      uids = (await pids(cgroupFor(box.id))).flatMap((p) => {
        try {
          return hostUids(p);
        } catch {
          return [];
        }
      });
      if (!uids.includes(base + 65534)) await new Promise((res) => setTimeout(res, 20));
    }
    expect(uids).toContain(base + 65534); // the sleeper, as nobody of the range
    expect(uids.every((u) => u >= base && u < base + USERNS_SIZE)).toBe(true);
    await box.destroy();
    await r;
  });

  it('root inside cannot write a file whose owner is outside its range (it can, without one)', async () => {
    for (const userns of [true, false]) {
      await using box = await lab.create({ storage, userns });
      await out(box, ['touch', '/root/.seen']); // /root in the volume's own layer (overlay: copied up)
      const f = userns ? onDisk(lab, box, 'root/host-owned') : join(box.info.volume!.path, 'root/host-owned');
      mkdirSync(dirname(f), { recursive: true });
      writeFileSync(f, 'host\n', { mode: 0o644 });
      chownSync(f, 100_000, 100_000); // an id no range maps: a host user's file, as far as the sandbox can tell
      const r = await box.exec(['sh', '-c', 'echo changed > /root/host-owned']);
      expect({ userns, denied: r.exitCode !== 0 }).toEqual({ userns, denied: userns });
      if (userns) expect(await out(box, ['stat', '-c', '%u', '/root/host-owned'])).toBe('65534');
    }
  });

  it('removes and recreates an image directory inside, and a snapshot of it restores exactly that', async () => {
    await using box = await lab.create({ storage });
    // /etc is the image's: on overlay the removal is a whiteout, the new /etc an opaque directory
    await out(box, [
      'sh',
      '-c',
      'rm -rf /etc /usr/share && mkdir /etc && echo mine > /etc/only && mkdir -p /usr/share/new && ls -a /etc',
    ]);
    expect(await out(box, ['ls', '-a', '/etc'])).toBe('.\n..\nonly');
    await box.snapshot(`opaque-${storage}`);
    const copy = await lab.restore(`opaque-${storage}`);
    expect(await out(copy, ['ls', '-a', '/etc', '/usr/share'])).toBe('/etc:\n.\n..\nonly\n\n/usr/share:\n.\n..\nnew');
    expect(await out(copy, ['cat', '/etc/only'])).toBe('mine');
    await copy.destroy();
    await lab.removeSnapshot(`opaque-${storage}`);
  });

  it("cannot write what the host bound read-only, nor change the host's device nodes", async () => {
    await using box = await lab.create({ storage });
    expect((await box.exec(['sh', '-c', 'echo x > /run/snaplab/agent'])).exitCode).not.toBe(0);
    expect((await box.exec(['chmod', '666', '/run/snaplab/agent'])).exitCode).not.toBe(0);
    expect((await box.exec(['chown', '0', '/dev/null'])).exitCode).not.toBe(0);
    expect(await out(box, ['stat', '-c', '%u', '/run/snaplab/agent'])).toBe('65534'); // host root is nobody here
  });

  it("starts where the host's /dev is mounted nosuid (stock Debian): the locked flag is kept, /proc still hardened", async () => {
    const env = { ...process.env, SNAPLAB_HOME: lab.home, SNAPLAB_NO_FAST: '1' };
    const name = `nosuid-${storage}`;
    const made = snaplabWithNosuidDev(['create', '--image', 'busybox', '--storage', storage, '--name', name], env);
    // nothing but the result on stdout and what the create took on stderr: no warning, no error
    expect([made.stdout, made.stderr]).toEqual([
      `${name}\n`,
      expect.stringMatching(/^created \S+ \(\w+\) on \w+ in [^\n]+\n$/),
    ]);
    expect(made.status).toBe(0);
    const box = await lab.get(name);
    try {
      expect(box.toJSON().userns).toBeDefined();
      expect(await out(box, ['cat', '/proc/keys'])).toBe(''); // masked with /dev/null
      expect(await out(box, ['sh', '-c', 'grep -c " /proc/keys " /proc/self/mountinfo'])).toBe('1');
    } finally {
      await box.destroy();
    }
  });
});

describe('user namespace ranges', () => {
  it('two live sandboxes never share one, also when created at once; a removed one gives its range back', async () => {
    const boxes = await Promise.all(Array.from({ length: 8 }, () => lab.create({})));
    const bases = boxes.map((b) => b.info.uidBase);
    expect(new Set(bases).size).toBe(8);
    expect(bases.every((b) => b !== null && readdirSync(REGISTRY).includes(String(b)))).toBe(true); // claimed host-wide
    // a removed sandbox's range is free again: its claim is gone from the host-wide registry
    const first = bases[0]!;
    await boxes[0]!.destroy();
    expect(readdirSync(REGISTRY)).not.toContain(String(first));
    await Promise.all(boxes.slice(1).map((b) => b.destroy()));
    expect(USERNS_SLOTS).toBeGreaterThan(2000);
  });

  it("a stopped machine's range is claimed again by its start (a reboot empties the registry), never taken from another", async () => {
    const box = await lab.create({});
    const base = box.info.uidBase!;
    const claim = join(REGISTRY, String(base));
    await box.stop();
    expect(readdirSync(REGISTRY)).toContain(String(base)); // kept while it is stopped
    unlinkSync(claim); // as a reboot leaves the registry (tmpfs)
    await box.start();
    expect(JSON.parse(readFileSync(claim, 'utf8'))).toMatchObject({ home: lab.home, id: box.id });
    expect(box.info.uidBase).toBe(base);
    // claimed by another sandbox since (after the reboot, before this start): the start is refused
    await box.stop();
    unlinkSync(claim);
    writeFileSync(claim, JSON.stringify({ home: '/test/other', id: 'taken' }), { flag: 'wx' });
    try {
      const refused = await box.start().catch((e: unknown) => e as SnaplabError);
      expect(refused).toMatchObject({
        code: 'NO_USERNS_SLOT',
        message: expect.stringMatching(/held by sandbox taken of \/test\/other/),
      });
      expect((await lab.get(box.id)).stopped).toBe(true);
    } finally {
      unlinkSync(claim);
      await box.destroy();
    }
  });

  it('a home named relatively or through a link is one home, spelt whole (claims name their home by it)', async () => {
    const link = join(tmpdir(), `snaplab-test-home-link-${process.pid}`);
    symlinkSync(lab.home, link);
    try {
      for (const given of [relative(process.cwd(), lab.home), `${lab.home}/`, link]) {
        const other = await Lab.open({ home: given });
        expect([given, other.home]).toEqual([given, lab.home]);
        other.close();
      }
    } finally {
      unlinkSync(link);
    }
  });

  it('--no-userns (userns: false) runs as host root, and says so', async () => {
    await using box = await lab.create({ userns: false });
    expect(box.info.uidBase).toBeNull();
    expect((await out(box, ['cat', '/proc/self/uid_map'])).split(/\s+/).map(Number)).toEqual([0, 0, 4294967295]);
    expect(box.hostRoot).toBe(true);
    expect(box.toJSON().userns).toBeNull();
  });

  it("a scenario machine's namespace owns its network: ping and port 80 work, and a reset keeps the range", async () => {
    const file = join(lab.home, 'userns-scenario.yaml');
    writeFileSync(
      file,
      'name: uns\nnetworks:\n  net: { subnet: 10.88.0.0/24 }\nmachines:\n  a: { networks: { net: 10.88.0.2 } }\n  b: { networks: { net: 10.88.0.3 } }\n',
    );
    const scn = await lab.up(file, { name: 'uns' });
    try {
      const a = await scn.machine('a');
      const base = a.info.uidBase!;
      expect(base).not.toBeNull();
      expect((await out(a, ['cat', '/proc/self/uid_map'])).split(/\s+/).map(Number)).toEqual([0, base, USERNS_SIZE]);
      expect(await out(a, ['sh', '-c', 'ping -c1 -W2 10.88.0.3 >/dev/null && echo reached'])).toBe('reached'); // a raw socket
      const b = await scn.machine('b');
      expect(b.info.uidBase).not.toBe(base); // a range per machine
      expect(
        (
          await b.exec(
            [
              'sh',
              '-c',
              'nc -l -p 80 </dev/null >/dev/null 2>&1 & sleep 0.2; netstat -ltn | grep -q ":80 " && echo bound',
            ],
            { timeoutMs: 10_000 },
          )
        ).stdout
          .toString()
          .trim(),
      ).toBe('bound'); // CAP_NET_BIND_SERVICE over its network
      a.close();
      b.close();
      await scn.snapshot('base', { standby: 0 }); // the reset raises the machines again: the same range
      await scn.reset();
      const again = await scn.machine('a');
      expect(again.id).not.toBe(a.id);
      expect(again.info.uidBase).toBe(base); // the machine's, not the sandbox's
      expect(await out(again, ['sh', '-c', 'ping -c1 -W2 10.88.0.3 >/dev/null && echo reached'])).toBe('reached');
      again.close();
      expect(readdirSync(REGISTRY)).toContain(String(base));
      // its claim gone from the registry (lost, or written under another spelling of the home):
      // a reset refuses to raise it, never raises it without a user namespace (root inside would be host root)
      const claim = join(REGISTRY, String(base));
      const text = readFileSync(claim, 'utf8');
      unlinkSync(claim);
      try {
        const refused = await scn.reset().catch((e: unknown) => e as SnaplabError);
        expect(refused).toMatchObject({
          code: 'SCENARIO_FAILED',
          message: expect.stringMatching(/no user namespace range/),
        });
        expect(
          (await lab.list()).filter(
            (x) => x.info.scenario === 'uns' && x.state === 'running' && x.info.uidBase === null,
          ),
        ).toEqual([]);
      } finally {
        writeFileSync(claim, text, { flag: 'wx' });
      }
    } finally {
      await scn.down();
    }
    const left = readdirSync(REGISTRY)
      .flatMap((f) => claimText(join(REGISTRY, f)))
      .filter((t) => t.includes(lab.home) && t.includes('scenario:'));
    expect(left).toEqual([]); // down gave the machines' ranges back
  });

  it('are claimed host-wide: two homes at once never share one; a full registry is a clear error', async () => {
    const other = await testLab();
    try {
      const boxes = await Promise.all(Array.from({ length: 6 }, (_, i) => (i % 2 ? lab : other).create({})));
      expect(new Set(boxes.map((b) => b.info.uidBase)).size).toBe(6);
      await Promise.all(boxes.map((b) => b.destroy()));
      // every range but one taken (by anyone): the create gets that one; the next cannot get any.
      // Three slots of the high stretch (SNAPLAB_USERNS_IDS), one claimed whole by another, one
      // split by another's small range: neither is shared
      const lo = slotBase(2569 + randomInt(32000));
      const [whole, split, keep] = [lo, lo + USERNS_SIZE, lo + 2 * USERNS_SIZE];
      writeFileSync(join(REGISTRY, String(whole)), '{"home":"/test/other","id":"x"}', { flag: 'wx' });
      mkdirSync(join(REGISTRY, String(split)));
      writeFileSync(join(REGISTRY, String(split), `${split + 2048}.2048`), '{"home":"/test/other","id":"y"}');
      process.env.SNAPLAB_USERNS_IDS = `${lo}-${lo + 3 * USERNS_SIZE - 1}`;
      try {
        await using last = await lab.create({});
        expect(last.info.uidBase).toBe(keep);
        await expect(lab.create({})).rejects.toMatchObject({
          code: 'NO_USERNS_SLOT',
          hint: expect.stringMatching(/--no-userns/),
        });
        await expect(lab.create({ ids: 1024 })).rejects.toMatchObject({ code: 'NO_USERNS_SLOT' });
      } finally {
        delete process.env.SNAPLAB_USERNS_IDS;
        unlinkSync(join(REGISTRY, String(whole)));
        rmSync(join(REGISTRY, String(split)), { recursive: true });
      }
    } finally {
      await disposeLab(other);
    }
  });

  it("skips the slots of ids the host's /etc/passwd and /etc/group name, read when a create claims", () => {
    // three slots; an account in the first, a group in the second (each file bound over the host's
    // in a private mount namespace of the create's own): the create gets the third, the next none
    const lo = slotBase(2569 + randomInt(32000));
    const dir = mkdtempSync(join(tmpdir(), 'snaplab-accounts-'));
    const passwd = join(dir, 'passwd');
    const group = join(dir, 'group');
    writeFileSync(passwd, `${readFileSync('/etc/passwd', 'utf8')}slhigh:x:${lo + 100}:${lo + 100}::/:/bin/false\n`);
    writeFileSync(group, `${readFileSync('/etc/group', 'utf8')}slhighg:x:${lo + USERNS_SIZE + 5}:\n`);
    const create = () =>
      snaplabInPrivateMounts(
        `mount --bind ${passwd} /etc/passwd && mount --bind ${group} /etc/group`,
        ['create', '--image', 'busybox', '--json'],
        { ...process.env, SNAPLAB_HOME: lab.home, SNAPLAB_USERNS_IDS: `${lo}-${lo + 3 * USERNS_SIZE - 1}` },
      );
    const made: string[] = [];
    /** a create's sandbox, kept for removal before anything of it is checked */
    const kept = (r: ReturnType<typeof create>): void => {
      const id = /"id":\s*"([^"]+)"/.exec(r.stdout)?.[1];
      if (id) made.push(id);
    };
    try {
      const first = create();
      kept(first);
      expect(first.status, first.stderr).toBe(0);
      const box = JSON.parse(first.stdout) as { id: string; userns: { uidBase: number } };
      expect(box.userns.uidBase).toBe(lo + 2 * USERNS_SIZE);
      const next = create();
      kept(next);
      expect([next.status, next.stderr]).toEqual([2, expect.stringMatching(/NO_USERNS_SLOT/)]);
    } finally {
      const left = made.filter(
        (id) => spawnSync(SNAPLAB, ['rm', id], { env: { ...process.env, SNAPLAB_HOME: lab.home } }).status !== 0,
      );
      rmSync(dir, { recursive: true });
      expect(left).toEqual([]);
    }
  });

  it('above 2^31 (once the low stretch is full): shown right by ls, ls -ln, /proc and ps -o user; ps -o uid prints it negative', async () => {
    const lo = slotBase(2569 + randomInt(32000));
    process.env.SNAPLAB_USERNS_IDS = `${lo}-${lo + 4 * USERNS_SIZE - 1}`;
    try {
      await using box = await lab.create({});
      const base = box.info.uidBase!;
      expect(base).toBeGreaterThanOrEqual(2 ** 31);
      expect((await out(box, ['cat', '/proc/self/uid_map'])).split(/\s+/).map(Number)).toEqual([0, base, USERNS_SIZE]);
      expect(hostUids(box.info.pid!)).toEqual([base, base, base, base]);
      const ls = spawnSync(SNAPLAB, ['ls', '--json'], {
        env: { ...process.env, SNAPLAB_HOME: lab.home },
        encoding: 'utf8',
      });
      expect(ls.status, ls.stderr).toBe(0);
      const row = (JSON.parse(ls.stdout) as { id: string; userns: unknown }[]).find((b) => b.id === box.id);
      expect(row?.userns).toEqual({ uidBase: base, size: USERNS_SIZE });
      const lsn = spawnSync('ls', ['-lnd', `/proc/${box.info.pid}`], { encoding: 'utf8' }).stdout.split(/\s+/);
      expect(lsn.slice(2, 4).map(Number)).toEqual([base, base]);
      // procps's numeric uid column is signed (docs/architecture.md "Ranges")
      const ps = spawnSync('ps', ['-o', 'uid=', '-p', String(box.info.pid)], { encoding: 'utf8' }).stdout.trim();
      expect(Number(ps)).toBe(base - 2 ** 32);
      // its user column prints the id as it is (given room: its default width is 8)
      const user = spawnSync('ps', ['-o', 'user:12=', '-p', String(box.info.pid)], { encoding: 'utf8' }).stdout.trim();
      expect(user).toBe(String(base));
    } finally {
      delete process.env.SNAPLAB_USERNS_IDS;
    }
  });

  // issue #34's bounded case of density: what the 10 000 ladder does at scale (docs/benchmarks.md
  // "Density"), at a count the suite can afford. Five full slots above 2^31 hold the 300 ranges
  // of 1024 ids, 64 to a slot: each is its own and claimed where the registry says
  it('300 at once with 1024 ids each, packed 64 to a slot above 2^31: each range its own and claimed, listed once page by page, removed with nothing left', async () => {
    const SLOTS = 5;
    const lo = slotBase(2569 + randomInt(32000));
    const labels = { density: randomUUID() };
    process.env.SNAPLAB_USERNS_IDS = `${lo}-${lo + SLOTS * USERNS_SIZE - 1}`;
    let boxes: SandboxApi[];
    try {
      boxes = await createMany(lab, 300, { ids: 1024, labels }, { parallel: 8 });
    } finally {
      delete process.env.SNAPLAB_USERNS_IDS;
    }
    const removed = { done: false };
    try {
      const bases = boxes.map((b) => (b as Sandbox).info.uidBase ?? -1); // the embedded lab's sandboxes
      expect(new Set(bases).size).toBe(300);
      expect(bases.every((b) => b >= lo && b < lo + SLOTS * USERNS_SIZE && (b - lo) % 1024 === 0)).toBe(true);
      expect(new Set(bases.map((b) => slotOf(b))).size).toBe(SLOTS); // 300 ranges in 5 slots: packed
      const claims = new Set(
        [...new Set(bases.map((b) => slotOf(b)!))].flatMap((s) => readdirSync(join(REGISTRY, String(s)))),
      );
      expect(bases.filter((b) => !claims.has(`${b}.1024`))).toEqual([]);
      // listed once each, oldest first, through pages of 64 (five pages: 64 × 4 + 44)
      const seen: string[] = [];
      let after: string | undefined;
      let pages = 0;
      for (;;) {
        const page = await lab.list({ labels, limit: 64, ...(after ? { after } : {}) });
        pages++;
        seen.push(...page.map((b) => b.id));
        if (page.length < 64) break;
        after = listCursor(page.at(-1)!);
      }
      expect(pages).toBe(5);
      expect(seen.length).toBe(300);
      expect([...seen].sort()).toEqual(boxes.map((b) => b.id).sort());
      expect(await lab.count({ labels })).toEqual({ total: 300, byState: { running: 300 } });
      // the first and the last made run, each in its own range
      for (const b of [boxes[0]!, boxes[299]!]) {
        const box = await lab.get(b.id);
        try {
          const base = box.info.uidBase!;
          expect((await out(box, ['cat', '/proc/self/uid_map'])).split(/\s+/).map(Number)).toEqual([0, base, 1024]);
          expect(hostUids(box.info.pid!)).toEqual([base, base, base, base]);
        } finally {
          box.close();
        }
      }
      const ids = boxes.map((b) => b.id);
      await removeMany(lab, boxes, { parallel: 8 });
      removed.done = true;
      expect(await lab.count({ labels })).toEqual({ total: 0, byState: {} });
      const left = new Set(
        [...new Set(bases.map((b) => slotOf(b)!))].flatMap((s) =>
          existsSync(join(REGISTRY, String(s))) ? readdirSync(join(REGISTRY, String(s))) : [],
        ),
      );
      expect(bases.filter((b) => left.has(`${b}.1024`))).toEqual([]); // every claim given back
      expect(ids.flatMap((id) => cgroupFor(id).dirs.filter((d) => existsSync(d)))).toEqual([]);
    } finally {
      if (!removed.done) await removeMany(lab, boxes).catch(noted('removing the 300 after a failed check')); // what is left, disposeLab's gc removes
    }
  }, 300_000);

  it('a sandbox asks a smaller range (ids): mapped 0..ids-1, ids beyond show as nobody; a restore keeps the size', async () => {
    await using box = await lab.create({ ids: 1024 });
    const base = box.info.uidBase!;
    expect((await out(box, ['cat', '/proc/self/uid_map'])).split(/\s+/).map(Number)).toEqual([0, base, 1024]);
    expect(box.toJSON().userns).toEqual({ uidBase: base, size: 1024 });
    expect(readdirSync(join(REGISTRY, String(slotOf(base))))).toContain(`${base}.1024`);
    expect(await out(box, ['sh', '-c', 'echo hi > /f && chown 1000:1000 /f && stat -c %u /f'])).toBe('1000');
    const r = await box.exec(['chown', '2000', '/f']);
    expect(r.exitCode).not.toBe(0); // 2000 is not mapped
    chownSync(onDisk(lab, box, 'f'), 5000, 5000); // on disk beyond the range: nobody inside
    expect(await out(box, ['stat', '-c', '%u %g', '/f'])).toBe('65534 65534');
    expect((await box.exec(['chown', '0:0', '/f'])).exitCode).not.toBe(0); // nor can root inside take it back
    const snap = await box.snapshot(`ids-${box.id}`);
    try {
      await using again = await lab.restore(snap.name);
      expect(again.toJSON().userns).toEqual({ uidBase: again.info.uidBase, size: 1024 });
      expect(await out(again, ['cat', '/f'])).toBe('hi');
      await using big = await lab.restore(snap.name, { ids: 65536 });
      expect((await out(big, ['stat', '-c', '%u', '/f'])).trim()).toBe('5000');
      // a size that is none (`restore --ids abc`) is refused, not read as the default
      for (const ids of [Number.NaN, 0])
        await expect(lab.restore(snap.name, { ids })).rejects.toMatchObject({ code: 'BAD_INPUT' });
    } finally {
      await lab.removeSnapshot(snap.name);
    }
    await expect(lab.create({ ids: 1000 })).rejects.toMatchObject({ code: 'BAD_INPUT', hint: /power of two/ });
    await expect(lab.create({ ids: 1024, userns: false })).rejects.toMatchObject({ code: 'BAD_INPUT' });
    // from the command line
    const cli = spawnSync(SNAPLAB, ['create', '--ids', '2048', '--json'], {
      env: { ...process.env, SNAPLAB_HOME: lab.home },
      encoding: 'utf8',
    });
    expect(cli.status, cli.stderr).toBe(0);
    const made = JSON.parse(cli.stdout) as { name: string; userns: { size: number } };
    expect(made.userns.size).toBe(2048);
    await (await lab.get(made.name)).destroy();
  });

  it('gc gives back the small range of a sandbox whose record vanished', async () => {
    const box = await lab.create({ ids: 4096 });
    const base = box.info.uidBase!;
    box.close();
    lab.context.store.deleteSandbox(box.id);
    const part = join(REGISTRY, String(slotOf(base)), `${base}.4096`);
    utimesSync(part, new Date(Date.now() - 120_000), new Date(Date.now() - 120_000));
    const gc = await lab.gc();
    expect(gc.removed).toEqual(expect.arrayContaining([`user namespace range ${base} (sandbox ${box.id})`]));
    expect(existsSync(part)).toBe(false);
  });

  it('gc frees the range and kills the processes of a sandbox whose record vanished', async () => {
    const box = await lab.create({});
    const base = box.info.uidBase!;
    box.close();
    lab.context.store.deleteSandbox(box.id); // as if the record were lost
    utimesSync(join(REGISTRY, String(base)), new Date(Date.now() - 120_000), new Date(Date.now() - 120_000)); // past the claim grace
    const gc = await lab.gc();
    expect(gc.removed).toEqual(expect.arrayContaining([`user namespace range ${base} (sandbox ${box.id})`]));
    expect(readdirSync(REGISTRY)).not.toContain(String(base));
    expect(await pids(cgroupFor(box.id))).toEqual([]);
  });

  it('a dead sandbox gives its range back once its processes are gone, before rm', async () => {
    const box = await lab.create({});
    const base = box.info.uidBase!;
    process.kill(box.info.pid!, 'SIGKILL');
    box.close();
    for (let i = 0; i < 100 && (await lab.get(box.name)).info.state !== 'dead'; i++)
      await new Promise((r) => setTimeout(r, 20));
    const dead = await lab.get(box.name);
    expect(dead.info.state).toBe('dead');
    expect(dead.info.uidBase === null || lab.context.store.getSandbox(box.id)!.uidBase === null).toBe(true);
    expect(readdirSync(REGISTRY)).not.toContain(String(base));
    // someone claims it again; a late removal through the old handle must not take it from them
    writeFileSync(join(REGISTRY, String(base)), JSON.stringify({ home: '/test/other', id: 'newer' }), { flag: 'wx' });
    await box.destroy();
    expect(readdirSync(REGISTRY)).toContain(String(base));
    unlinkSync(join(REGISTRY, String(base)));
  });

  it('where the filesystem cannot be idmapped, a create fails with the reason and the way on, and leaves nothing; --no-userns runs', async () => {
    // a home on an overlay mount: dir storage's volumes are then on overlay, which cannot be idmapped
    const top = mkdtempSync(join(tmpdir(), 'snaplab-test-noidmap-'));
    for (const d of ['l', 'u', 'w', 'm']) mkdirSync(join(top, d));
    await mountFs('overlay', join(top, 'm'), 'overlay', `lowerdir=${top}/l,upperdir=${top}/u,workdir=${top}/w`);
    const other = await Lab.open({ home: join(top, 'm', 'home') });
    try {
      const e = await other.create({ storage: 'dir' }).then(
        () => undefined,
        (x: unknown) => x as SnaplabError,
      );
      expect(e).toMatchObject({
        code: 'LAUNCH_FAILED',
        message: expect.stringMatching(/idmapped mount of the root filesystem/),
        hint: expect.stringMatching(/--no-userns/),
      });
      expect(e?.message).not.toMatch(/No child processes/); // the step that failed, not the ready pipe's ECHILD
      expect(await other.list()).toEqual([]);
      expect(
        readdirSync(REGISTRY)
          .map((f) => readFileSync(join(REGISTRY, f), 'utf8'))
          .filter((t) => t.includes(other.home)),
      ).toEqual([]);
      // doctor tries what a create runs, and says so with the fix
      const doc = spawnSync(SNAPLAB, ['doctor', '--json'], {
        env: { ...process.env, SNAPLAB_HOME: other.home },
        encoding: 'utf8',
      });
      const check = (
        JSON.parse(doc.stdout) as { checks: { name: string; ok: boolean; reason: string; fix?: string }[] }
      ).checks.find((c) => c.name === 'userns: dir');
      expect(check).toMatchObject({
        ok: false,
        reason: expect.stringMatching(/idmapped mount of the root filesystem/),
        fix: expect.stringMatching(/btrfs, ext4/),
      });
      await using box = await other.create({ storage: 'dir', userns: false });
      expect(await out(box, ['echo', 'ran'])).toBe('ran');
    } finally {
      await disposeLab(other);
      await unmountAll(top);
      rmSync(top, { recursive: true, force: true });
    }
  });

  it('a claim file that is not a claim (a crash of an older version) breaks neither gc nor creates, and is not taken', async () => {
    const base = slotBase(0);
    const taken = readdirSync(REGISTRY).includes(String(base));
    if (!taken) writeFileSync(join(REGISTRY, String(base)), '');
    // and a claim whose writer died before linking it into place: gc takes it away
    const dead = join(REGISTRY, `.tmp-${spawnSync('true').pid}-00000000`);
    writeFileSync(dead, '');
    try {
      await expect(lab.gc()).resolves.toMatchObject({
        removed: expect.arrayContaining([expect.stringContaining(dead)]),
      });
      await using box = await lab.create({});
      expect(box.info.uidBase).not.toBe(base);
      expect(readdirSync(REGISTRY).filter((f) => f.startsWith(`.tmp-${process.pid}-`))).toEqual([]); // claims are linked into place whole (this process's: others claim meanwhile)
    } finally {
      if (!taken) unlinkSync(join(REGISTRY, String(base)));
    }
  });
});

/** A registry file's text; none once it is gone (the registry is host-wide: other homes release theirs meanwhile). */
function claimText(path: string): string[] {
  try {
    return [readFileSync(path, 'utf8')];
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT' || (e as NodeJS.ErrnoException).code === 'EISDIR') return [];
    throw e;
  }
}
