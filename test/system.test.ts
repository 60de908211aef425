import {
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmdirSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { nspawnArm } from '../src/bench/nspawn-baseline.js';
import { NSPAWN_CGROUP_PREFIX, nspawnCgroupDirs, nspawnRunName } from '../src/host/cgroups/nspawn.js';
import { processStartTime } from '../src/host/procs.js';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cgroupFor, pids } from '../src/host/cgroups/cgroups.js';
import type { Lab } from '../src/sdk/lab.js';
import type { Sandbox } from '../src/sdk/sandbox.js';
import { disposeLab, testLab } from './helpers.js';
import { SNAPLAB, snaplabInPrivateMounts } from './cli-command.js';
import { cachedImage, debianArgs } from './image-cache.js';
import { spawnSync } from 'node:child_process';

// System machines: Debian 12 with its own systemd as PID 1 (bookworm minbase from Debian's archive,
// built once and kept between runs: test/image-cache.ts; the builds themselves are
// test/debian-image.test.ts's and test/templates.test.ts's, and this file's debian-lab case's).
let lab: Lab;
beforeAll(async () => {
  lab = await testLab();
  await cachedImage(lab.home, debianArgs('sysd', ['systemd', 'systemd-sysv', 'sudo', 'dbus']), 'sysd');
}, 900_000);
afterAll(async () => {
  await disposeLab(lab);
});

const out = async (box: Sandbox, argv: string[], user?: string): Promise<string> => {
  const r = await box.exec(argv, user ? { user } : {});
  expect(r.exitCode, `${argv.join(' ')}: ${r.stderr.toString()}`).toBe(0);
  return r.stdout.toString().trim();
};

/** A unit whose stop writes /root/halt-mark: only a clean halt stops units (a kill would not). */
const markHalt = (box: Sandbox): Promise<string> =>
  out(box, [
    'systemd-run',
    '--unit=mark',
    '--remain-after-exit',
    '-p',
    'ExecStop=/bin/sh -c "echo halted-cleanly > /root/halt-mark"',
    '/bin/true',
  ]);

