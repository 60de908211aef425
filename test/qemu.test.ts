import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  statfsSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { DISK_IN_VOLUME } from '../src/drivers/qemu/disk.js';
import { run } from '../src/host/run.js';
import { spawn } from 'node:child_process';
import { QmpClient } from '../src/drivers/qemu/qmp.js';
import { basename, dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import type { Lab } from '../src/sdk/lab.js';
import type { Sandbox } from '../src/sdk/sandbox.js';
import { ramPrefix } from '../src/drivers/qemu/ram.js';
import { snaplabCgroupsOnHost } from '../src/host/cgroups/host.js';
import { SNAPLAB } from './cli-command.js';
import { disposeLab, testLab } from './helpers.js';
import { handledElsewhere } from '../src/cleanup.js';

// Real VMs: QEMU with the Debian cloud kernel, under TCG here (KVM hangs on these hosts; the
// probe must find that out by itself). Boots take seconds: one VM, reused across the tests.
let lab: Lab;
let vm: Sandbox;
beforeAll(async () => {
  lab = await testLab();
  vm = await lab.create({ driver: 'qemu', name: 'vm1' });
}, 240_000);
afterAll(async () => {
  await disposeLab(lab);
}, 120_000);

const out = async (box: Sandbox, argv: string[]): Promise<string> => (await box.exec(argv)).stdout.toString().trim();
// booted VMs keep their RAM in /dev/shm where it has room for the guest (256 MiB by default)
const ramInShm =
  existsSync('/dev/shm') && statfsSync('/dev/shm').bavail * statfsSync('/dev/shm').bsize >= 256 * 2 ** 20;

/**
 * QEMU in its jail (src/drivers/qemu/jail.ts, as Firecracker's jailer): a mount namespace whose
 * mounts are an empty root, /usr, the loader's cache, a minimal /dev and this VM's own files under
 * the home; nothing else of the host to be seen; network namespace of its own.
 */
function expectJailed(box: Sandbox, others: Sandbox[] = []): void {
  const pid = box.info.pid!;
  for (const ns of ['mnt', 'net', 'ipc', 'uts'])
    expect(readlinkSync(`/proc/${pid}/ns/${ns}`), ns).not.toBe(readlinkSync(`/proc/self/ns/${ns}`));
  const points = readFileSync(`/proc/${pid}/mountinfo`, 'utf8')
    .trim()
    .split('\n')
    .map((l) => l.split(' ')[4]!);
  for (const p of points)
    expect(
      ['/', '/usr', '/etc/ld.so.cache', '/dev'].includes(p) || p.startsWith('/dev/') || p.startsWith(`${lab.home}/`),
      p,
    ).toBe(true);
  const own = points.filter((p) => p.startsWith(`${lab.home}/`) || p.startsWith('/dev/shm/'));
  expect(own.length, own.join(' ')).toBeLessThanOrEqual(6); // kernel, initramfs, base disk, disk, RAM file, run directory
  const root = `/proc/${pid}/root`;
  expect(existsSync(`${root}${join(lab.home, 'run', box.id, 'qmp.sock')}`)).toBe(true);
  for (const p of [
    join(lab.home, 'state.db'),
    join(lab.home, 'images'),
    '/etc/passwd',
    '/etc/shadow',
    '/root',
    '/home',
    '/proc/1',
    '/sys/kernel',
    '/dev/kvm0',
    '/dev/sda',
    '/dev/vda',
    '/run',
    '/var/log',
    ...others.map((o) => join(lab.home, 'run', o.id)),
  ])
    expect(existsSync(`${root}${p}`), p).toBe(false);
  expect(readdirSync(`${root}${dirname(lab.home)}`)).toEqual([basename(lab.home)]); // the home's neighbours unseen
}

describe('the qemu driver', () => {
  it('boots to a usable agent, runs commands with their exit codes, in its own kernel', async () => {
    expect(vm.driver).toBe('qemu');
    expect(await out(vm, ['echo', 'hi'])).toBe('hi');
    expect((await vm.exec(['sh', '-c', 'exit 3'])).exitCode).toBe(3);
    expect((await vm.exec(['nosuch'])).exitCode).toBe(127);
    expect(await out(vm, ['uname', '-r'])).toMatch(/cloud-amd64$/);
    expect(await out(vm, ['hostname'])).toBe('vm1');
    // QEMU itself runs under its seccomp filter (-sandbox on), as an unprivileged uid of its own
    const status = readFileSync(`/proc/${vm.info.pid}/status`, 'utf8');
    expect(status).toMatch(/^Seccomp:\s+2$/m);
    const uid = Number(/^Uid:\s+(\d+)/m.exec(status)![1]);
    expect(uid).toBeGreaterThanOrEqual(2_000_000_000);
    expect(status).toMatch(new RegExp(`^Uid:\\s+${uid}\\s+${uid}\\s+${uid}\\s+${uid}$`, 'm'));
    expect(status).toMatch(/^CapEff:\s+0+$/m);
    expect(status).toMatch(/^NoNewPrivs:\s+1$/m);
    expectJailed(vm);
    const accel = JSON.parse(readFileSync(join(lab.home, 'qemu', 'accel.json'), 'utf8')) as {
      accel: string;
      reason: string;
    };
    expect(['kvm', 'tcg']).toContain(accel.accel);
    if (existsSync('/dev/kvm') && accel.accel === 'tcg') expect(accel.reason).toMatch(/did not reach the agent/);
  });

  it("what a guest's root can reach of the host is its devices: no network interface but lo, no vsock, no shared filesystem; one virtio disk (its own) and one virtio console (its agent's)", async () => {
    // root in a VM owns its kernel (it may write its own core_pattern); the host is behind QEMU's
    // device model, so the guest-side escape surface is the devices QEMU gives it: few, on purpose
    expect(await out(vm, ['ls', '/sys/class/net'])).toBe('lo');
    // virtio device ids: 2 block, 3 console; no 1 (net), 9 (9p), 0x13 (vsock), 0x1a (virtiofs)
    expect((await out(vm, ['sh', '-c', 'cat /sys/bus/virtio/devices/*/device'])).split('\n').sort()).toEqual([
      '0x0002',
      '0x0003',
    ]);
    // PCI, every function: the i440FX host bridge, PIIX3's ISA bridge, IDE and ACPI, and the two
    // virtio functions; nothing else (an e1000 would be 8086:100e, and no driver of the guest's
    // would show it as an interface)
    const pci = (
      await out(vm, ['sh', '-c', 'for d in /sys/bus/pci/devices/*; do echo $(cat $d/vendor):$(cat $d/device); done'])
    ).split('\n');
    expect(pci.sort()).toEqual([
      '0x1af4:0x1001',
      '0x1af4:0x1003',
      '0x8086:0x1237',
      '0x8086:0x7000',
      '0x8086:0x7010',
      '0x8086:0x7113',
    ]);
    expect(await out(vm, ['sh', '-c', "awk 'NR > 2 && $4 { print $4 }' /proc/partitions"])).toBe('vda');
    expect(await out(vm, ['sh', '-c', "awk '$1 ~ /^\\// { print $1, $2 }' /proc/mounts"])).toBe('/dev/vda /');
  });

  it("serves several host processes at once (the relay multiplexes the VM's one connection)", async () => {
    // this process's command waits for a file that another process's command makes: were the
    // connections taken in turn, the other could not run until this one timed out
    const waiting = vm.exec(['sh', '-c', 'rm -f /run/go; while [ ! -e /run/go ]; do sleep 0.05; done; echo released'], {
      timeoutMs: 30_000,
    });
    await new Promise((r) => setTimeout(r, 300));
    const other = await run(SNAPLAB, ['exec', 'vm1', '--', 'sh', '-c', 'touch /run/go; echo other'], {
      env: { ...process.env, SNAPLAB_HOME: lab.home },
    });
    expect(other.stdout.trim()).toBe('other');
    const r = await waiting;
    expect([r.exitCode, r.stdout.toString().trim()]).toEqual([0, 'released']);
    // a client that goes away mid-command has that command killed in the guest, not the others'
    const child = spawn(SNAPLAB, ['exec', 'vm1', '--', 'sh', '-c', 'echo $$ > /run/orphan; sleep 60'], {
      env: { ...process.env, SNAPLAB_HOME: lab.home },
      stdio: 'ignore',
    });
    for (let i = 0; i < 200 && (await vm.exec(['test', '-s', '/run/orphan'])).exitCode !== 0; i++)
      await new Promise((res) => setTimeout(res, 50));
    const orphan = await out(vm, ['cat', '/run/orphan']);
    child.kill('SIGKILL');
    let gone = false;
    for (let i = 0; i < 100 && !gone; i++) {
      gone = (await vm.exec(['test', '-d', `/proc/${orphan}`])).exitCode !== 0;
      if (!gone) await new Promise((res) => setTimeout(res, 50));
    }
    expect(gone).toBe(true);
    expect(await out(vm, ['echo', 'still here'])).toBe('still here');
    // a relay that dies (killed, out of memory) is started again by the next connection
    const relays = (await run('pgrep', ['-f', `relay --connect ${join(lab.home, 'run', vm.id)}/`])).stdout
      .trim()
      .split('\n');
    expect(relays).toHaveLength(1);
    process.kill(Number(relays[0]), 'SIGKILL');
    const again = await lab.get('vm1');
    expect(await out(again, ['echo', 'back'])).toBe('back');
    again.close();
    vm.close(); // its connection went with the old relay
  }, 60_000);

  it('terminals, cp and ports work through the relay as on namespaces', async () => {
    // a terminal: the guest's own devpts, its size, SIGWINCH on resize, ^C
    let text = '';
    const p = await vm.spawn(
      ['sh', '-c', 'tty; stty size; trap "stty size" WINCH; echo ready; while :; do sleep 0.1; done'],
      { tty: { cols: 91, rows: 31 }, stdin: true, onStdout: (b) => (text += b.toString()) },
    );
    await vi.waitFor(() => expect(text).toContain('ready'), { timeout: 20_000 });
    expect(text).toMatch(/^\/dev\/pts\/\d+\r\n31 91\r\n/);
    p.resize(120, 40);
    await vi.waitFor(() => expect(text).toContain('40 120'), { timeout: 20_000 });
    p.write('\x03');
    expect((await p.result).exitCode).toBe(130);
    // a command kept past its client: the relay lets it go (DETACH, 1.6) and routes an ATTACH to it
    expect((await vm.agentConnection()).protocolVersion).toBe('1.8');
    // the relay passes an EXEC's flags on: its end waits for a background child's output (1.8)
    const late = await vm.spawn(['sh', '-c', '(sleep 0.5; echo late) & echo early'], { waitOutput: true });
    expect((await late.result).stdout).toBe('early\nlate\n');
    const holder = await lab.get('vm1');
    const ticks = 'i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.2; done';
    let first = '';
    const kept = await holder.spawn(['sh', '-c', ticks], {
      keep: true,
      tag: 'vm-kept',
      onStdout: (b) => (first += b.toString()),
    });
    const keptPid = await kept.pid;
    await vi.waitFor(() => expect(first).toContain('tick 1\n'), { timeout: 20_000 });
    const letGo = kept.result.then(
      () => null,
      (e: unknown) => e,
    );
    holder.close();
    // its holder's handle ends with its connection; the command does not
    expect(await letGo).toMatchObject({ code: 'AGENT_UNREACHABLE' });
    await vi.waitFor(
      async () => expect((await vm.kept()).map((k) => [k.pid, k.tag, k.held])).toEqual([[keptPid, 'vm-kept', false]]),
      { timeout: 20_000, interval: 200 },
    );
    let ticked = '';
    const back = await vm.attach(keptPid, { onStdout: (b) => (ticked += b.toString()) });
    expect(back.since).toBeGreaterThanOrEqual('tick 1\n'.length); // what it wrote before, counted
    await vi.waitFor(() => expect(ticked).toMatch(/tick \d+\n/), { timeout: 20_000 });
    back.kill(9);
    expect((await back.result).signal).toBe(9);
    expect(await vm.kept()).toEqual([]);
    // cp both ways, a tree with a link and a mode
    const dir = mkdtempSync(join(lab.home, 'cp-'));
    mkdirSync(join(dir, 'tree'));
    writeFileSync(join(dir, 'tree', 'f'), 'vm copy');
    chmodSync(join(dir, 'tree', 'f'), 0o751);
    symlinkSync('f', join(dir, 'tree', 'l'));
    await vm.copyIn(join(dir, 'tree'), '/root/');
    expect(await out(vm, ['sh', '-c', 'stat -c "%a" /root/tree/f; readlink /root/tree/l; cat /root/tree/f'])).toBe(
      '751\nf\nvm copy',
    );
    await vm.copyOut('/root/tree', join(dir, 'back'));
    expect(readFileSync(join(dir, 'back', 'f'), 'utf8')).toBe('vm copy');
    // a port inside the VM on the host's loopback
    expect(
      (await vm.exec(['sh', '-c', 'mkdir -p /w && echo from the vm > /w/index.html && httpd -p 8080 -h /w'])).exitCode,
    ).toBe(0);
    const { forwardPort, closeForwards } = await import('../src/lab/io/ports.js');
    const f = await forwardPort(lab.context, vm.info as never, { local: 0, remote: 8080 }, () => {});
    try {
      const page = await run('curl', ['-s', '--max-time', '20', `http://127.0.0.1:${f.local}/`]);
      expect(page.stdout).toBe('from the vm\n');
    } finally {
      await closeForwards([f]);
    }
  });

  it("a client that does not read its output holds back only its own execs (HOLD_OUTPUT), not the VM's other clients", async () => {
    const { AgentClient } = await import('../src/agent/client.js');
    const slow = await AgentClient.connect(join(lab.home, 'run', vm.info.id, 'relay.sock'), {
      timeoutMs: 20_000,
      reset: true,
    });
    try {
      const hog = slow.exec(
        { argv: ['sh', '-c', 'head -c 400000000 /dev/zero'], env: ['PATH=/usr/bin:/bin:/usr/sbin:/sbin'] },
        { onStdout: () => {} },
      );
      hog.result.catch(handledElsewhere);
      slow.pauseOutput(true); // reads nothing from here on
      await new Promise((r) => setTimeout(r, 3000)); // the relay's queue for it passes 16 MiB
      // meanwhile another client's command, with 8 MiB of input (its STDIN_ACKs ride the same stream)
      const r = await vm.exec(['wc', '-c'], { stdin: Buffer.alloc(8 << 20, 1) });
      expect(r.stdout.toString().trim()).toBe(String(8 << 20));
      expect((await vm.exec(['echo', 'still here'])).stdout.toString()).toBe('still here\n');
      hog.kill(9);
      slow.pauseOutput(false);
      await hog.result.catch(handledElsewhere);
    } finally {
      await slow.close();
    }
  }, 120_000);

  it('a memory snapshot restores a running machine: processes, memory, files, clock, identity', async () => {
    await vm.exec([
      'sh',
      '-c',
      // (written aside and renamed: a read between a truncate and its write saw an empty count, 0)
      '(i=0; while :; do i=$((i+1)); echo $i > /run/count.new; mv /run/count.new /run/count; sleep 0.2; done) >/dev/null 2>&1 &',
    ]);
    await vm.exec(['sh', '-c', 'echo before > /root/f']);
    // its random generator ready, as in any guest where something has waited on getrandom (sshd, systemd)
    await vm.exec(['sh', '-c', 'head -c 1 /dev/random >/dev/null'], { timeoutMs: 60_000 });
    await new Promise((r) => setTimeout(r, 600));
    const snap = await vm.snapshot('vm-snap', { memory: true });
    expect(snap.record.memory!.bytes).toBeGreaterThan(1_000_000);
    // a booted VM's RAM is a file of its own (where /dev/shm has room: on this host it has): the
    // snapshot copies it and streams the devices alone; else the stream holds the RAM
    const snapDir = snap.record.memory!.dir;
    if (ramInShm) {
      expect(statSync(join(snapDir, 'ram')).size).toBe(256 * 2 ** 20);
      expect(statSync(join(snapDir, 'memory')).size).toBeLessThan(4 * 2 ** 20);
    } else {
      expect(existsSync(join(snapDir, 'ram'))).toBe(false);
      expect(statSync(join(snapDir, 'memory')).size).toBeGreaterThan(8 * 2 ** 20);
    }
    const atSnapshot = Number(await out(vm, ['cat', '/run/count']));
    await vm.exec(['sh', '-c', 'echo after > /root/g']);
    await new Promise((r) => setTimeout(r, 2000)); // guest time moves on; the restore must correct the clock
    const a = await lab.restore('vm-snap', { name: 'vm-a' });
    const b = await lab.restore('vm-snap', { name: 'vm-b' });
    // each restore's own random numbers from its first draw: the generator was reseeded with the
    // host's entropy at its identity (restored with one key, both drew the same bytes before)
    const draw = (r: Sandbox): Promise<string> =>
      out(r, ['sh', '-c', 'head -c 16 /dev/urandom | od -An -tx1 | tr -d " \\n"']);
    const [ra, rb] = [await draw(a), await draw(b)];
    expect(ra).toMatch(/^[0-9a-f]{32}$/);
    expect(ra).not.toBe(rb);
    for (const r of [a, b]) {
      const n = Number(await out(r, ['cat', '/run/count']));
      expect(n).toBeGreaterThanOrEqual(atSnapshot - 1); // continues from the snapshot, not from a boot
      await new Promise((res) => setTimeout(res, 500));
      expect(Number(await out(r, ['cat', '/run/count']))).toBeGreaterThan(n); // and keeps counting
      expect(await out(r, ['cat', '/root/f'])).toBe('before');
      expect((await r.exec(['test', '-e', '/root/g'])).exitCode).toBe(1);
      const guest = Number(await out(r, ['date', '+%s']));
      expect(Math.abs(guest - Date.now() / 1000)).toBeLessThan(1.5);
    }
    // restores map the snapshot's RAM file copy-on-write (shared in the page cache until written)
    if (ramInShm)
      for (const r of [a, b]) expect(readFileSync(`/proc/${r.info.pid}/maps`, 'utf8')).toContain(join(snapDir, 'ram'));
    expect(await out(a, ['hostname'])).toBe('vm-a');
    expect(await out(b, ['hostname'])).toBe('vm-b');
    // each restore's QEMU in a jail of its own: the snapshot's RAM file its own, the others' files unseen
    expectJailed(a, [vm, b]);
    expectJailed(b, [vm, a]);
    expect(await out(a, ['cat', '/etc/machine-id'])).not.toBe(await out(b, ['cat', '/etc/machine-id']));
    const phases = a.lastTrace!.phases.map((p) => p.name);
    for (const p of ['spawn vmm', 'qmp ready', 'load memory', 'resume', 'agent ready', 'clock set'])
      expect(phases).toContain(p);
    // a restored copy lives on its own: the snapshot it came from can go, and it can be snapshotted
    await lab.removeSnapshot('vm-snap');
    const again = await a.snapshot('from-a', { memory: true });
    expect(again.record.memory!.bytes).toBeGreaterThan(1_000_000);
    expect(existsSync(join(again.record.memory!.dir, 'ram'))).toBe(false); // its RAM is not its own file: streamed whole
    // and that snapshot restores too (its RAM block has the name the restore gives it)
    const c = await lab.restore('from-a', { name: 'vm-c' });
    expect(await out(c, ['cat', '/root/f'])).toBe('before');
    expect(Number(await out(c, ['cat', '/run/count']))).toBeGreaterThan(0);
    await c.destroy();
    await lab.removeSnapshot('from-a');
    await a.destroy();
    await b.destroy();
  }, 120_000);

  it('pause and resume: stopped, then running with its clock set again', async () => {
    await vm.pause();
    await new Promise((r) => setTimeout(r, 2000));
    await vm.resume();
    expect(Math.abs(Number(await out(vm, ['date', '+%s'])) - Date.now() / 1000)).toBeLessThan(1.5);
  }, 60_000);

  it('a filesystem snapshot of a VM keeps its disk as the guest wrote it; a restore boots from it', async () => {
    await vm.exec(['sh', '-c', 'echo kept > /root/disk-file']); // no sync here: the snapshot has the guest sync
    const snap = await vm.snapshot('vm-disk');
    expect(snap.record.memory ?? null).toBeNull();
    expect(snap.toJSON()).toMatchObject({ driver: 'qemu', kind: 'filesystem' }); // a VM's disk: restores only as a VM
    expect(snap.lastTrace!.phases.map((p) => p.name)).toEqual(
      expect.arrayContaining(['guest sync', 'freeze', 'snapshot storage', 'thaw']),
    );
    await vm.exec(['sh', '-c', 'echo later > /root/later']);
    const r = await lab.restore('vm-disk', { name: 'vm-disk-r' });
    expect(r.driver).toBe('qemu');
    expect(await out(r, ['cat', '/root/disk-file'])).toBe('kept');
    expect((await r.exec(['test', '-e', '/root/later'])).exitCode).toBe(1);
    expect(await out(r, ['hostname'])).toBe('vm-disk-r');
    // its root is a disk of its own: ext4 on a qcow2 overlay in its volume, whose backing file
    // is the image's base disk, shared and read only
    expect(await out(r, ['sh', '-c', 'grep " / " /proc/mounts'])).toMatch(/^\/dev\/vda \/ ext4 /);
    const info = JSON.parse(
      (await run('qemu-img', ['info', '-U', '--output=json', join(r.info.volume!.path, DISK_IN_VOLUME)])).stdout,
    ) as Record<string, string>;
    expect(info.format).toBe('qcow2');
    expect(info['backing-filename']!.startsWith(`${join(lab.home, 'qemu', 'disks')}/`)).toBe(true);
    expect(statSync(info['backing-filename']!).mode & 0o222).toBe(0);
    await r.destroy();
    await lab.removeSnapshot('vm-disk');
  }, 120_000);

  it("an image cannot choose a VM's disk: what its tree holds at .snaplab-vm is thrown away", async () => {
    // an untrusted image whose tree sends the disk directory to a host directory
    const tree = join(lab.home, 'evil-tree');
    const target = join(lab.home, 'host-dir');
    await run('cp', ['-a', (await lab.images()).find((i) => i.name === 'busybox')!.path, tree]);
    await run('mkdir', ['-p', target]);
    await run('ln', ['-s', target, join(tree, '.snaplab-vm')]);
    await lab.importImage(tree, 'evil');
    const box = await lab.create({ driver: 'qemu', image: 'evil', name: 'vm-evil' });
    expect(readdirSync(target)).toEqual([]); // nothing was written through the link
    const info = JSON.parse(
      (await run('qemu-img', ['info', '-U', '--output=json', join(box.info.volume!.path, DISK_IN_VOLUME)])).stdout,
    ) as Record<string, string>;
    expect(info['backing-filename']!.startsWith(`${join(lab.home, 'qemu', 'disks')}/`)).toBe(true);
    expect(await out(box, ['echo', 'ok'])).toBe('ok');
    await box.destroy();
    await lab.removeImage('evil');
  }, 120_000);

  it('a pool of VM standbys: paused restores of one booted VM, each execution in a fresh one', async () => {
    const pool = await lab.createPool({ name: 'vms', image: 'busybox', size: 2, driver: 'qemu', limits: {} });
    const st = await pool.stats();
    expect([st.driver, st.ready, st.recycle]).toEqual(['qemu', 2, false]);
    // the template: a memory snapshot of a VM booted once; the VM itself is gone
    const template = (await lab.snapshots()).find((x) => x.name.startsWith('_pool.vms.'));
    expect(template?.record.memory?.driver).toBe('qemu');
    expect((await lab.list()).filter((x) => x.info.reason === 'template of pool vms')).toEqual([]);
    // a name users cannot give: theirs never collide with a template
    await expect(vm.snapshot('_pool.other')).rejects.toMatchObject({ code: 'BAD_NAME' });
    const argv = [
      'sh',
      '-c',
      // its random numbers first: each restore's own from its first draw (the generator reseeded at its identity)
      'echo $(head -c 16 /dev/urandom | od -An -tx1 | tr -d " \\n") $(hostname) $(cat /etc/machine-id) $(date +%s) $(cat /root/mark 2>/dev/null); echo used > /root/mark',
    ];
    const a = await pool.run(argv);
    const b = await pool.run(argv);
    expect([a.hit, b.hit, a.recycled, b.recycled]).toEqual([true, true, false, false]);
    const [ra, ha, ia, ta, markA] = a.stdout.toString().trim().split(' ');
    const [rb, hb, ib, tb, markB] = b.stdout.toString().trim().split(' ');
    expect(ha).not.toBe(hb); // each restore has its own identity
    expect(ia).not.toBe(ib);
    expect(ra).toMatch(/^[0-9a-f]{32}$/);
    expect(ra).not.toBe(rb);
    expect(markA ?? markB).toBeUndefined(); // nothing one execution left reaches the next
    for (const t of [ta, tb]) expect(Math.abs(Number(t) - Date.now() / 1000)).toBeLessThan(5); // the clock was set on take
    const phases = a.trace.phases.map((p) => p.name);
    expect(phases).toEqual(expect.arrayContaining(['thaw', 'clock set']));
    expect(phases).not.toContain('load memory'); // a hit restores nothing: the standby was ready
    const after = await pool.stats();
    expect([after.hits, after.ready]).toEqual([2, 0]);
    // a miss restores one on the spot
    const c = await pool.run(['true']);
    expect(c.hit).toBe(false);
    await pool.remove();
    expect((await lab.snapshots()).filter((x) => x.name.startsWith('_pool.'))).toEqual([]);
    expect((await lab.list()).filter((x) => x.info.pool === 'vms')).toEqual([]);
  }, 240_000);

  it('killing QEMU mid-snapshot gives a clear error and leaves nothing gc cannot remove', async () => {
    const booted = await lab.create({ driver: 'qemu', name: 'vm-kill0' });
    await booted.snapshot('kill-base', { memory: true });
    expect(readdirSync('/dev/shm').some((f) => f.endsWith(`${booted.id}.ram`))).toBe(ramInShm);
    process.kill(booted.info.pid!, 'SIGKILL'); // a crash: its RAM file in /dev/shm stays behind
    // a restored VM maps its RAM privately, so its memory snapshot streams all of it: slow that
    // stream right down, so that the kill lands in the middle of it
    const victim = await lab.restore('kill-base', { name: 'vm-kill' });
    const pid = victim.info.pid!;
    const qmp = await QmpClient.connect(join(lab.home, 'run', victim.id, 'qmp.sock'));
    await qmp.execute('migrate-set-parameters', { 'max-bandwidth': 1024 * 1024 });
    qmp.close();
    setTimeout(() => process.kill(pid, 'SIGKILL'), 800);
    await expect(victim.snapshot('doomed', { memory: true })).rejects.toMatchObject({
      code: expect.stringMatching(/VM_ERROR|SANDBOX_DEAD|TIMEOUT/),
    });
    expect((await lab.snapshots()).map((s) => s.name)).not.toContain('doomed');
    await (await lab.get('vm-kill')).destroy();
    await lab.removeSnapshot('kill-base');
    // the crashed VM's RAM file is freed by the first command that sees it dead, not left to gc
    const dead = await lab.get('vm-kill0');
    expect(dead.info.state).toBe('dead');
    expect(readdirSync('/dev/shm').filter((f) => f.endsWith(`${booted.id}.ram`))).toEqual([]);
    await lab.gc();
    await dead.destroy();
    // the half-written memory file went with gc; no QEMU of that sandbox is left
    const left = existsSync(join(lab.home, 'snapshots')) ? readdirSync(join(lab.home, 'snapshots')) : [];
    expect(left).toEqual([]);
    expect(readdirSync('/dev/shm').filter((f) => f.endsWith(`${booted.id}.ram`))).toEqual([]); // the crashed VM's RAM file too
    expect(existsSync(`/proc/${pid}`) && !readFileSync(`/proc/${pid}/stat`, 'utf8').includes(') Z')).toBe(false);
  }, 120_000);

  // what a failed or abandoned create leaves, seen without gc: records, run directories, cgroups,
  // RAM files and QEMU processes of any sandbox but the live ones
  async function leftovers(): Promise<string[]> {
    // a dead record's machine must be gone too: only running or paused ones may hold anything
    const live = new Set((await lab.list()).filter((b) => b.info.state !== 'dead').map((b) => b.id));
    const ids = (names: string[]): string[] =>
      names.map((n) => /([0-9a-f]{12})(\.ram)?$/.exec(n)?.[1]).filter((id): id is string => !!id && !live.has(id));
    const found: string[] = [];
    for (const id of ids(existsSync(join(lab.home, 'run')) ? readdirSync(join(lab.home, 'run')) : []))
      found.push(`run directory ${id}`);
    for (const id of ids(readdirSync('/dev/shm').filter((n) => n.startsWith(ramPrefix(lab.home)))))
      found.push(`RAM file ${id}`);
    const ours = new Set((await lab.list()).map((b) => b.id));
    for (const cg of await snaplabCgroupsOnHost())
      if (!live.has(cg.id) && (ours.has(cg.id) || existsSync(join(lab.home, 'run', cg.id))))
        found.push(`cgroup ${cg.id}`);
    const procs = await run('pgrep', ['-f', `${lab.home}/run/`], { allowFail: true });
    for (const pid of procs.stdout.split('\n').filter(Boolean)) {
      const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ');
      const id = new RegExp(`${lab.home}/run/([0-9a-f]{12})/`).exec(cmd)?.[1];
      if (id && !live.has(id)) found.push(`process ${pid}: ${cmd.slice(0, 60)}`);
    }
    return found;
  }
  const cli = (args: string[], env: NodeJS.ProcessEnv = {}) =>
    run(SNAPLAB, [...args], { env: { ...process.env, SNAPLAB_HOME: lab.home, ...env }, allowFail: true });

  it('a VM whose agent never answers in time: the create fails and leaves nothing, without gc', async () => {
    expect(await leftovers()).toEqual([]);
    const r = await cli(['create', '--driver', 'qemu', '--name', 'vm-late'], { SNAPLAB_VM_BOOT_TIMEOUT_MS: '300' });
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/error\[TIMEOUT\]: the VM's agent did not answer within 300 ms/);
    expect((await lab.list()).map((b) => b.name)).not.toContain('vm-late');
    expect(await leftovers()).toEqual([]);
    const bad = await cli(['create', '--driver', 'qemu', '--name', 'vm-bad'], { SNAPLAB_VM_BOOT_TIMEOUT_MS: 'soon' });
    expect(bad.stderr).toMatch(/error\[BAD_INPUT\]: SNAPLAB_VM_BOOT_TIMEOUT_MS/);
    expect(await leftovers()).toEqual([]);
  }, 60_000);

  it('a VM whose creating process was killed mid-boot is stopped by the next command that sees it', async () => {
    const child = spawn(SNAPLAB, ['create', '--driver', 'qemu', '--name', 'vm-orphan'], {
      env: { ...process.env, SNAPLAB_HOME: lab.home },
      stdio: 'ignore',
    });
    // wait until its QEMU runs, then kill the CLI as a script's timeout would
    let qemuPid = 0;
    for (let i = 0; i < 400 && !qemuPid; i++) {
      const rec = (await lab.list()).find((b) => b.name === 'vm-orphan');
      const pidFile = rec ? join(lab.home, 'run', rec.id, 'qemu.pid') : '';
      if (pidFile && existsSync(pidFile)) qemuPid = Number(readFileSync(pidFile, 'utf8').trim()) || 0;
      if (!qemuPid) await new Promise((res) => setTimeout(res, 50));
    }
    expect(qemuPid).toBeGreaterThan(0);
    child.kill('SIGKILL');
    await new Promise((res) => child.once('exit', res));
    expect(existsSync(`/proc/${qemuPid}`)).toBe(true); // QEMU is nobody's child: it ran on
    const ls = await cli(['ls', '--json']);
    const rec = (JSON.parse(ls.stdout) as { name: string; state: string; reason: string }[]).find(
      (b) => b.name === 'vm-orphan',
    );
    expect(rec).toMatchObject({ state: 'dead', reason: expect.stringMatching(/creation was interrupted/) });
    // ls stopped it: no QEMU, relay, cgroup or RAM file; the record stays, with its reason, until rm
    let gone = false;
    for (let i = 0; i < 100 && !gone; i++) {
      gone = !existsSync(`/proc/${qemuPid}`) || readFileSync(`/proc/${qemuPid}/stat`, 'utf8').includes(') Z');
      if (!gone) await new Promise((res) => setTimeout(res, 50));
    }
    expect(gone).toBe(true);
    expect(await leftovers()).toEqual([]);
    const id = (await lab.list()).find((b) => b.name === 'vm-orphan')!.id;
    expect(existsSync(join(lab.home, 'run', id))).toBe(false);
    expect(readdirSync('/dev/shm').filter((f) => f.endsWith(`${id}.ram`))).toEqual([]);
    expect((await cli(['rm', 'vm-orphan'])).code).toBe(0);
    expect((await lab.list()).map((b) => b.name)).not.toContain('vm-orphan');
    expect(await leftovers()).toEqual([]);
  }, 120_000);
});
