import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, statSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SANDBOX_CAPABILITIES } from '../src/drivers/namespaces/capabilities.js';
import { SANDBOX_SUPERBLOCKS } from '../src/host/shrinkers.js';
import type { Lab } from '../src/sdk/lab.js';
import type { Sandbox } from '../src/sdk/sandbox.js';
import { SNAPLAB } from './cli-command.js';
import { disposeLab, testLab } from './helpers.js';

const CAP_NUMBERS: Record<string, number> = {
  CAP_CHOWN: 0,
  CAP_DAC_OVERRIDE: 1,
  CAP_FOWNER: 3,
  CAP_FSETID: 4,
  CAP_KILL: 5,
  CAP_SETGID: 6,
  CAP_SETUID: 7,
  CAP_SETPCAP: 8,
  CAP_NET_BIND_SERVICE: 10,
  CAP_NET_RAW: 13,
  CAP_SYS_CHROOT: 18,
  CAP_AUDIT_WRITE: 29,
  CAP_SETFCAP: 31,
};

let lab: Lab;
let box: Sandbox;
beforeAll(async () => {
  lab = await testLab();
  box = await lab.create({ name: 'iso' });
});
afterAll(async () => {
  box?.close(); // undefined when the create in beforeAll failed: the lab is still disposed
  await disposeLab(lab);
});

const sh = async (script: string): Promise<{ code: number; out: string; err: string }> => {
  const r = await box.exec(['sh', '-c', script]);
  return { code: r.exitCode, out: r.stdout.toString().trim(), err: r.stderr.toString().trim() };
};

describe('isolation', () => {
  it('runs in a user namespace of its own (every test here runs inside one)', () => {
    expect(
      box.info.uidBase,
      'the default storage here must give sandboxes a user namespace (btrfs or dir)',
    ).not.toBeNull();
  });

  it('PID 1 inside is the agent and host processes are invisible', async () => {
    expect((await sh('tr "\\0" " " < /proc/1/cmdline')).out).toMatch(/^\/run\/snaplab\/agent serve/);
    const pids = (await sh('ls /proc | grep -E "^[0-9]+$"')).out.split('\n').map(Number);
    expect(pids).not.toContain(process.pid);
    expect(pids.length).toBeLessThan(10);
  });

  it('cannot see or replace the host side of its agent: no socket inside, the agent binary read-only', async () => {
    expect((await sh('ls /run/snaplab')).out).toBe('agent');
    expect((await sh('find / -xdev -type s 2>/dev/null | wc -l')).out).toBe('0');
    expect((await sh('echo x > /run/snaplab/agent')).code).not.toBe(0);
    expect((await sh('echo hello')).out).toBe('hello');
  });

  it('has its own hostname and only a loopback interface', async () => {
    expect((await sh('hostname')).out).toBe('iso');
    const links = (await sh('ip -o link')).out.split('\n');
    expect(links).toHaveLength(1);
    expect(links[0]).toMatch(/^1: lo:/);
  });

  it('keeps exactly the documented capabilities, in every set that matters', async () => {
    const want = SANDBOX_CAPABILITIES.reduce((m, c) => m | (1n << BigInt(CAP_NUMBERS[c]!)), 0n);
    const status = (await sh('grep -E "^Cap(Eff|Bnd)" /proc/self/status')).out;
    for (const line of status.split('\n')) expect(BigInt(`0x${line.split(/\s+/)[1]}`)).toBe(want);
    expect((await sh('grep NoNewPrivs /proc/self/status')).out).toMatch(/1$/);
  });

  it('cannot write outside its root filesystem, mount, or reach the host kernel', async () => {
    const marker = `/snaplab-escape-${process.pid}`;
    await sh(`echo x > ${marker}`); // lands in the sandbox's own root, not the host's
    expect(existsSync(marker)).toBe(false);
    expect((await sh('mount -t tmpfs none /mnt')).code).not.toBe(0);
    // no user namespace: root inside is root outside, so the kernel's tunables must be read-only
    // (a writable kernel.core_pattern would run code on the host)
    const sysctl = await sh('v=$(cat /proc/sys/vm/swappiness); echo $v > /proc/sys/vm/swappiness');
    expect(sysctl.code).not.toBe(0);
    expect(sysctl.err).toMatch(/Read-only/);
    expect((await sh('echo x > /proc/sys/kernel/core_pattern')).code).not.toBe(0);
    // the device nodes are the host's own inodes: read-only mounts, /dev itself read-only
    expect((await sh('chmod 000 /dev/null')).code).not.toBe(0);
    expect(statSync('/dev/null').mode & 0o777).toBe(0o666);
    expect((await sh('echo x > /dev/null && touch /dev/shm/ok && rm /dev/shm/ok')).code).toBe(0);
    expect((await sh('touch /dev/extra')).code).not.toBe(0);
    // the agent (PID 1) cannot be ptraced or have its descriptors read by commands
    expect((await sh('readlink /proc/1/fd/0')).code).not.toBe(0);
    expect((await sh('cat /proc/1/environ')).code).not.toBe(0);
    expect((await sh('mknod /root/sda b 8 0')).code).not.toBe(0);
    // seccomp: namespace creation is refused even where a capability would allow it
    const unshare = await sh('unshare -n true');
    expect(unshare.code).not.toBe(0);
    expect(unshare.err).toMatch(/Operation not permitted|not permitted/i);
  });
});

