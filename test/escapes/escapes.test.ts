/**
 * The escape suite: each test reproduces a published container escape, or a technique of one,
 * from inside a machine (the namespaces driver, in its user namespace) and checks that the
 * defence answers as it must. A small static probe (probe.c, built here) makes each attempt the
 * way an attacker would and prints the kernel's answer; the test decides. Which defence answers is
 * said beside each: where two stand (seccomp and a missing capability), the test names the one a
 * scratch run showed it to depend on.
 */
import { createHash } from 'node:crypto';
import { spawnSync } from 'node:child_process';
import { existsSync, lstatSync, mkdtempSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { agentBinaryPath } from '../../src/agent/binary.js';
import type { Lab } from '../../src/sdk/lab.js';
import type { Sandbox } from '../../src/sdk/sandbox.js';
import { disposeLab, testLab } from '../helpers.js';

let lab: Lab;
let box: Sandbox;
let other: Sandbox;
let scratch: string;

beforeAll(async () => {
  scratch = mkdtempSync(join(tmpdir(), 'snaplab-test-escapes-'));
  const built = spawnSync(
    'gcc',
    ['-O2', '-static', '-o', join(scratch, 'probe'), join(import.meta.dirname, 'probe.c')],
    { encoding: 'utf8' },
  );
  if (built.status !== 0) throw new Error(`cannot build the probe: ${built.stderr}`);
  lab = await testLab();
  box = await lab.create({ name: 'attacker' });
  other = await lab.create({ name: 'victim' });
  await box.putFile('/probe', readFileSync(join(scratch, 'probe')), 0o755);
}, 120_000);

afterAll(async () => {
  await disposeLab(lab);
  rmSync(scratch, { recursive: true, force: true });
});

/** What the kernel answered to one attempt inside the attacker: ok, or an errno's name. */
const probe = async (...args: string[]): Promise<string> => {
  const r = await box.exec(['/probe', ...args]);
  expect(r.exitCode, r.stderr).toBe(0);
  return r.stdout.trim();
};
const sh = async (script: string): Promise<{ code: number; out: string; err: string }> => {
  const r = await box.exec(['sh', '-c', script]);
  return { code: r.exitCode, out: r.stdout.trim(), err: r.stderr.trim() };
};
const sha = (path: string): string => createHash('sha256').update(readFileSync(path)).digest('hex');

describe('escapes', () => {
  it('CVE-2019-5736 (runc: the host binary overwritten through /proc/self/exe): the agent binary cannot be opened for writing, and stays as it was', async () => {
    const before = sha(agentBinaryPath());
    // PID 1 is the agent: the bind of the host's binary is read-only, and it is running
    expect(['EROFS', 'ETXTBSY', 'EACCES', 'EPERM']).toContain(await probe('write', '/proc/1/exe'));
    // the host's file, owned by an id the machine does not map (nobody inside), mode 0755
    expect(['EROFS', 'ETXTBSY', 'EACCES']).toContain(await probe('write', '/run/snaplab/agent'));
    expect((await sh('cat /dev/zero > /run/snaplab/agent')).code).not.toBe(0);
    // a command's own /proc/self/exe is its binary in the machine's tree, never a host file
    expect((await sh('readlink /proc/self/exe')).out).toBe('/bin/busybox');
    expect(sha(agentBinaryPath())).toBe(before);
  });

  it('CVE-2024-21626 (runc: a host descriptor or working directory leaked into the container): a command holds fds 0-2 only, its cwd inside', async () => {
    const lines = (await probe('fds')).split('\n');
    const fds = lines.filter((l) => !l.startsWith('cwd ')).map((l) => l.split(' ')[0]);
    expect(fds.sort()).toEqual(['0', '1', '2']);
    expect(lines.find((l) => l.startsWith('cwd '))).toMatch(/^cwd \/(root)?$/);
    // and the agent's own descriptors are out of reach (PID 1's cannot be followed)
    expect((await sh('readlink /proc/1/fd/0')).code).not.toBe(0);
    expect((await sh('cat /proc/1/fd/0 < /dev/null')).code).not.toBe(0);
  });

  it('ptrace of processes outside: the host is invisible (ESRCH), so is another machine; the agent cannot be attached (EPERM)', async () => {
    expect(await probe('ptrace', String(process.pid))).toBe('ESRCH');
    expect(await probe('ptrace', String(other.info.pid))).toBe('ESRCH');
    expect(await probe('ptrace', '1')).toBe('EPERM');
  });

  it('writes to the kernel: /proc/sys (core_pattern), /proc/sysrq-trigger and /sys are refused', async () => {
    expect(['EROFS', 'EACCES', 'EPERM']).toContain(await probe('write', '/proc/sys/kernel/core_pattern'));
    expect(['EROFS', 'EACCES', 'EPERM', 'ENOENT']).toContain(await probe('write', '/proc/sysrq-trigger'));
    expect(await probe('write', '/sys/kernel/mm/transparent_hugepage/enabled')).toBe('ENOENT'); // a sandbox has no /sys at all
    expect((await sh('test -e /sys || echo absent')).out).toBe('absent');
    expect(readFileSync('/proc/sys/kernel/core_pattern', 'utf8')).not.toMatch(/probe|escape/);
  });

  it('procfs or cgroupfs mounted elsewhere (the release_agent escape, CVE-2022-0492), and the new mount API: refused', async () => {
    expect(await probe('mount-proc')).toBe('EPERM');
    expect(await probe('mount-cgroup')).toBe('EPERM');
    expect(await probe('fsopen')).toBe('EPERM');
    expect(await probe('unshare-user')).toBe('EPERM'); // no user namespace of its own to gain mount rights in
    expect(await probe('setns')).toBe('EPERM');
  });

  it('device nodes: mknod of /dev/mem is refused', async () => {
    expect(await probe('mknod')).toBe('EPERM');
  });

  it('"shocker" (open_by_handle_at to a host inode): refused', async () => {
    expect(await probe('open_by_handle')).toBe('EPERM');
  });

  it('CVE-2019-10063 (flatpak: an argument filter passed by setting the high 32 bits): vsock and a nested btrfs subvolume stay refused', async () => {
    // a subvolume nested in the machine's root would escape its disk cap (a qgroup of its own) and
    // make the root impossible to delete with one ioctl; vsock reaches a hypervisor's host
    expect(await probe('subvol')).toBe('EPERM');
    expect(await probe('subvol-high')).toBe('EPERM');
    expect(await probe('vsock')).toBe('EAFNOSUPPORT');
    expect(await probe('vsock-high')).toBe('EAFNOSUPPORT');
    expect((await sh('ls -A /root | grep -c nested || true')).out).toBe('0');
    // clone(2) may not ask for a namespace either (unshare's denial would be worth nothing)
    expect(await probe('clone-newns')).toBe('EPERM');
  });

  it('kernel surfaces a sandbox has no use for: keyrings, bpf, perf, userfaultfd, io_uring', async () => {
    // the keyring is the kernel's, shared by every container; io_uring bypasses seccomp filters.
    // keyctl, add_key and io_uring are refused by seccomp alone (a scratch build without those
    // denials answered ok); bpf, perf and userfaultfd also by this host's sysctls
    expect(await probe('keyctl')).toBe('EPERM');
    expect(await probe('add_key')).toBe('EPERM');
    expect(await probe('io_uring')).toBe('EPERM');
    expect(await probe('bpf')).toBe('EPERM');
    expect(await probe('perf')).toBe('EPERM');
    expect(await probe('userfaultfd')).toBe('EPERM');
  });

  it("the kernel itself: modules (insmod rootkits), kexec, the clock, another process's memory (process_vm_*): refused", async () => {
    // a module or a new kernel is the host; the clock is the host's (CAP_SYS_TIME is not given,
    // and seccomp refuses the calls as Docker's profile does); process_vm_readv/writev are ptrace
    // without the attach, refused even on the machine's own processes
    for (const t of [
      'init_module',
      'finit_module',
      'delete_module',
      'kexec_load',
      'kexec_file_load',
      'settime',
      'settimeofday',
      'adjtimex',
    ])
      expect(await probe(t), t).toBe('EPERM');
    for (const t of ['process_vm_readv', 'process_vm_writev']) {
      expect(await probe(t, 'self'), t).toBe('EPERM'); // even of its own memory: the filter's answer
      expect(await probe(t, '1'), t).toBe('EPERM');
    }
    // positive controls, the same probe on the host (root, no filter): reading and writing its own
    // memory works; the kernel here has no modules or kexec at all, so the EPERM above is the
    // filter's, not the kernel's (ENOSYS). (The clock is not set on the host, even to itself.)
    const host = (...args: string[]): string =>
      spawnSync(join(scratch, 'probe'), args, { encoding: 'utf8' }).stdout.trim();
    expect(host('process_vm_readv', 'self')).toBe('ok');
    expect(host('process_vm_writev', 'self')).toBe('ok');
    for (const t of ['init_module', 'kexec_load'])
      expect(['ENOSYS', 'EPERM', 'EINVAL', 'ENOEXEC', 'EFAULT', 'EBADMSG'], t).toContain(host(t));
  });

  it('filters that cannot read their arguments: clone3 answers ENOSYS (its flags are in memory; libc falls back to clone, whose flags the filter reads), and a 32-bit system call kills the process', async () => {
    expect(await probe('clone3')).toBe('ENOSYS');
    // int 0x80 takes the i386 table, where the numbers mean other calls (the filter was written for
    // x86-64's): the process is killed (SIGSYS) rather than answered
    const r = await box.exec(['/probe', 'i386']);
    // on the host (no filter) both go through: the probe makes the calls it claims to; except
    // where the kernel has no 32-bit entry at all (ia32 emulation off, as in confidential-computing
    // guests since Linux 6.7): int 0x80 faults (SIGSEGV) there, on the host and inside alike
    const host = (t: string): string => spawnSync(join(scratch, 'probe'), [t], { encoding: 'utf8' }).stdout.trim();
    const hostI386 = spawnSync(join(scratch, 'probe'), ['i386'], { encoding: 'utf8' });
    expect(host('clone3')).toBe('ok');
    if (hostI386.signal === 'SIGSEGV') expect([r.signal, r.stdout]).toEqual([11, '']);
    else {
      expect(hostI386.stdout.trim()).toBe('ok');
      expect([r.signal, r.stdout]).toEqual([31, '']);
    }
    // an x32 call enters through x86-64's own entry whatever the kernel does with int 0x80, so the
    // filter's rule for other ABIs is shown on every host: killed inside, answered on the host
    const x32 = await box.exec(['/probe', 'x32']);
    expect([x32.signal, x32.stdout]).toEqual([31, '']);
    expect(['ENOSYS', 'ok']).toContain(host('x32'));
    expect((await box.exec(['echo', 'alive'])).stdout.trim()).toBe('alive');
  });

  it("the host's sockets: an abstract socket on the host is unreachable (a network namespace of its own), and the host's /run is not there", async () => {
    const name = `snaplab-escape-${process.pid}`;
    // (the probe closes at once: a write to it may meet EPIPE, which is no failure here)
    const server: Server = createServer((c) => c.on('error', () => undefined).end('reached\n'));
    await new Promise<void>((r) => server.listen(`\0${name}`, r));
    try {
      // the same probe on the host reaches it: the name and its encoding are right
      expect(spawnSync(join(scratch, 'probe'), ['abstract', name], { encoding: 'utf8' }).stdout.trim()).toBe('ok');
      expect(await probe('abstract', name)).toBe('ECONNREFUSED');
    } finally {
      server.close();
    }
    expect((await sh('ls -A /run')).out).toBe('snaplab');
    expect((await sh('test -e /run/systemd/private || test -e /var/run/docker.sock || echo none')).out).toBe('none');
  });

  it("the agent's socket cannot be driven from inside to act on another machine: no socket in the tree, the other's agent not visible", async () => {
    expect((await sh('find / -xdev -type s 2>/dev/null | wc -l')).out).toBe('0');
    expect((await sh(`test -e /proc/${other.info.pid} && echo seen || echo unseen`)).out).toBe('unseen');
    expect((await other.exec(['echo', 'victim fine'])).stdout).toBe('victim fine\n');
  });

  it('symlinks on paths the host touches: a file written or read through a link to a host path stays inside the machine', async () => {
    const hostFile = join(scratch, 'secret');
    writeFileSync(hostFile, 'host secret\n');
    const planted = join(scratch, 'planted');
    await sh(`ln -s ${hostFile} /root/read-me && ln -s ${planted} /root/write-me`);
    // the machine's own resolution: the link points into the machine's tree, where there is no such file
    await expect(box.getFile('/root/read-me')).rejects.toMatchObject({
      message: expect.stringMatching(/No such file/),
    });
    // a write replaces the link itself (a new file renamed over it), never what it points to
    await box.putFile('/root/write-me', 'from the host library\n');
    expect(existsSync(planted)).toBe(false);
    expect((await sh(`test -e ${planted} || echo none; test -L /root/write-me || cat /root/write-me`)).out).toBe(
      'none\nfrom the host library',
    );
    // a copy out of the machine does not follow a link out of it
    const out = join(scratch, 'copied');
    await box.copyOut('/root/read-me', out);
    expect(readFileSync(hostFile, 'utf8')).toBe('host secret\n');
    expect(readlinkSync(out)).toBe(hostFile); // copied as the link it is, not the host file's bytes
  });

  it('symlinks on snapshot paths: a snapshot and a restore keep links to host paths as links, on every storage, and copy nothing of the host', async () => {
    // btrfs snapshots a subvolume (no path walked); overlay and dir copy trees (cp -a, which never
    // follows a link): a link planted inside must arrive as the link it is, not as the host file
    const hostSecret = join(scratch, 'snap-secret');
    writeFileSync(hostSecret, 'host secret\n');
    for (const storage of ['btrfs', 'overlay', 'dir'] as const) {
      const m = await lab.create({ name: `snap-links-${storage}`, storage });
      await m.exec([
        'sh',
        '-c',
        `ln -s ${hostSecret} /root/abs && ln -s ../../../../../../..${hostSecret} /root/rel && ln -s / /root/top && echo own > /root/own`,
      ]);
      await m.snapshot(`links-${storage}`);
      const vol = lab.context.store.getSnapshot(`links-${storage}`)!.volume.id;
      const copy = await lab.restore(`links-${storage}`, { name: `snap-copy-${storage}` });
      const seen = (
        await copy.exec([
          'sh',
          '-c',
          `for l in abs rel top; do readlink /root/$l; done; cat /root/own; cat /root/abs 2>&1 || true`,
        ])
      ).stdout.toString();
      expect(seen, storage).toBe(
        `${hostSecret}\n../../../../../../..${hostSecret}\n/\nown\ncat: can't open '/root/abs': No such file or directory\n`,
      );
      // in the snapshot's own files on the host, too, they are links (overlay and dir keep a tree)
      const tree =
        storage === 'btrfs'
          ? null
          : storage === 'overlay'
            ? join(lab.home, 'storage', 'overlay', vol, 'layer')
            : join(lab.home, 'storage', 'dir', vol, 'tree');
      if (tree)
        for (const l of ['abs', 'rel', 'top'])
          expect(lstatSync(join(tree, 'root', l)).isSymbolicLink(), `${storage} ${l}`).toBe(true);
      expect(readFileSync(hostSecret, 'utf8')).toBe('host secret\n');
      await copy.destroy();
      await m.destroy();
      await lab.removeSnapshot(`links-${storage}`);
    }
  });

  it('a pool standby left dirty in each way the recycling check claims to catch is refused, and the next execution sees none of it', async () => {
    // docs/pools.md's table, one execution per row (test/pool.test.ts has the file and process rows)
    const probeBytes = readFileSync(join(scratch, 'probe'));
    const pool = await lab.createPool({
      name: 'dirt',
      image: 'busybox',
      size: 1,
      limits: { memoryBytes: 48 * 2 ** 20, pids: 24 },
      recycle: true,
    });
    try {
      const put = [{ from: probeBytes, to: '/run/probe', mode: 0o755 }]; // under /run: removed after the run, so no dirt of its own
      const clean = await pool.run(['/run/probe', 'fds'], { put });
      expect([clean.recycled, clean.dirt]).toEqual([true, []]);
      const dirty: { argv: string[]; reason: RegExp; opts?: { timeoutMs: number } }[] = [
        { argv: ['/run/probe', 'shmget'], reason: /shm: 1 left/ },
        { argv: ['/run/probe', 'mq_open'], reason: /\/dev\/mqueue changed/ },
        { argv: ['dd', 'if=/dev/zero', 'of=/dev/null', 'bs=200M', 'count=1'], reason: /an OOM kill happened/ },
        {
          argv: ['sh', '-c', 'i=0; while [ $i -lt 40 ]; do sleep 1 & i=$((i+1)); done; wait'],
          reason: /a fork hit the pids limit/,
          opts: { timeoutMs: 5000 },
        },
        { argv: ['sh', '-c', 'mkdir /dev/shm/d && chmod 700 /dev/shm'], reason: /dev\/shm changed/ },
        { argv: ['sh', '-c', 'echo x > /run/snaplab/left'], reason: /run\/snaplab changed|run changed/ },
      ];
      for (const d of dirty) {
        const r = await pool.run(d.argv, { put, ...d.opts });
        expect(r.recycled, `${d.argv.join(' ')}: ${r.dirt.join('; ')}`).toBe(false);
        expect(r.dirt.join('; '), d.argv.join(' ')).toMatch(d.reason);
      }
      // the next executions see nothing of it: no segment, no queue, counters as new
      for (let i = 0; i < 2; i++) {
        const next = await pool.run(
          [
            'sh',
            '-c',
            'cat /proc/sysvipc/shm | wc -l; ls -A /dev/mqueue | wc -l; ls -A /dev/shm | wc -l; ls /run/snaplab',
          ],
          {},
        );
        expect(next.stdout.toString().trim().split('\n').slice(0, 3), next.stdout.toString()).toEqual(['1', '0', '0']);
        expect(next.stdout.toString()).not.toMatch(/left/);
      }
      expect((await pool.stats()).refusedDirty).toBe(dirty.length);
    } finally {
      await pool.remove();
    }
  }, 120_000);
});