describe('system machines (--init systemd) on namespaces', () => {
  it("boot the image's systemd as PID 1 to running, no unit failed, in a user namespace; the agent runs beside it", async () => {
    await using box = await lab.create({ image: 'sysd', init: 'systemd', name: 'sys1' });
    expect(box.info).toMatchObject({ state: 'running', init: 'systemd', reason: null });
    expect(box.lastTrace?.phases.map((p) => p.name)).toContain('systemd up');
    expect(await out(box, ['systemctl', 'is-system-running'])).toBe('running');
    expect(await out(box, ['systemctl', '--failed', '--plain', '--no-legend'])).toBe('');
    expect(await out(box, ['cat', '/proc/1/comm'])).toBe('systemd');
    expect(await out(box, ['cat', '/proc/self/uid_map'])).toMatch(new RegExp(`^0\\s+${box.info.uidBase}\\s+65536$`));
    expect(await out(box, ['hostname'])).toBe('sys1');
  });

  it('keep a service running across exec sessions; sudo works for an unprivileged user', async () => {
    await using box = await lab.create({ image: 'sysd', init: 'systemd' });
    await out(box, ['systemd-run', '--unit=sleeper', '--', 'sleep', '1000']);
    box.close();
    await using again = await lab.get(box.info.name);
    expect(await out(again, ['systemctl', 'is-active', 'sleeper'])).toBe('active');
    await out(again, [
      'sh',
      '-c',
      'useradd -m -s /bin/sh app && echo "app ALL=(ALL) NOPASSWD:ALL" > /etc/sudoers.d/app && chmod 440 /etc/sudoers.d/app',
    ]);
    expect(await out(again, ['id', '-u'], 'app')).toBe('1000');
    expect(await out(again, ['sudo', '-n', 'id', '-u'], 'app')).toBe('0');
  });

  it('are held to their memory limit from outside: a hog inside is OOM-killed, systemd stays up', async () => {
    await using box = await lab.create({ image: 'sysd', init: 'systemd', limits: { memoryBytes: 256 * 2 ** 20 } });
    const r = await box.exec(['dd', 'if=/dev/zero', 'of=/dev/null', 'bs=600M', 'count=1']);
    expect(r.exitCode).not.toBe(0);
    expect(r.oomKilled).toBe(true);
    expect(await out(box, ['systemctl', 'is-system-running'])).toMatch(/running|degraded/);
  });

  it('rm kills outright (its files go: no halt) and leaves no cgroup, unified subtree included', async () => {
    const box = await lab.create({ image: 'sysd', init: 'systemd' });
    const cg = cgroupFor(box.info.id);
    expect([...cg.dirs, ...(cg.unifiedDir ? [cg.unifiedDir] : [])].every(existsSync)).toBe(true);
    // a unit whose stop takes 30 s: a halt would wait out its 10 s grace before the kill
    await box.putFile(
      '/etc/systemd/system/slow-stop.service',
      '[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\nExecStop=/bin/sleep 30\n[Install]\nWantedBy=multi-user.target\n',
    );
    expect((await box.exec(['systemctl', 'start', 'slow-stop.service'])).exitCode).toBe(0);
    const t0 = performance.now();
    await box.destroy();
    expect(performance.now() - t0).toBeLessThan(8000);
    expect([...cg.dirs, ...(cg.unifiedDir ? [cg.unifiedDir] : [])].some(existsSync)).toBe(false);
  });

  it('stop halts cleanly and keeps the filesystem: refused for exec, taken by snapshot, booted again by restore', async () => {
    const box = await lab.create({ image: 'sysd', init: 'systemd' });
    await markHalt(box);
    const t0 = performance.now();
    const t = await box.stop();
    expect(performance.now() - t0).toBeLessThan(10_000);
    expect(t.phases.map((p) => p.name)).toContain('halt');
    const stopped = await lab.get(box.id);
    expect([stopped.state, stopped.info.reason]).toEqual(['dead', expect.stringMatching(/^stopped/)]);
    await expect(stopped.exec(['true'])).rejects.toMatchObject({
      code: 'SANDBOX_STOPPED',
      message: expect.stringMatching(/is stopped/),
    });
    await stopped.snapshot('after-stop');
    await using again = await lab.restore('after-stop');
    expect(await out(again, ['cat', '/root/halt-mark'])).toBe('halted-cleanly');
    expect(await out(again, ['systemctl', 'is-system-running'])).toBe('running');
    await again.destroy();
    await lab.removeSnapshot('after-stop');
    await stopped.destroy();
  });

  it("restore from a snapshot boots systemd again, with the snapshot's files", async () => {
    await using box = await lab.create({ image: 'sysd', init: 'systemd' });
    await out(box, ['sh', '-c', 'echo kept > /etc/kept']);
    await box.snapshot('sys-snap');
    const copy = await lab.restore('sys-snap');
    expect(copy.info.init).toBe('systemd');
    expect(await out(copy, ['systemctl', 'is-system-running'])).toBe('running');
    expect(await out(copy, ['cat', '/etc/kept'])).toBe('kept');
    await copy.destroy();
    await lab.removeSnapshot('sys-snap');
  });

  it('run in scenarios: unit and systemd ready checks, a busybox machine reaches it over the scenario network, a reset boots it again', async () => {
    const file = join(lab.home, 'system-scenario.yaml');
    writeFileSync(
      file,
      [
        'networks:',
        '  lan: 10.77.19.0/24',
        'machines:',
        '  web:',
        '    image: sysd',
        '    init: systemd',
        '    networks: { lan: {} }',
        '    start:',
        '      - run: systemd-run --unit=hello -- sleep 1000',
        '    ready:',
        '      - systemd: running',
        '      - unit: hello.service',
        '  client:',
        '    networks: { lan: {} }',
        '    ready:',
        '      - command: ping -c 1 -W 2 web',
      ].join('\n'),
    );
    const scn = await lab.up(file, { name: 'sysscn' });
    try {
      const web = await lab.get('sysscn/web');
      expect(web.info.init).toBe('systemd');
      web.close();
      await scn.snapshot('base');
      await scn.reset('base');
      await using again = await lab.get('sysscn/web');
      expect(await out(again, ['systemctl', 'is-active', 'hello'])).toBe('active');
      expect(await out(again, ['systemctl', 'is-system-running'])).toBe('running');
    } finally {
      await scn.down();
    }
  });

  it('are what an image with systemd makes by default (found when the image is made, here by its import); --init agent makes the agent PID 1 instead', async () => {
    expect((await lab.images()).find((i) => i.name === 'sysd')?.provenance?.init).toBe('systemd');
    await using box = await lab.create({ image: 'sysd' });
    expect(box.info.init).toBe('systemd');
    await using plain = await lab.create({ image: 'sysd', init: 'agent' });
    expect(plain.info.init).toBeNull();
    expect(await out(plain, ['cat', '/proc/1/comm'])).toBe('agent');
  });

  it('the shipped debian-lab example: four Debian machines provisioned, the proxy balancing over both web servers, a reset brings all back', async () => {
    const dir = join(import.meta.dirname, '..', 'examples', 'scenarios', 'debian-lab');
    const packages = readFileSync(join(dir, 'packages'), 'utf8').trim().split(',');
    await lab.buildImage({ suite: 'bookworm', variant: 'minbase', packages }, { name: 'debian-lab' });
    const scn = await lab.up(join(dir, 'scenario.yaml'), { name: 'dlab' });
    try {
      await using proxy = await lab.get('dlab/proxy');
      const answers = new Set<string>();
      for (let i = 0; i < 4; i++) answers.add(await out(proxy, ['curl', '-sf', 'http://127.0.0.1/']));
      expect([...answers].sort()).toEqual(['hello from web1', 'hello from web2']);
      await scn.snapshot('base');
      // its standby (four more Debian machines booted from the snapshot) is raised in the background
      const end = Date.now() + 180_000;
      while ((await scn.status()).standby?.state !== 'ready' && Date.now() < end)
        await new Promise((r) => setTimeout(r, 250));
      expect((await scn.status()).standby).toMatchObject({ state: 'ready', snapshot: 'base' });
      const r = await scn.reset('base');
      expect(r.standby).toBe('swapped');
      expect(r.trace.phases.map((p) => p.name).filter((p) => /^(raise|start|ready) /.test(p))).toEqual([]);
      await using again = await lab.get('dlab/proxy');
      expect(await out(again, ['curl', '-sf', 'http://127.0.0.1/'])).toMatch(/^hello from web[12]$/);
      expect(await out(again, ['systemctl', 'is-active', 'haproxy'])).toBe('active');
    } finally {
      await scn.down();
    }
  }, 300_000);

  it('keep their agent out of reach of their root (who has CAP_SYS_PTRACE): no process inside is it, so none can take its socket', async () => {
    await using box = await lab.create({ image: 'sysd', init: 'systemd' });
    // every process the machine can name, by its command line: systemd and its services, never the
    // agent, whose listening socket pidfd_getfd would hand to the machine's root
    const cmdlines = await out(box, ['sh', '-c', 'for f in /proc/[0-9]*/cmdline; do tr "\\0" " " <"$f"; echo; done']);
    expect(cmdlines).toMatch(/systemd/);
    expect(cmdlines).not.toMatch(/agent serve/);
    // a command's parent, the agent, has no pid in the machine's pid namespace
    expect(await out(box, ['sh', '-c', 'cut -d" " -f4 /proc/$$/stat'])).toBe('0');
    // the child the agent clones per command is in the machine until it execs, with the agent's
    // memory and descriptors: that memory is the initial user namespace's (the agent binary is
    // unreadable inside), so ptrace, pidfd_getfd and /proc/PID/mem need CAP_SYS_PTRACE on the host.
    // The kernel shows it in who owns a non-dumpable process's /proc files (its directory aside):
    // the root of that namespace, here the host's (with the binary readable: the machine's root)
    const procs = await pids(cgroupFor(box.info.id)); // its leaves included (supervisor, payload)
    const agent = procs.find((p) => readFileSync(`/proc/${p}/cmdline`, 'utf8').startsWith('/run/snaplab/agent\0serve'));
    expect(agent).toBeDefined();
    expect(box.info.uidBase).toBeGreaterThan(0);
    expect(statSync(`/proc/${agent}/environ`).uid).toBe(0); // not box.info.uidBase
    // the agent, outside, still makes its commands the OOM killer's first choice
    expect(await out(box, ['cat', '/proc/self/oom_score_adj'])).toBe('1000');
    // a command holds nothing of the agent's: its descriptors are its own three
    // (read off a child the shell started first: the shell itself holds a pipe's ends or a saved
    // descriptor while it runs a pipeline or a redirection, and ls saw 4 or 10; the child is read
    // once it sleeps: just after exec the loader holds libc.so.6 open as 3, which a CI run saw)
    expect(
      await out(box, [
        'sh',
        '-c',
        'sleep 30 & p=$!; until [ "$(cut -d" " -f2,3 /proc/$p/stat)" = "(sleep) S" ]; do :; done; ls /proc/$p/fd > /tmp/fds; kill $p; sort -n /tmp/fds | tr "\\n" " "',
      ]),
    ).toBe('0 1 2');
    // a terminal's command: its pid is the one it has in the machine, and killing it ends its
    // whole session, a job in a process group of its own included (signalled through /proc, whose
    // numbers are not the agent's)
    const sleepers = async (): Promise<string> =>
      out(box, [
        'sh',
        '-c',
        'for f in /proc/[0-9]*/cmdline; do tr "\\0" " " <"$f"; echo; done | grep -c "^sleep 301" || true',
      ]);
    const term = await box.spawn(['sh', '-c', 'set -m; sleep 301 & sleep 302'], { tty: { cols: 80, rows: 24 } });
    const shPid = await term.pid;
    for (let i = 0; i < 100 && (await sleepers()) !== '1'; i++) await new Promise((r) => setTimeout(r, 50));
    expect(await out(box, ['sh', '-c', `tr "\\0" " " </proc/${shPid}/cmdline`])).toBe(
      'sh -c set -m; sleep 301 & sleep 302',
    );
    term.kill(9);
    await term.result;
    for (let i = 0; i < 100 && (await sleepers()) !== '0'; i++) await new Promise((r) => setTimeout(r, 50));
    expect(await sleepers()).toBe('0');
    // the agent serves on: exec, files, sudo as before
    await out(box, ['sh', '-c', 'echo kept > /root/f']);
    expect((await box.getFile('/root/f')).toString()).toBe('kept\n'); // read by the agent itself, in the machine's root
  });

  it("keep the host's hold: no subvolume can be nested, the console log and the cgroup subtree are bounded", async () => {
    await using box = await lab.create({ image: 'sysd', init: 'systemd' });
    // BTRFS_IOC_SUBVOL_CREATE: a nested subvolume would make the machine's root undeletable
    if (box.info.storage === 'btrfs') {
      const sub = await out(box, [
        'perl',
        '-e',
        'open(my $d, "<", "/root") or die; my $a = pack("q a4088", 0, "nested"); print ioctl($d, 0x5000940e, $a) ? "made" : "refused: $!"',
      ]);
      expect(sub).toMatch(/^refused: Operation not permitted/);
    }
    await out(box, ['sh', '-c', 'head -c 20971520 /dev/zero | tr "\\0" x > /dev/console']);
    await new Promise((r) => setTimeout(r, 500));
    const log = statSync(join(lab.home, 'run', box.info.id, 'agent.log')).size;
    expect(log).toBeGreaterThan(16 << 20);
    expect(log).toBeLessThan((16 << 20) + (1 << 16));
    // a v1 hierarchy mounted inside shows the machine's own subtree, not the host's (where snaplab/ is)
    const seen = await out(box, [
      'sh',
      '-c',
      'for h in cpuset devices; do mkdir -p /tmp/h-$h && mount -t cgroup -o $h none /tmp/h-$h && ls /tmp/h-$h; umount /tmp/h-$h; done',
    ]);
    expect(seen).toContain('cgroup.procs');
    expect(seen).not.toContain('snaplab');
    // systemd's own nesting is shallow; a chain past the delegated depth is refused
    const deep = await box.exec([
      'sh',
      '-c',
      'cd /sys/fs/cgroup && for i in $(seq 1 20); do mkdir d && cd d || exit 7; done',
    ]);
    expect(deep.exitCode).toBe(7);
  });

  it('keep the monitor idle when nothing holds the console, and boot past a FIFO where /etc/hosts was', async () => {
    await using box = await lab.create({ image: 'sysd', init: 'systemd' });
    await out(box, ['systemctl', 'stop', 'console-getty.service']);
    const monitor = Number(
      readFileSync(`/proc/${box.info.pid}/stat`, 'utf8')
        .replace(/^.*\) /s, '')
        .split(' ')[1],
    );
    const cpu = (): number =>
      readFileSync(`/proc/${monitor}/stat`, 'utf8')
        .replace(/^.*\) /s, '')
        .split(' ')
        .slice(11, 13)
        .map(Number)
        .reduce((a, b) => a + b, 0);
    const before = cpu();
    await new Promise((r) => setTimeout(r, 1000));
    expect(cpu() - before).toBeLessThan(10); // clock ticks (1/100 s) in a second: it spun at ~95 before
    await out(box, ['sh', '-c', 'rm /etc/hosts && mkfifo /etc/hosts']);
    await box.snapshot('fifo-hosts');
    const copy = await lab.restore('fifo-hosts');
    expect(await out(copy, ['systemctl', 'is-system-running'])).toBe('running');
    await copy.destroy();
    await lab.removeSnapshot('fifo-hosts');
  });

  it('show their journal with snaplab logs; create --trace names the slowest units', () => {
    const env = { ...process.env, SNAPLAB_HOME: lab.home };
    const created = spawnSync(
      SNAPLAB,
      ['create', '--image', 'sysd', '--init', 'systemd', '--name', 'logged', '--trace'],
      { env, encoding: 'utf8' },
    );
    expect(created.status, created.stderr).toBe(0);
    expect(created.stdout).toBe('logged\n'); // the result on stdout, what it took on stderr
    expect(created.stderr).toMatch(/^created logged .* \(systemd running\)/);
    expect(created.stderr).toMatch(/systemd up[\s\S]*slowest units \(systemd-analyze blame\):\n {2}\d+ms \S+/);
    const logs = spawnSync(SNAPLAB, ['logs', 'logged', '-n', '50'], { env, encoding: 'utf8' });
    expect(logs.status, logs.stderr).toBe(0);
    expect(logs.stdout).toMatch(/Startup finished in/);
    expect(spawnSync(SNAPLAB, ['rm', 'logged'], { env }).status).toBe(0);
  });

  it('boot Debian 13 (systemd 257) too: its systemctl says "system scope bus" while it starts', async () => {
    // built once, kept between runs (test/image-cache.ts), as sysd is
    await cachedImage(lab.home, debianArgs('sysd13', ['systemd', 'systemd-sysv', 'dbus'], 'trixie'), 'sysd13');
    await using box = await lab.create({ image: 'sysd13', init: 'systemd' });
    expect(await out(box, ['systemctl', 'is-system-running'])).toBe('running');
    expect(await out(box, ['sh', '-c', '. /etc/os-release && echo $VERSION_CODENAME'])).toBe('trixie');
    // an exec is in the machine's cgroup namespace, where its systemd can move it into a scope
    expect(await out(box, ['sh', '-c', 'grep ^0:: /proc/self/cgroup'])).toBe('0::/snaplab-agent');
    expect(await out(box, ['sh', '-c', 'systemd-run --scope --quiet grep ^0:: /proc/self/cgroup'])).toMatch(
      /^0::\/.*\.scope$/,
    );
  }, 600_000);

  it("boot where the host's /dev is mounted nosuid (stock Debian), under a umask of 077: the agent's and boot's remounts keep the locked flag, the machine's modes are its own", async () => {
    const env = { ...process.env, SNAPLAB_HOME: lab.home, SNAPLAB_NO_FAST: '1' };
    const made = snaplabInPrivateMounts(
      "mount -o remount,bind,nosuid /dev && grep -q ' /dev .*nosuid' /proc/self/mountinfo && umask 077",
      ['create', '--image', 'sysd', '--name', 'nosuid-sys'],
      env,
    );
    // nothing but the result on stdout and what the create took on stderr: no warning, no error
    expect([made.stdout, made.stderr]).toEqual([
      'nosuid-sys\n',
      expect.stringMatching(/^created nosuid-sys \(\w+\) on \w+ in [^\n]+ \(systemd running\)\n$/),
    ]);
    expect(made.status).toBe(0);
    const box = await lab.get('nosuid-sys');
    try {
      expect(await out(box, ['systemctl', 'is-system-running', '--wait'])).toBe('running');
      expect(await out(box, ['sh', '-c', 'grep -c " /proc/keys " /proc/self/mountinfo'])).toBe('1');
      // boot made /run/snaplab with the host's umask before it set its own: a user runs the agent
      expect(await out(box, ['stat', '-c', '%a', '/run/snaplab'])).toBe('755');
      expect(await out(box, ['/run/snaplab/agent', '--version'], 'nobody')).toMatch(/^snaplab-agent /);
    } finally {
      await box.destroy();
    }
  });

  it("refuse to run without a user namespace; the image's default gives way to --no-userns", async () => {
    await expect(lab.create({ image: 'sysd', init: 'systemd', userns: false })).rejects.toMatchObject({
      code: 'BAD_INPUT',
      message: expect.stringContaining('user namespace'),
    });
    await using plain = await lab.create({ image: 'sysd', userns: false });
    expect(plain.info.init).toBeNull();
  });

  it('stop halts promptly when paused; logs -f is for system machines only', async () => {
    const box = await lab.create({ image: 'sysd', init: 'systemd' });
    await box.pause();
    const t0 = performance.now();
    await box.stop();
    expect(performance.now() - t0).toBeLessThan(5000); // frozen, it would have waited out the 10 s grace
    await box.destroy();
    await using plain = await lab.create({});
    const r = spawnSync(SNAPLAB, ['logs', plain.info.name, '-f'], {
      env: { ...process.env, SNAPLAB_HOME: lab.home },
      encoding: 'utf8',
    });
    expect(r.status).not.toBe(0);
    expect(r.stderr).toMatch(/BAD_INPUT[\s\S]*follow needs a system machine/);
  });
});

