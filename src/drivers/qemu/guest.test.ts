import { spawn, type ChildProcess } from 'node:child_process';
import {
  existsSync,
  lstatSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { chmod, copyFile, mkdir, stat, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isSnaplabError, type SnaplabError } from '../../errors.js';
import { run, which } from '../../host/run.js';
import { agentBinaryPath } from '../../agent/binary.js';
import {
  ensureGuestKernel,
  ensureInitramfs,
  GUEST_AGENT_PATH,
  GUEST_AGENT_RUN_PATH,
  listInitramfs,
  qemuKernelArgs,
  readInitramfsFile,
  ROOT_DEVICE,
  type GuestKernel,
} from './guest.js';
import {
  baseDiskPath,
  checkVolumeDisk,
  createOverlay,
  DISK_IN_VOLUME,
  ensureBaseDisk,
  freshVolumeDisk,
  gcBaseDisks,
  VM_DISK_BYTES,
} from './disk.js';

const home = mkdtempSync(join(tmpdir(), 'snaplab-qemu-guest-'));
const log = (s: string): void => console.log(`[guest.test] ${s}`);
let kernel: GuestKernel;
let rootfs: string;

/** A busybox image tree as src/lab/images/images.ts makes it: /bin/busybox and a symlink per applet. */
async function busyboxTree(root: string): Promise<void> {
  for (const d of ['bin', 'sbin', 'usr/bin', 'usr/sbin', 'etc', 'tmp', 'proc', 'dev', 'run'])
    await mkdir(join(root, d), { recursive: true });
  await copyFile('/bin/busybox', join(root, 'bin/busybox'));
  await chmod(join(root, 'bin/busybox'), 0o755);
  const { stdout } = await run('/bin/busybox', ['--list-full']);
  for (const applet of stdout.split('\n').filter(Boolean)) {
    const target = join(root, applet);
    if (applet === 'bin/busybox' || existsSync(target)) continue;
    await mkdir(join(target, '..'), { recursive: true });
    await symlink(relative(join(target, '..'), join(root, 'bin/busybox')), target);
  }
  await writeFile(join(root, 'etc/hostname'), 'busybox\n');
}

beforeAll(async () => {
  rootfs = join(home, 'rootfs');
  await busyboxTree(rootfs);
}, 60_000);

afterAll(() => {
  rmSync(home, { recursive: true, force: true });
});

describe('qemu guest artefacts', () => {
  it('fetches the cloud kernel once, then answers from the cache', async () => {
    const steps: string[] = [];
    let t = performance.now();
    kernel = await ensureGuestKernel(home, (s) => {
      steps.push(s);
      log(`${(performance.now() - t).toFixed(0)} ms: ${s}`);
    });
    log(`first ensureGuestKernel: ${(performance.now() - t).toFixed(0)} ms`);
    expect(kernel.version).toMatch(/-cloud-amd64$/);
    expect(kernel.modulesDir).toBe(join(home, 'qemu', 'kernel', kernel.version, 'lib', 'modules', kernel.version));
    expect(readFileSync(kernel.kernel).subarray(0, 4)).toEqual(Buffer.from([0x7f, 0x45, 0x4c, 0x46])); // PVH ELF here (lz4 works)
    const dep = readFileSync(join(kernel.modulesDir, 'modules.dep'), 'utf8');
    for (const m of ['virtio_console', 'virtio_pci', 'virtio_mmio', 'virtio_ring']) expect(dep).toContain(`/${m}.ko:`);
    expect(dep).toContain('/virtio_net.ko:'); // a scenario VM's NIC
    expect(dep).not.toContain('/e1000.ko:'); // only what the guest needs is kept
    expect(steps.some((s) => s.startsWith('downloading linux-image-'))).toBe(true);

    t = performance.now();
    const again = await ensureGuestKernel(home, (s) => steps.push(`again: ${s}`));
    const ms = performance.now() - t;
    log(`cached ensureGuestKernel: ${ms.toFixed(1)} ms`);
    expect(again).toEqual(kernel);
    expect(steps.filter((s) => s.startsWith('again:'))).toEqual([]); // no apt, nothing to say
    expect(ms).toBeLessThan(250); // 2–25 ms measured; generous for a busy host
  }, 300_000);

  it('completes in place a cached kernel without virtio_net (from before scenario VMs) when a VM needs a NIC, and only then', async () => {
    const depFile = join(kernel.modulesDir, 'modules.dep');
    const ko = readFileSync(depFile, 'utf8')
      .split('\n')
      .find((l) => l.includes('/virtio_net.ko:'))!
      .split(':')[0]!;
    writeFileSync(
      depFile,
      readFileSync(depFile, 'utf8')
        .split('\n')
        .filter((l) => !l.includes('/virtio_net.ko:'))
        .join('\n'),
    );
    rmSync(join(kernel.modulesDir, ko));
    const steps: string[] = [];
    // every other VM boots from it as it is (no apt: an offline host keeps working)
    expect(await ensureGuestKernel(home, (s) => steps.push(s))).toEqual(kernel);
    expect(steps).toEqual([]);
    const again = await ensureGuestKernel(home, (s) => steps.push(s), { net: true });
    expect(steps.some((s) => s.startsWith('downloading linux-image-'))).toBe(true);
    expect(again).toEqual(kernel); // the same version at the same paths
    expect(readFileSync(depFile, 'utf8')).toContain('/virtio_net.ko:');
    expect(existsSync(join(kernel.modulesDir, ko))).toBe(true);
  }, 300_000);

  it('builds one initramfs (cached): /init, the agent and the modules, nothing of the image', async () => {
    let t = performance.now();
    const out = await ensureInitramfs({ home, kernel, agent: agentBinaryPath(), machine: 'pc' });
    log(`ensureInitramfs (pc): ${(performance.now() - t).toFixed(0)} ms, ${(await stat(out)).size} bytes`);
    expect(out.startsWith(`${join(home, 'qemu', 'initrd')}/`)).toBe(true);
    const entries = await listInitramfs(out);
    const byName = new Map(entries.map((e) => [e.name, e]));
    const init = byName.get('init');
    expect(init).toBeDefined();
    expect(init!.mode & 0o170000).toBe(0o100000);
    expect(init!.mode & 0o111).toBe(0o111);
    expect((byName.get(GUEST_AGENT_PATH.slice(1))?.mode ?? 0) & 0o111).toBe(0o111);
    expect(byName.has('bin/busybox')).toBe(false); // the image is on the VM's disk
    const mods = entries.filter((e) => e.name.endsWith('.ko')).map((e) => e.name.split('/').pop());
    // (ext4 and crc32c are built into Debian's cloud kernel: asked for, and left out as built in)
    expect(mods).toEqual(
      expect.arrayContaining(['virtio_ring.ko', 'virtio.ko', 'virtio_pci.ko', 'virtio_console.ko', 'virtio_blk.ko']),
    );
    expect(mods).not.toContain('virtio_mmio.ko');
    expect(byName.has(`lib/modules/${kernel.version}/modules.dep`)).toBe(true);

    // /init loads the modules in dependency order, mounts the disk and switches to the agent
    const script = (await readInitramfsFile(out, 'init'))!.toString();
    expect(script.startsWith('#!/.snaplab/busybox sh\n')).toBe(true);
    const insmods = /for m in (.*); do/
      .exec(script)![1]!
      .split(' ')
      .map((m) => m.replace(/'/g, '').split('/').pop()!);
    expect(insmods.indexOf('virtio_ring.ko')).toBeLessThan(insmods.indexOf('virtio.ko'));
    expect(insmods.indexOf('virtio.ko')).toBeLessThan(insmods.indexOf('virtio_pci.ko'));
    expect(script).toContain(`mount -t ext4 -o noatime ${ROOT_DEVICE} /newroot`);
    expect(script).toMatch(
      new RegExp(
        `\n\\[ "\\$init" = systemd \\] \\|\\| exec \\$BB switch_root /newroot ${GUEST_AGENT_RUN_PATH} serve --stream "\\$port" --caps 'CAP_[A-Z_,]+'\n`,
      ),
    );
    // a system machine's: the image's systemd, which starts the agent as a runtime unit
    expect(script).toMatch(new RegExp(`ExecStart=${GUEST_AGENT_RUN_PATH} serve --stream \\$port --system\n`));
    expect(script).toMatch(/\nexec \$BB switch_root \/newroot \$sd\n$/);
    // the network's modules are in the archive but loaded only with snaplab.net= words
    expect(mods).toEqual(expect.arrayContaining(['virtio_net.ko', 'net_failover.ko', 'failover.ko']));
    const netLoads = /if \[ -n "\$nets" \]; then\n {2}for m in (.*); do/
      .exec(script)![1]!
      .split(' ')
      .map((m) => m.replace(/'/g, '').split('/').pop()!);
    expect(netLoads).toEqual(['failover.ko', 'net_failover.ko', 'virtio_net.ko']);
    expect(insmods).not.toContain('virtio_net.ko');

    // cached: the same file, not rebuilt; another machine type is another file
    t = performance.now();
    expect(await ensureInitramfs({ home, kernel, agent: agentBinaryPath(), machine: 'pc' })).toBe(out);
    log(`ensureInitramfs again: ${(performance.now() - t).toFixed(0)} ms`);
    const microOut = await ensureInitramfs({ home, kernel, agent: agentBinaryPath(), machine: 'microvm' });
    expect(microOut).not.toBe(out);
    const microMods = (await listInitramfs(microOut))
      .filter((e) => e.name.endsWith('.ko'))
      .map((e) => e.name.split('/').pop());
    expect(microMods).toContain('virtio_mmio.ko');
    expect(microMods).not.toContain('virtio_pci.ko');
    expect(readdirSync(join(home, 'qemu', 'tmp'))).toEqual([]); // staging cleaned up
    expect(readdirSync(join(home, 'qemu', 'initrd')).filter((f) => f.includes('.tmp-'))).toEqual([]);
  }, 120_000);

  it('makes a base disk from an image tree once, overlays on it, and collects the unused', async () => {
    const source = { id: 'vol-test1', path: rootfs };
    let t = performance.now();
    const [a, b] = await Promise.all([ensureBaseDisk(home, source), ensureBaseDisk(home, source)]);
    log(`ensureBaseDisk: ${(performance.now() - t).toFixed(0)} ms`);
    expect(a).toBe(b);
    expect(a).toBe(baseDiskPath(home, 'vol-test1'));
    expect(statSync(a).mode & 0o222).toBe(0); // never written
    expect(statSync(a).size).toBeGreaterThanOrEqual(VM_DISK_BYTES); // sparse: room to write
    // the tree is in it, as the guest will see it
    const ls = await run('debugfs', ['-R', 'ls -p /bin', a]);
    expect(ls.stdout).toMatch(/\/busybox\//);
    const overlay = join(home, 'vol', DISK_IN_VOLUME);
    t = performance.now();
    await createOverlay(a, overlay);
    log(`createOverlay: ${(performance.now() - t).toFixed(0)} ms`);
    const info = JSON.parse((await run('qemu-img', ['info', '--output=json', overlay])).stdout) as Record<
      string,
      unknown
    >;
    expect(info['backing-filename']).toBe(a);
    expect(info['virtual-size']).toBe(statSync(a).size);
    // gc: a disk whose image volume is gone goes, a kept one stays, a live builder's temp stays
    const stray = baseDiskPath(home, 'vol-gone');
    writeFileSync(stray, '');
    const building = `${baseDiskPath(home, 'vol-x')}.tmp-${process.pid}-1`;
    const crashed = `${baseDiskPath(home, 'vol-y')}.tmp-999999999-1`;
    writeFileSync(building, '');
    writeFileSync(crashed, '');
    const removed = await gcBaseDisks(home, (id) => id === 'vol-test1');
    expect(removed.sort()).toEqual([`base disk ${crashed}`, `base disk ${stray}`].sort());
    expect(existsSync(a) && existsSync(building)).toBe(true);
    rmSync(building);

    // a VM snapshot's disk is checked before QEMU opens it: ours passes, a planted one does not
    const vol = join(home, 'vol');
    expect(await checkVolumeDisk(home, vol)).toEqual({ disk: overlay, base: a });
    const planted = join(home, 'planted');
    await mkdir(join(planted, '.snaplab-vm'), { recursive: true });
    await run('qemu-img', [
      'create',
      '-q',
      '-f',
      'qcow2',
      '-F',
      'raw',
      '-b',
      '/etc/hostname',
      join(planted, DISK_IN_VOLUME),
      '1M',
    ]);
    await expect(checkVolumeDisk(home, planted)).rejects.toMatchObject({
      code: 'SNAPSHOT_NOT_FOUND',
      message: expect.stringMatching(/not a base disk of this snaplab home/),
    });
    const linked = join(home, 'linked');
    await mkdir(linked, { recursive: true });
    await symlink(join(vol, '.snaplab-vm'), join(linked, '.snaplab-vm'));
    await expect(checkVolumeDisk(home, linked)).rejects.toMatchObject({
      code: 'SNAPSHOT_NOT_FOUND',
      message: expect.stringMatching(/no disk directory/),
    });
    // a fresh disk replaces whatever is there, without following a link
    const fresh = await freshVolumeDisk(linked, a);
    expect(lstatSync(join(linked, '.snaplab-vm')).isDirectory()).toBe(true);
    expect(fresh).toBe(join(linked, DISK_IN_VOLUME));
    expect(existsSync(overlay)).toBe(true); // the link's target is untouched
  }, 60_000);

  it('says what to do when apt cannot get the kernel (no network)', async () => {
    // fake apt tools first on PATH: the lookup works, the download and the update fail as offline
    const bin = join(home, 'fake-bin');
    await mkdir(bin, { recursive: true });
    await writeFile(
      join(bin, 'apt-cache'),
      '#!/bin/sh\necho linux-image-cloud-amd64\necho "  Depends: linux-image-6.1.0-99-cloud-amd64"\n',
      { mode: 0o755 },
    );
    await writeFile(
      join(bin, 'apt-get'),
      '#!/bin/sh\necho "E: Failed to fetch http://deb.debian.org/x.deb  Temporary failure resolving \'deb.debian.org\'" >&2\nexit 100\n',
      { mode: 0o755 },
    );
    const path = process.env.PATH;
    process.env.PATH = `${bin}:${path}`;
    const offline = join(home, 'offline');
    try {
      const steps: string[] = [];
      const err = await ensureGuestKernel(offline, (s) => steps.push(s)).catch((e: unknown) => e);
      expect(isSnaplabError(err, 'DRIVER_UNAVAILABLE')).toBe(true);
      const e = err as SnaplabError;
      expect(e.message).toMatch(/^apt-get download failed: E: Failed to fetch .*Temporary failure resolving/);
      expect(e.hint).toContain('apt-get update');
      expect(e.hint).toContain('mirror');
      expect(steps.some((s) => /running apt-get update/.test(s))).toBe(true);
      expect(readdirSync(join(offline, 'qemu', 'kernel'))).toEqual([]); // nothing half-made
    } finally {
      process.env.PATH = path;
    }
  });

  it('qemuKernelArgs', () => {
    expect(qemuKernelArgs('pc')).toMatch(/^console=ttyS0 quiet panic=-1 tsc_early_khz=\d+ init_on_free=1$/);
    expect(qemuKernelArgs('microvm')).toContain('tsc_early_khz=');
  });

  it('boots /init under QEMU (pc, TCG): mounts the root disk, finds the snaplab port', async (ctx) => {
    if (!(await which('qemu-system-x86_64'))) ctx.skip();
    const serial = join(home, 'serial.log');
    const sock = join(home, 'vm.sock');
    const initrd = await ensureInitramfs({ home, kernel, agent: agentBinaryPath(), machine: 'pc' });
    const disk = join(home, 'boot', DISK_IN_VOLUME);
    await createOverlay(await ensureBaseDisk(home, { id: 'vol-boot', path: rootfs }), disk);
    const args = [
      '-M',
      'pc',
      '-accel',
      'tcg',
      '-m',
      '128M',
      '-nographic',
      '-no-reboot',
      '-nodefaults',
      '-serial',
      `file:${serial}`,
      '-kernel',
      kernel.kernel,
      '-initrd',
      initrd,
      '-append',
      `${qemuKernelArgs('pc')} snaplab.hostname=guest-test`,
      '-drive',
      `file=${disk},if=none,id=root,format=qcow2`,
      '-device',
      'virtio-blk-pci,drive=root',
      '-device',
      'virtio-serial-pci',
      '-chardev',
      `socket,path=${sock},server=on,wait=off,id=c0`,
      '-device',
      'virtserialport,chardev=c0,name=snaplab',
    ];
    const t = performance.now();
    const qemu: ChildProcess = spawn('qemu-system-x86_64', args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    qemu.stderr!.on('data', (b: Buffer) => (stderr += b.toString()));
    let exited = false;
    qemu.on('exit', () => (exited = true));
    try {
      let text = '';
      while (performance.now() - t < 60_000 && !exited) {
        text = existsSync(serial) ? readFileSync(serial, 'utf8') : '';
        if (/snaplab-init: (port|FATAL)/.test(text)) break;
        await new Promise((r) => setTimeout(r, 20));
      }
      log(`boot to /init's port line: ${(performance.now() - t).toFixed(0)} ms`);
      text = existsSync(serial) ? readFileSync(serial, 'utf8') : '';
      expect(text, `serial log:\n${text}\nqemu stderr:\n${stderr}`).toMatch(/snaplab-init: port \/dev\/vport\d+p\d+/);
      expect(text).not.toMatch(/insmod .* failed/);
      expect(text).toContain('snaplab-init: hostname guest-test'); // from the kernel command line
      await new Promise((r) => setTimeout(r, 300));
      log(`serial log:\n${readFileSync(serial, 'utf8')}`);
    } finally {
      if (!exited) {
        qemu.kill('SIGKILL');
        await new Promise((r) => qemu.once('exit', r));
      }
    }
  }, 90_000);
});