/** A mount table's rows: superblock (major:minor), mount point, options, filesystem type. */
const mounts = (text: string): { dev: string; at: string; opts: string; fstype: string }[] =>
  text
    .split('\n')
    .filter((l) => l.includes(' - '))
    .map((l) => {
      const [head = '', tail = ''] = l.split(' - ');
      const f = head.split(' ');
      return { dev: f[2]!, at: f[4]!, opts: f[5]!, fstype: tail.split(' ')[0]! };
    });

describe('superblocks (docs/architecture.md "Density")', () => {
  it("holds four of its own: /dev/shm, /run and the /proc masks live in /dev's tmpfs", async () => {
    // each superblock costs every memory cgroup on the host a slot in its shrinker map, up to the
    // host's peak: a tmpfs each for /dev/shm, /run and the masks made it 7
    const host = new Set(mounts(readFileSync('/proc/self/mountinfo', 'utf8')).map((m) => m.dev));
    const inside = mounts((await sh('cat /proc/self/mountinfo')).out);
    // the root is the storage's (the host's btrfs pool or directory here); everything else that is
    // not on a host superblock is the sandbox's own
    const own = new Map(inside.filter((m) => m.at !== '/' && !host.has(m.dev)).map((m) => [m.dev, m.fstype]));
    expect([...own.values()].sort()).toEqual(['devpts', 'mqueue', 'proc', 'tmpfs']);
    expect(own.size).toBe(SANDBOX_SUPERBLOCKS);
    const at = (path: string) => inside.filter((m) => m.at === path).at(-1)!;
    expect(at('/dev/shm').dev).toBe(at('/dev').dev);
    expect(at('/run').dev).toBe(at('/dev').dev);
  });

  it('/run is writable, capped with /dev/shm, and nothing of it shows through /dev', async () => {
    expect((await sh('echo x > /run/mark && cat /run/mark; stat -c %a /run /run/snaplab')).out).toBe('x\n755\n755');
    expect((await sh('stat -f -c "%b %S" /run')).out).toBe('16384 4096');
    expect((await sh('grep " /run " /proc/self/mountinfo')).out).toMatch(/ \/run rw,nosuid,nodev/);
    // /run's directory is under /dev/pts, covered by the devpts instance, which nothing inside can
    // unmount; the agent's start point in /dev is gone
    try {
      expect((await sh('find /dev -name mark -o -name "snaplab*" -o -name ".snaplab*" | wc -l')).out).toBe('0');
      expect((await sh('umount /dev/pts')).code).not.toBe(0);
    } finally {
      await sh('rm /run/mark');
    }
  });

  it('/run and the agent are the same under a host umask of 077; commands start with 022; the idle agent has a small heap and gives back its stacks', async () => {
    // bwrap made /run with umask 0; the agent makes it with whatever umask snaplab was started with
    const r = spawnSync('sh', ['-c', `umask 077 && exec ${SNAPLAB} create --name masked --json`], {
      env: { ...process.env, SNAPLAB_HOME: lab.home },
      encoding: 'utf8',
      timeout: 120_000,
    });
    expect(r.status, r.stderr).toBe(0);
    // its agent, idle with no connection (the CLI's is closed): the seccomp filters are compiled
    // into it, so no heap is left of building them (60-88 KiB when it used libseccomp at start)
    const smaps = readFileSync(`/proc/${JSON.parse(r.stdout).pid}/smaps`, 'utf8');
    const heap = /\[heap\]\n(?:.*\n)*?Rss:\s+(\d+) kB/.exec(smaps);
    expect(Number(heap?.[1] ?? 0)).toBeLessThanOrEqual(32);
    const masked = await lab.get('masked');
    try {
      const out = await masked.exec([
        'sh',
        '-c',
        'umask; stat -c %a /run /run/snaplab; touch /tmp/f; stat -c %a /tmp/f',
      ]);
      expect(out.stdout.toString()).toBe('0022\n755\n755\n644\n');
      // a user who is not root runs the agent, as the file commands do when they act for one
      const v = await masked.exec(['/run/snaplab/agent', '--version'], { user: '65534' });
      expect(v.stderr.toString()).toBe('');
      expect(v.exitCode).toBe(0);
    } finally {
      masked.close();
    }
    // with its commands ended and the connection closed it gives back the stack pages they
    // touched, its own and the spawn's, its few written globals share pages, and musl's allocator
    // keeps little (its stack 12 KiB and ~28 anonymous in all here; linked with glibc 61-69, with
    // glibc before the stacks 80-104: docs/architecture.md "Density")
    const anon = (): { stack: number; all: number } => {
      let stack = 0;
      let all = 0;
      let inStack = false;
      for (const line of readFileSync(`/proc/${JSON.parse(r.stdout).pid}/smaps`, 'utf8').split('\n')) {
        if (/^[0-9a-f]+-[0-9a-f]+ /.test(line)) inStack = line.endsWith('[stack]');
        const m = /^Anonymous:\s+(\d+) kB/.exec(line);
        if (m) {
          all += Number(m[1]);
          if (inStack) stack += Number(m[1]);
        }
      }
      return { stack, all };
    };
    // it trims once it has seen the connection close: poll briefly (a live agent's stack is never
    // 0: an ended one, unreaped, shows an empty smaps)
    await expect
      .poll(anon, { timeout: 2000, interval: 50 })
      .toSatisfy((a) => a.stack > 0 && a.stack <= 16 && a.all <= 44);
    await masked.destroy();
  });

  it('/dev/shm is a writable directory of /dev, mode 1777, capped at 64 MiB; /dev stays read-only', async () => {
    expect((await sh('stat -c %a /dev/shm; stat -f -c "%b %S" /dev/shm')).out).toBe('1777\n16384 4096');
    const full = await sh('dd if=/dev/zero of=/dev/shm/big bs=1M count=65 2>&1; r=$?; rm -f /dev/shm/big; exit $r');
    expect(full.code).not.toBe(0);
    expect(full.out).toMatch(/No space left on device/);
    expect((await sh('echo x > /dev/shm/a && cat /dev/shm/a')).out).toBe('x');
    // the one superblock does not open /dev: no link, rename or path through /dev/shm reaches it
    expect((await sh('ln /dev/shm/a /dev/a')).code).not.toBe(0);
    expect((await sh('mv /dev/shm/a /dev/a')).code).not.toBe(0);
    expect((await sh('touch /dev/shm/../extra')).code).not.toBe(0);
    expect((await sh('rm /dev/shm/a; ls -A /dev | grep -c -e "^a$" -e extra -e snaplab')).out).toBe('0');
    expect((await sh('mount -o remount,rw /dev')).code).not.toBe(0);
  });

  it.runIf(existsSync('/proc/acpi'))(
    'the /proc masks still hold: empty, read-only, nothing can be made in them',
    async () => {
      expect((await sh('ls -A /proc/acpi | wc -l')).out).toBe('0');
      expect((await sh('touch /proc/acpi/x')).code).not.toBe(0);
      expect((await sh('mkdir /proc/acpi/d')).code).not.toBe(0);
      expect((await sh('mount -o remount,rw /proc/acpi')).code).not.toBe(0);
      expect((await sh('umount /proc/acpi')).code).not.toBe(0);
      expect((await sh('grep " /proc/acpi " /proc/self/mountinfo')).out).toMatch(/ \/proc\/acpi ro,/);
      expect((await sh('wc -c < /proc/keys')).out).toBe('0'); // a file mask: /dev/null, as before
    },
  );
});