/**
 * The escape suite (test/escapes/) from inside a system machine, as its root: its seccomp filter
 * allows what systemd needs (mount, unshare, ptrace of its own processes; not keyrings), so what
 * stands between it and the host is its user namespace (ids the host does not map), its cgroup
 * and pid namespaces, and the kernel's rules for a namespace's root. Each answer is the kernel's,
 * read by the same probe (test/escapes/probe.c).
 */
describe('system machines attacked from inside (root, with mount and unshare allowed)', () => {
  it('cannot reach the host: kernel tunables, devices, modules, the clock, other machines, its own limits', async () => {
    const scratch = mkdtempSync(join(tmpdir(), 'snaplab-test-sys-escape-'));
    try {
      const built = spawnSync(
        'gcc',
        ['-O2', '-static', '-o', join(scratch, 'probe'), join(import.meta.dirname, 'escapes', 'probe.c')],
        { encoding: 'utf8' },
      );
      expect(built.status, built.stderr).toBe(0);
      await using box = await lab.create({ image: 'sysd', init: 'systemd', name: 'sys-attacker' });
      await using other = await lab.create({ name: 'sys-victim' });
      await box.putFile('/probe', readFileSync(join(scratch, 'probe')), 0o755);
      const probe = async (...args: string[]): Promise<string> => out(box, ['/probe', ...args]);
      const sh = async (script: string): Promise<string> => out(box, ['sh', '-c', script]);

      // the kernel's tunables and triggers (core_pattern is the classic way out), /sys
      expect(['EACCES', 'EROFS', 'EPERM']).toContain(await probe('write', '/proc/sys/kernel/core_pattern'));
      expect(['EACCES', 'EROFS', 'EPERM', 'ENOENT']).toContain(await probe('write', '/proc/sysrq-trigger'));
      expect(['EROFS', 'EACCES', 'EPERM']).toContain(
        await probe('write', '/sys/kernel/mm/transparent_hugepage/enabled'),
      );
      // devices, host inodes by handle, vsock, nested subvolumes, kernel surfaces
      for (const [t, want] of [
        ['mknod', 'EPERM'],
        ['open_by_handle', 'EPERM'],
        ['subvol', 'EPERM'],
        ['vsock', 'EAFNOSUPPORT'],
        ['io_uring', 'EPERM'],
        ['keyctl', 'EPERM'],
        ['add_key', 'EPERM'],
        ['bpf', 'EPERM'],
        ['userfaultfd', 'EPERM'],
      ] as const) {
        expect(await probe(t), t).toBe(want);
      }
      expect(['EACCES', 'EPERM']).toContain(await probe('perf'));
      // modules, kexec, the clock: not the machine's (ENOSYS where this kernel has no module support)
      for (const t of ['init_module', 'finit_module', 'delete_module'])
        expect(['EPERM', 'ENOSYS'], t).toContain(await probe(t));
      for (const t of ['kexec_load', 'kexec_file_load', 'settime', 'settimeofday', 'adjtimex'])
        expect(await probe(t), t).toBe('EPERM');
      // the host and other machines are not there to trace (its own processes are: PID 1 is its systemd)
      expect(await probe('ptrace', String(process.pid))).toBe('ESRCH');
      expect(await probe('ptrace', String(other.info.pid))).toBe('ESRCH');
      // the agent's binary is the host's file, read-only to it
      expect(await probe('write', '/run/snaplab/agent')).toBe('EACCES');
      // a procfs of its own shows its own processes only: not this test's runner, whose command
      // line names vitest on the host ("vi[t]est": the grep's own command line does not match)
      expect(readFileSync('/proc/self/cmdline', 'utf8')).toMatch(/vitest/);
      expect(
        await sh(
          'mkdir -p /tmp/p && mount -t proc proc /tmp/p && (grep -l "vi[t]est" /tmp/p/[0-9]*/cmdline | wc -l); umount /tmp/p',
        ),
      ).toBe('0');
      // cgroupfs mounted inside (CVE-2022-0492 wrote a release_agent this way), on a host with v1
      // hierarchies: each is rooted at the machine's own cgroup (snaplab makes one in every
      // hierarchy, those it sets no limit in too), so there is no release_agent; and its limits
      // are the host's files, which it cannot write
      const v1 = await sh(
        'mkdir -p /tmp/cg && mount -t cgroup -o freezer cgroup /tmp/cg 2>/dev/null && echo yes || echo no',
      );
      if (v1 === 'yes') {
        await sh('umount /tmp/cg');
        for (const h of ['freezer', 'devices', 'blkio', 'cpuset', 'memory', 'pids']) {
          expect(
            await sh(
              `mount -t cgroup -o ${h} cgroup /tmp/cg && (test -e /tmp/cg/release_agent && echo agent-file || echo none); (echo /x > /tmp/cg/release_agent) 2>/dev/null && echo wrote || echo refused; umount /tmp/cg`,
            ),
            h,
          ).toBe('none\nrefused');
        }
        const cg = await sh(
          [
            'mount -t cgroup -o memory cgroup /tmp/cg',
            '(echo -1 > /tmp/cg/memory.limit_in_bytes) 2>/dev/null && echo raised || echo refused',
            'cat /tmp/cg/memory.limit_in_bytes; umount /tmp/cg',
            'mount -t cgroup -o pids cgroup /tmp/cg && ((echo max > /tmp/cg/pids.max) 2>/dev/null && echo raised || echo refused); cat /tmp/cg/pids.max; umount /tmp/cg',
          ].join('; '),
        );
        expect(cg.split('\n')).toEqual([
          'refused',
          String(box.info.limits.memoryBytes),
          'refused',
          String(box.info.limits.pids),
        ]);
      }
      // a user namespace it makes is nested in its own: no more than it has
      expect(
        await sh('unshare -U -r sh -c "/probe write /proc/sys/kernel/core_pattern; /probe mknod; /probe mount-proc"'),
      ).toBe('EACCES\nEPERM\nEPERM');
      expect((await other.exec(['echo', 'victim fine'])).stdout.toString()).toBe('victim fine\n');
    } finally {
      rmSync(scratch, { recursive: true, force: true });
    }
  });
});

