import { describe, expect, it } from 'vitest';
import { readFileSync } from 'node:fs';
import {
  filesRoom,
  HOST_LIMITS,
  hostLimits,
  hostLimitsVerdict,
  IDLE_SANDBOX_BYTES,
  MEMCG_ID_MAX,
  memoryCgroups,
  memoryRoom,
  readSysctl,
  sandboxBytesAt,
} from './limits.js';
import {
  KERNEL_SHRINKERS,
  possibleNodes,
  SANDBOX_SUPERBLOCKS,
  shrinkerBytesAt,
  shrinkerIdsAt,
  shrinkerMapBytes,
  superblocksMounted,
} from './shrinkers.js';

/** A host with 40 superblocks in its mount table, one NUMA node, Linux 6.18 (as this one, but fixed). */
const HOST = { mounted: 40, nodes: 1, kernel: '6.18.44' };
const gib = 2 ** 30;

describe('host limits (doctor)', () => {
  it("reads this host's limits and says how many idle sandboxes each allows", () => {
    const v = hostLimits();
    const pidMax = readSysctl('kernel.pid_max')!;
    expect(pidMax).toBeGreaterThan(0);
    expect(v.reason).toContain(`kernel.pid_max=${pidMax} `);
    expect(v.reason).toMatch(/uid ranges 35,336 of 65536 ids, 2,261,504 of 1024/);
    if (!v.ok) expect(v.fix).toMatch(/^(sysctl -w |ulimit -Hn )/);
    // the memory controller's cgroups, live and dying, as /proc/cgroups counts them
    const memcgs = memoryCgroups()!;
    expect(memcgs).toBeGreaterThan(0);
    expect(v.reason).toContain(`(${memcgs.toLocaleString('en-US')} of 65,535 taken`);
    expect(readFileSync('/proc/cgroups', 'utf8')).toMatch(new RegExp(`^memory\\s+\\d+\\s+${memcgs}\\s`, 'm'));
    // memory's room counts this host's superblocks (its mount table changes as other tests mount)
    expect(superblocksMounted()).toBeGreaterThan(3);
    expect(v.reason).toMatch(
      /by \S+.*memory [\d,]+ \(at [\d,]+ KiB each there: 512 of its own and [\d,]+ of shrinker maps/,
    );
    expect(v.reason).toMatch(/, \d+ in the host's mount table, 32 the kernel's and 4 per sandbox/);
    // the open-file limit a daemon started from here would get (Node raises its soft limit to this)
    const hard = Number(/^Max open files\s+\S+\s+(\d+)/m.exec(readFileSync('/proc/self/limits', 'utf8'))![1]);
    expect(v.reason).toContain(
      `open files ${filesRoom(hard).toLocaleString('en-US')} (a daemon's hard limit ${hard.toLocaleString('en-US')}:`,
    );
  });

  it('says when the open-file limit stops a daemon before memory does, and how to raise it', () => {
    const high = { 'kernel.pid_max': 4194304, 'kernel.threads-max': 4194304 };
    // 24 GiB allows 16 320; a daemon under a hard limit of 21 000 serves 16 648 beside 4 096 TCP
    // connections and 256 of its own
    expect(filesRoom(21_000)).toBe(16_648);
    expect(hostLimitsVerdict(high, 24 * gib, 500, 100, HOST, { hard: 21_000 }).ok).toBe(true);
    expect(hostLimitsVerdict(high, 24 * gib, 500, 100, HOST, { hard: 20_000 }).ok).toBe(false);
    // 8 192: 4 096 TCP connections (below its limit less a quarter) and 256 leave 3 840; at 4 096,
    // 3 072 TCP connections (a quarter in reserve) and 256 leave 768
    const low = hostLimitsVerdict(high, 24 * gib, 500, 100, HOST, { hard: 8192, nrOpen: 524_288 });
    expect(low).toMatchObject({ ok: false, reason: expect.stringMatching(/allows: 3,840, by open files \(/) });
    expect(low.fix).toBe(
      'ulimit -Hn 524288 in the shell that starts snaplab serve, or LimitNOFILE=524288 in its unit (deploy/systemd/snaplab.service has it; fs.nr_open bounds it)',
    );
    expect(filesRoom(4096)).toBe(768);
    expect(filesRoom(1024)).toBe(0);
    expect(filesRoom(1_048_576)).toBe(1_044_224);
  });

  it('says the ceiling and what sets it, memory cgroup ids included (no sysctl raises those)', () => {
    const high = { 'kernel.pid_max': 4194304, 'kernel.threads-max': 4194304 };
    // 24 GiB: 16 320 sandboxes, each 512 KiB of its own and the maps of 65 352 shrinker ids (1 030 KiB)
    expect(hostLimitsVerdict(high, 24 * gib, 500, 100, HOST).reason).toMatch(
      /allows: 16,320, by memory \(memory 16,320 \(at 1,542 KiB each there: 512 of its own and 1,030 of shrinker maps for ~65,352 superblocks, 40 in the host's mount table/,
    );
    // 256 GiB: memory allows 61 328, the memory cgroup ids 65 435: the uid ranges are the ceiling, not a failure
    const big = hostLimitsVerdict(high, 256 * gib, 500, 100, HOST);
    expect(big).toMatchObject({ ok: true, reason: expect.stringMatching(/allows: 35,336, by uid ranges of 65536/) });
    // and what lifts it, shown beside a passing check (doctor's FIX column)
    expect(big.fix).toMatch(/^sandboxes that need fewer ids get more ranges: `create --ids 1024`/);
    expect(big.reason).toMatch(/memory 61,328 /);
    const dying = hostLimitsVerdict(high, 256 * gib, 500, MEMCG_ID_MAX - 20_000, HOST);
    expect(dying.reason).toMatch(/allows: 20,000, by memory cgroup ids \(.*45,535 of 65,535 taken/);
    // more than half the ids held (dying ones among them) and fewer left than memory allows: a failure, with what frees them
    expect(dying).toMatchObject({ ok: false, fix: expect.stringMatching(/drop_caches.*a reboot frees all/) });
    // a quarter held: the ceiling, not a failure
    expect(hostLimitsVerdict(high, 256 * gib, 500, 16_000, HOST).ok).toBe(true);
    expect(memoryCgroups('#subsys_name\thierarchy\tnum_cgroups\tenabled\nmemory\t0\t42\t1\n')).toBe(42);
    expect(memoryCgroups('#subsys_name\thierarchy\tnum_cgroups\tenabled\npids\t0\t42\t1\n')).toBeUndefined();
  });

  it('says which limit stops creates before memory does, with the sysctl that raises it', () => {
    const low = { 'kernel.pid_max': 8192, 'kernel.threads-max': 192738 };
    // 24 GiB: 16 320 by memory; pid_max 8192 less 500 running allows 7 692
    const v = hostLimitsVerdict(low, 24 * gib, 500, undefined, HOST);
    expect(v).toMatchObject({ ok: false, reason: expect.stringMatching(/kernel\.pid_max=8192 7,692/) });
    expect(v.fix).toMatch(/^sysctl -w kernel\.pid_max=4194304 /);
    expect(v.fix).not.toMatch(/threads-max/);
    expect(hostLimitsVerdict({ ...low, 'kernel.pid_max': 4194304 }, 24 * gib, 500, undefined, HOST).ok).toBe(true);
    // 7 GiB: memory allows 7 461, the lower bound there
    expect(hostLimitsVerdict(low, 7 * gib, 500, undefined, HOST)).toMatchObject({
      ok: true,
      reason: expect.stringMatching(/allows: 7,461, by memory/),
    });
    expect(HOST_LIMITS.every((l) => l.raiseTo > 0 && l.why.length > 0)).toBe(true);
  });

  it("counts the shrinker maps every memory cgroup holds for the host's peak of superblocks", () => {
    // Linux 6.7+: 64 ids a unit, a kmalloc-1k object and a pointer each, per node; 50 000 ids is
    // ~788 KiB (a memory cgroup made on this host after a climb to 7 700 sandboxes of 7 superblocks
    // each took ~767 KB of kmalloc-1k: docs/benchmarks.md "A quiet ladder to 3000")
    expect(shrinkerMapBytes(50_000, 1, '6.18.44')).toBe(24 + 782 * 1032);
    expect(shrinkerMapBytes(50_000, 2, '6.7.0')).toBe(2 * (24 + 782 * 1032));
    // before 6.7: one allocation a node (8 bytes and a bit an id), rounded up to a power of two
    expect(shrinkerMapBytes(50_000, 1, '6.1.0-27-amd64')).toBe(512 * 1024);
    expect(shrinkerMapBytes(100, 1, '5.10.0')).toBe(1024);
    // what a host of N sandboxes counts: its mount table, the kernel's own, 4 per sandbox
    expect(SANDBOX_SUPERBLOCKS).toBe(4);
    expect(shrinkerIdsAt(HOST, 10_000)).toBe(40 + KERNEL_SHRINKERS + 40_000);
    expect(sandboxBytesAt(HOST, 10_000)).toBe(IDLE_SANDBOX_BYTES + shrinkerBytesAt(HOST, 10_000));
    // quadratic over a host: per sandbox ~0.56 MiB at 1000, ~1.1 MiB at 10 000
    expect(Math.round(sandboxBytesAt(HOST, 1000) / 1024)).toBe(512 + 65);
    expect(Math.round(sandboxBytesAt(HOST, 10_000) / 1024)).toBe(512 + 632);
    // the room is the largest count whose sandboxes all fit
    const room = memoryRoom(24 * gib, HOST);
    expect(room * sandboxBytesAt(HOST, room)).toBeLessThanOrEqual(24 * gib);
    expect((room + 1) * sandboxBytesAt(HOST, room + 1)).toBeGreaterThan(24 * gib);
    // the mount table's superblocks: one per major:minor, binds and subvolumes of one counted once
    const mountinfo = [
      '22 1 254:0 / / rw - ext4 /dev/vda rw',
      '23 22 0:20 / /proc rw - proc proc rw',
      '24 22 254:0 /srv /srv rw - ext4 /dev/vda rw',
      '25 22 0:39 / /pool rw - btrfs /dev/loop0 rw',
      '26 22 0:39 /sub /pool/sub rw - btrfs /dev/loop0 rw',
      '',
    ].join('\n');
    expect(superblocksMounted(mountinfo)).toBe(3);
    expect(possibleNodes('0\n')).toBe(1);
    expect(possibleNodes('0-3,6\n')).toBe(5);
    expect(possibleNodes()).toBeGreaterThanOrEqual(1);
  });
});