describe('limits', () => {
  it('a fork bomb stops at the pids limit and the sandbox survives', async () => {
    await using small = await lab.create({ limits: { pids: 32 } });
    const r = await small.exec(['sh', '-c', 'i=0; while [ $i -lt 100 ]; do sleep 5 & i=$((i+1)); done; wait'], {
      timeoutMs: 3000,
    });
    expect(r.stderr.toString()).toMatch(/fork/i);
    expect((await small.exec(['echo', 'alive'])).stdout.toString()).toBe('alive\n');
  });

  it('a memory hog is OOM-killed inside its cgroup and exec reports it', async () => {
    await using small = await lab.create({ limits: { memoryBytes: 32 * 2 ** 20 } });
    const r = await small.exec(['dd', 'if=/dev/zero', 'of=/dev/null', 'bs=200M', 'count=1']);
    expect(r.signal).toBe(9);
    expect(r.exitCode).toBe(137);
    expect(r.oomKilled).toBe(true);
    expect((await small.exec(['echo', 'alive'])).stdout.toString()).toBe('alive\n');
    // a shell passes on its child's end as 137: the OOM killer's too (found by the soak). In a
    // pipeline the killer may take a second command while tail is still dying (head's next pipe
    // page finds the memory not yet given back): then the shell itself is the one killed. Either
    // way 137 and OOM-killed; never the agent, which ended the machine before commands were the
    // killer's first choice (CI, 2026-12-02: "connection to agent closed")
    const piped = await small.exec(['sh', '-c', 'head -c 200m /dev/zero | tail > /dev/null']);
    expect([piped.exitCode, piped.oomKilled]).toEqual([137, true]);
    // and a SIGKILL that was not the OOM killer's is not called one, even after an OOM kill
    // that no command reported (the counter is read before every command). The killer takes dd
    // (the shell passes on 0), or now and then the shell itself, which scores as high (CI,
    // 2026-12-05): then that command is reported as what it is, 137 and OOM-killed
    const masked = await small.exec(['sh', '-c', 'dd if=/dev/zero of=/dev/null bs=200M count=1 2>/dev/null || true']);
    expect([
      [0, false],
      [137, true],
    ]).toContainEqual([masked.exitCode, masked.oomKilled]);
    // when the killer took the shell first, its dd lives on, still filling memory, and its kill
    // is counted while the next command runs: the counter is the sandbox's, not a command's, so
    // that kill would be laid to the next one (CI, 2026-12-05; documented in the README). The
    // check below is about a SIGKILL that no OOM kill came near: it starts once dd is gone. dd is
    // killed and waited for, and asked again when the killer took the asking shell instead (as
    // scored as dd: CI, 2026-12-05, the wait ended 137 at once)
    let settled = { exitCode: -1 };
    for (let i = 0; i < 20 && settled.exitCode !== 0; i++)
      settled = await small.exec(
        ['sh', '-c', 'killall -9 dd 2>/dev/null; while pidof dd > /dev/null; do usleep 50000; done'],
        { timeoutMs: 10_000 },
      );
    expect(settled.exitCode, "the masked command's dd still there").toBe(0);
    const killed = await small.exec(['sh', '-c', 'sleep 5 & kill -9 $!; wait $!']);
    expect([killed.exitCode, killed.oomKilled]).toEqual([137, false]);
  });

  it('the OOM killer takes commands first: a command scores 1000, the agent what the host gave it', async () => {
    // a memory cgroup's killer picks by score; at equal scores the agent (or bwrap above it) can
    // be a dying victim's successor, and the machine ends with it. The agent writes the score
    // once the command has exec'd (it cannot before: docs/architecture.md), so it is read a
    // moment later: at once it could still be the agent's (CI, 2026-12-05, under load)
    expect((await sh('usleep 200000; cat /proc/$$/oom_score_adj')).out).toBe('1000');
    expect((await sh('cat /proc/1/oom_score_adj')).out).toBe(readFileSync('/proc/self/oom_score_adj', 'utf8').trim());
  });
});