describe("system machines on qemu (the image's systemd boots in a VM)", () => {
  // one VM booted for both halves (a boot here is ~12 s of emulation): the restored copy is the one stopped
  it("boot to running from the VM's disk with the agent as a unit; a memory restore resumes them running, services and all, without a boot; stop powers the guest off cleanly (its units stopped) and keeps the disk; a restore of it boots again", async () => {
    // an image with systemd boots it on qemu too, by default (no user namespace needed: the VM is the boundary)
    const vm = await lab.create({ driver: 'qemu', image: 'sysd', name: 'vmsys' });
    try {
      expect(vm.info).toMatchObject({ state: 'running', init: 'systemd', driver: 'qemu', reason: null });
      expect(vm.lastTrace?.phases.map((p) => p.name)).toContain('systemd up');
      expect(await out(vm, ['cat', '/proc/1/comm'])).toBe('systemd');
      expect(await out(vm, ['systemctl', 'is-system-running'])).toBe('running');
      expect(await out(vm, ['systemctl', '--failed', '--plain', '--no-legend'])).toBe('');
      // the agent is a runtime unit of the guest's (in /run: nothing written into the image)
      expect(await out(vm, ['systemctl', 'is-active', 'snaplab-agent'])).toBe('active');
      expect(await out(vm, ['systemctl', 'show', '-p', 'FragmentPath', '--value', 'snaplab-agent'])).toBe(
        '/run/systemd/system/snaplab-agent.service',
      );
      expect(await out(vm, ['hostname'])).toBe('vmsys');
      await out(vm, [
        'sh',
        '-c',
        'useradd -m -s /bin/sh app && echo "app ALL=(ALL) NOPASSWD:ALL" > /etc/sudoers.d/app && chmod 440 /etc/sudoers.d/app',
      ]);
      expect(await out(vm, ['sudo', '-n', 'id', '-u'], 'app')).toBe('0');
      await out(vm, ['systemd-run', '--unit=sleeper', '--', 'sleep', '1000']);
      const boot = await out(vm, ['cat', '/proc/sys/kernel/random/boot_id']);
      await vm.snapshot('vmsys-mem', { memory: true });
      const copy = await lab.restore('vmsys-mem', { name: 'vmsys-copy' });
      try {
        expect(copy.lastTrace?.phases.map((p) => p.name)).toContain('load memory');
        expect(await out(copy, ['cat', '/proc/sys/kernel/random/boot_id'])).toBe(boot); // continued, not booted
        expect(copy.info.init).toBe('systemd');
        expect(await out(copy, ['systemctl', 'is-active', 'sleeper'])).toBe('active');
        expect(await out(copy, ['systemctl', 'is-system-running'])).toBe('running');
        // a name of its own, in /etc too: systemd's and sudo's
        expect(
          await out(copy, ['sh', '-c', 'hostname; cat /etc/hostname; getent hosts vmsys-copy | cut -f1 -d" "']),
        ).toBe('vmsys-copy\nvmsys-copy\n127.0.1.1');
        const sudo = await copy.exec(['sudo', '-n', 'id', '-u'], { user: 'app' });
        expect([sudo.exitCode, sudo.stdout.toString(), sudo.stderr.toString()]).toEqual([0, '0\n', '']);
        await lab.removeSnapshot('vmsys-mem');

        await markHalt(copy);
        const t = await copy.stop();
        expect(t.phases.map((p) => p.name)).toEqual(expect.arrayContaining(['guest halt', 'halt']));
        const stopped = await lab.get('vmsys-copy');
        expect([stopped.state, stopped.info.reason]).toEqual(['dead', expect.stringMatching(/^stopped/)]);
        await stopped.snapshot('vmstop-disk');
        await using again = await lab.restore('vmstop-disk', { name: 'vmstop2' });
        expect(again.lastTrace?.phases.map((p) => p.name)).not.toContain('load memory'); // a boot, not a resume
        expect(await out(again, ['cat', '/proc/sys/kernel/random/boot_id'])).not.toBe(boot);
        expect(await out(again, ['cat', '/root/halt-mark'])).toBe('halted-cleanly');
        expect(await out(again, ['systemctl', 'is-system-running'])).toBe('running');
        await again.destroy();
        await lab.removeSnapshot('vmstop-disk');
      } finally {
        await copy.destroy();
      }
    } finally {
      await vm.destroy();
    }
  }, 400_000);

  it('refuse --init systemd on an image without systemd before anything boots', async () => {
    for (const driver of ['qemu', 'namespaces']) {
      const t0 = performance.now();
      const err = await lab
        .create({ driver, image: 'busybox', init: 'systemd', name: 'nosd' })
        .catch((e: unknown) => e);
      expect(err).toMatchObject({
        code: 'BAD_INPUT',
        message: expect.stringMatching(/image busybox has no systemd/),
        hint: expect.stringMatching(/--init agent/),
      });
      expect(performance.now() - t0).toBeLessThan(5000); // no VM booted to find out
      expect((await lab.list()).map((b) => b.name)).not.toContain('nosd');
    }
  });

  it("run in scenarios beside namespace machines: each reaches the other's service; a reset resumes the VM from memory, its services and network intact", async () => {
    // a socket-activated service of the VM's own systemd, and a busybox httpd on a namespace machine
    writeFileSync(
      join(lab.home, 'hello.socket'),
      '[Socket]\nListenStream=8080\nAccept=yes\n[Install]\nWantedBy=sockets.target\n',
    );
    writeFileSync(
      join(lab.home, 'hello@.service'),
      '[Service]\nExecStart=/bin/echo hello from the vm\nStandardOutput=socket\n',
    );
    const file = join(lab.home, 'vm-scenario.yaml');
    writeFileSync(
      file,
      [
        'networks:',
        '  lan: 10.77.29.0/24',
        'machines:',
        '  vm:',
        '    image: sysd',
        '    init: systemd',
        '    driver: qemu',
        '    networks: { lan: {} }',
        '    provision:',
        '      - copy: { from: ./hello.socket, to: /etc/systemd/system/ }',
        "      - copy: { from: './hello@.service', to: /etc/systemd/system/ }",
        '      - run: systemctl enable --now hello.socket',
        '    start:',
        '      - run: sh -c "echo started >> /root/starts"',
        '    ready:',
        '      - unit: hello.socket',
        '      - tcp: 8080',
        // the VM reaches the namespace machine's httpd with its own bash
        '      - command: [bash, -c, \'exec 3<>/dev/tcp/box/8080 && printf "GET / HTTP/1.0\\r\\n\\r\\n" >&3 && grep -q "hello from box" <&3\']',
        '        timeout: 20s',
        '  box:',
        '    networks: { lan: {} }',
        '    start:',
        "      - run: sh -c 'mkdir -p /srv && echo hello from box > /srv/index.html && httpd -p 8080 -h /srv'",
        '    ready:',
        '      - tcp: 8080',
        '      - command: sh -c "nc vm 8080 | grep -q \'hello from the vm\'"',
        '        timeout: 60s',
      ].join('\n'),
    );
    const scn = await lab.up(file, { name: 'vmscn' });
    let memoryDir = '';
    try {
      const vm = await lab.get('vmscn/vm');
      expect(vm.info).toMatchObject({ driver: 'qemu', init: 'systemd', state: 'running' });
      const boot = await out(vm, ['cat', '/proc/sys/kernel/random/boot_id']);
      // its NIC has the address's MAC and the address, given by snaplab's /init (minbase has no ip)
      expect(await out(vm, ['sh', '-c', 'cat /sys/class/net/eth0/address; hostname -I'])).toBe(
        '02:77:0a:4d:1d:0a\n10.77.29.10',
      );
      vm.close();
      // blocks are routes in a machine's namespace, which a VM's traffic is bridged through: refused
      await expect(scn.block('vm', 'box')).rejects.toMatchObject({
        code: 'BAD_INPUT',
        message: expect.stringMatching(/vm is a VM/),
      });
      await scn.snapshot('base');
      // a VM machine's memory snapshot continues only in its scenario, and goes with it
      memoryDir = (await lab.snapshots()).find((x) => x.name === 'vmscn@base.vm')!.record.memory!.dir;
      expect(existsSync(join(memoryDir, 'ram')) || existsSync(join(memoryDir, 'memory'))).toBe(true);
      await expect(lab.restore('vmscn@base.vm', { name: 'stray' })).rejects.toMatchObject({
        code: 'BAD_INPUT',
        message: expect.stringMatching(/scenario machine/),
      });
      expect((await lab.list()).map((b) => b.name)).not.toContain('stray');
      await expect(lab.removeSnapshot('vmscn@base.vm')).rejects.toMatchObject({
        code: 'BAD_INPUT',
        message: expect.stringMatching(/part of scenario vmscn's snapshot base/),
      });
      await using changed = await lab.get('vmscn/vm');
      await out(changed, ['systemctl', 'stop', 'hello.socket']);
      changed.close();
      const r = await scn.reset('base');
      expect(r.trace.phases.map((p) => p.name)).not.toContain('start vm'); // it continued, running
      await using again = await lab.get('vmscn/vm');
      expect(await out(again, ['cat', '/proc/sys/kernel/random/boot_id'])).toBe(boot); // not booted
      expect(await out(again, ['systemctl', 'is-active', 'hello.socket'])).toBe('active');
      expect(await out(again, ['cat', '/root/starts'])).toBe('started');
      await using box = await lab.get('vmscn/box');
      expect(await out(box, ['sh', '-c', 'nc vm 8080'])).toBe('hello from the vm');
      expect(
        await out(again, [
          'bash',
          '-c',
          'exec 3<>/dev/tcp/box/8080 && printf "GET / HTTP/1.0\\r\\n\\r\\n" >&3 && tail -n 1 <&3',
        ]),
      ).toBe('hello from box');
    } finally {
      await scn.down();
    }
    expect(existsSync(memoryDir)).toBe(false); // down took the VM's memory snapshot too
  }, 300_000);
});

describe("the bench's systemd-nspawn baseline (raise --init systemd)", () => {
  const nspawn = spawnSync('sh', ['-c', 'command -v systemd-nspawn'], { encoding: 'utf8' }).stdout.trim();
  it.skipIf(!nspawn)(
    "boots the image's tree to running, writes nothing into it, and leaves no cgroup (measured where systemd-container is installed)",
    async () => {
      const tree = (await lab.image('sysd')).path;
      const stamp = join(lab.home, 'nspawn-stamp');
      writeFileSync(stamp, '');
      await new Promise((r) => setTimeout(r, 20)); // mtimes after the stamp's are its boot's
      const arm = await nspawnArm(tree, { durationMs: 1, count: 1 });
      if (typeof arm === 'string') throw new Error(arm);
      const r = await arm.run(1);
      expect(r.errors).toEqual([]);
      expect(r.latenciesMs).toHaveLength(1);
      expect(r.latenciesMs[0]).toBeGreaterThan(0);
      // --volatile=overlay: what its systemd wrote (machine-id, journal, random seed) went to a tmpfs
      const since = statSync(stamp).mtimeMs;
      // (a walk that never follows a link: the tree's /var/run is one, to /run, the host's here)
      const newer: string[] = [];
      const walk = (dir: string): void => {
        for (const e of readdirSync(dir, { withFileTypes: true })) {
          const p = join(dir, e.name);
          if (lstatSync(p).mtimeMs > since) newer.push(p);
          if (e.isDirectory()) walk(p);
        }
      };
      walk(tree);
      expect(newer).toEqual([]);
      for (const parent of nspawnCgroupDirs(''))
        expect(readdirSync(parent).filter((d) => d.startsWith(NSPAWN_CGROUP_PREFIX))).toEqual([]);
    },
    180_000,
  );

  it("gc removes the cgroups of a bench that was killed mid-run, and leaves a running bench's", async () => {
    const me = (await processStartTime(process.pid))!;
    const dead = [
      ...nspawnCgroupDirs(nspawnRunName(999999999, me, 0)), // above any pid_max: never a live process
      ...nspawnCgroupDirs(nspawnRunName(process.pid, me + 1, 0)), // this pid, but another process's (a reuse)
    ];
    // a running bench's, and a name not of the form (not snaplab's to judge)
    const live = [
      ...nspawnCgroupDirs(nspawnRunName(process.pid, me, 0)),
      ...nspawnCgroupDirs(`${NSPAWN_CGROUP_PREFIX}other`),
    ];
    for (const d of [...dead, ...live]) mkdirSync(join(d, 'payload'), { recursive: true });
    try {
      const { removed } = await lab.gc();
      for (const d of dead) {
        expect(existsSync(d), d).toBe(false);
        expect(removed).toContain(`cgroup ${d}`);
      }
      for (const d of live) expect(existsSync(d), d).toBe(true);
    } finally {
      for (const d of [...dead, ...live]) for (const x of [join(d, 'payload'), d]) if (existsSync(x)) rmdirSync(x); // empty cgroup dirs: rmdir, bottom-up
    }
  });
});
