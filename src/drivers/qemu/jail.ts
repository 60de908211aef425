/**
 * QEMU in a jail, as Firecracker's jailer puts its VMM: a mount namespace of its own whose root
 * is an empty tmpfs holding only what this VM's QEMU opens (the host's /usr read-only for the
 * program, its libraries and firmware; its kernel, initramfs and base disk read-only; its disk,
 * RAM file and run directory), a minimal /dev (with /dev/kvm under KVM), no /proc, /sys, /home,
 * /var, /etc or other VMs' files; new network, IPC, UTS and cgroup namespaces (its agent and
 * monitor are Unix sockets in its run directory, which work across network namespaces; a
 * scenario machine's QEMU keeps its machine's network namespace, where its taps are, and
 * /dev/net/tun); no_new_privs; and only the capabilities QEMU needs to open its files and drop to
 * its own uid (`-runas`), after which it holds none. bubblewrap makes it (the namespaces driver's
 * launcher already); paths stay the same inside, so QEMU's command line does not change.
 */
import { lstat, readlink, writeFile } from 'node:fs/promises';
import { SnaplabError } from '../../errors.js';
import { which } from '../../host/run.js';
import type { VmConfig } from './vm-config.js';
import { orElse } from '../../cleanup.js';

/** Off only with SNAPLAB_QEMU_JAIL=off (to measure what the jail costs, or to debug QEMU). */
export const jailed = (): boolean => process.env.SNAPLAB_QEMU_JAIL !== 'off';

/** /bin, /lib, /lib64, /sbin as the host has them: links into /usr (merged /usr), or read-only binds. */
async function rootDirs(): Promise<string[]> {
  const out: string[] = [];
  for (const d of ['/bin', '/sbin', '/lib', '/lib64', '/lib32', '/libx32']) {
    const st = await lstat(d).catch(orElse(null, 'lstat', 'ENOENT'));
    if (!st) continue;
    if (st.isSymbolicLink()) out.push('--symlink', await readlink(d), d);
    else out.push('--ro-bind', d, d);
  }
  return out;
}

/** The bwrap command line that runs `qemu` (argv) jailed. */
export async function jailArgs(runDir: string, c: VmConfig, qemu: string[]): Promise<string[]> {
  const bwrap = await which('bwrap');
  if (!bwrap)
    throw new SnaplabError(
      'DRIVER_UNAVAILABLE',
      'bwrap is not installed: QEMU runs in a bubblewrap jail',
      'apt-get install bubblewrap (or SNAPLAB_QEMU_JAIL=off to run QEMU unjailed)',
    );
  const ro = (p: string): string[] => ['--ro-bind', p, p];
  const rw = (p: string): string[] => ['--bind', p, p];
  if (c.ram?.share) await writeFile(c.ram.path, '', { flag: 'a', mode: 0o600 }); // QEMU would make it: the bind needs it there first
  return [
    bwrap,
    // a scenario machine's QEMU stays in the network namespace it was started in (its taps are
    // there): nothing else is in it, and QEMU holds no capability over it
    ...(c.net ? [] : ['--unshare-net']),
    '--unshare-ipc',
    '--unshare-uts',
    '--unshare-cgroup',
    '--cap-drop',
    'ALL',
    '--cap-add',
    'CAP_SETUID',
    '--cap-add',
    'CAP_SETGID',
    '--cap-add',
    'CAP_DAC_OVERRIDE',
    ...ro('/usr'),
    ...(await rootDirs()),
    '--ro-bind-try',
    '/etc/ld.so.cache',
    '/etc/ld.so.cache',
    '--dev',
    '/dev',
    ...(c.accel === 'kvm' ? ['--dev-bind', '/dev/kvm', '/dev/kvm'] : []),
    ...(c.net ? ['--dev-bind', '/dev/net/tun', '/dev/net/tun'] : []),
    // the run directory first: the initramfs lives in it, and its read-only bind goes on top
    ...rw(runDir),
    ...ro(c.kernel),
    ...ro(c.initrd),
    ...ro(c.diskBase),
    ...rw(c.disk),
    // A snapshot's RAM file is mapped private: the guest's writes never reach it. But QEMU 7.2
    // opens it read-write (readonly=on makes the guest's RAM read only; rom=off is QEMU 8.2) and
    // keeps that descriptor, so a QEMU its guest took over could write the file every other
    // restore of the snapshot maps: a known gap (docs/security.md), not closed by the jail.
    ...(c.ram ? rw(c.ram.path) : []),
    '--chdir',
    '/',
    '--',
    ...qemu,
  ];
}