describe('exit codes, timeouts and signals', () => {
  it("passes the command's code through; 127 not found; 128+N for signals", async () => {
    expect((await box.exec(['sh', '-c', 'exit 42'])).exitCode).toBe(42);
    const nf = await box.exec(['no-such-binary']);
    expect(nf.exitCode).toBe(127);
    expect(nf.stderr.toString()).toMatch(/not found/);
    expect((await box.exec(['sh', '-c', 'kill -TERM $$'])).exitCode).toBe(143);
  });

  it('a timeout kills the whole process group: 124, nothing left running', async () => {
    const r = await box.exec(['sh', '-c', 'sleep 30 & sleep 30'], { timeoutMs: 300 });
    expect(r.exitCode).toBe(124);
    expect(r.timedOut).toBe(true);
    expect((await sh('ps -o comm | grep -c sleep || true')).out).toBe('0');
  });

  it('feeds stdin, sets env and cwd', async () => {
    expect((await box.exec(['cat'], { stdin: 'hello' })).stdout.toString()).toBe('hello');
    expect(
      (await box.exec(['sh', '-c', 'echo $FOO; pwd'], { env: { FOO: 'bar' }, cwd: '/tmp' })).stdout.toString(),
    ).toBe('bar\n/tmp\n');
  });

  it('streams output as it comes', async () => {
    const chunks: string[] = [];
    const r = await box.exec(['sh', '-c', 'echo a; sleep 0.3; echo b'], { onStdout: (b) => chunks.push(b.toString()) });
    expect(r.exitCode).toBe(0);
    expect(chunks.join('')).toBe('a\nb\n');
    expect(chunks.length).toBeGreaterThanOrEqual(2);
  });
});
