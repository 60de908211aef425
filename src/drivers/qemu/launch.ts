import { spawn } from 'node:child_process';
import { readdir, readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { SnaplabError } from '../../errors.js';
import { VMM_UID_BASE, VMM_UID_SPAN } from '../../host/userns/id-ranges.js';
import { jailArgs, jailed } from './jail.js';
import { orElse } from '../../cleanup.js';
import type { VmConfig } from './vm-config.js';
export type { VmConfig, VmNet } from './vm-config.js';
export { VMM_UID_BASE } from '../../host/userns/id-ranges.js';

export const QEMU = 'qemu-system-x86_64';

/** Paths of a VM's files in its run directory. */
export const vmFiles = (
  runDir: string,
): Record<'qmp' | 'chardev' | 'relay' | 'relayLog' | 'pid' | 'log' | 'serial', string> => ({
  qmp: join(runDir, 'qmp.sock'),
  chardev: join(runDir, 'agent.sock'),
  /** the relay's socket: what host processes connect to (relay.ts) */
  relay: join(runDir, 'relay.sock'),
  relayLog: join(runDir, 'relay.log'),
  pid: join(runDir, 'qemu.pid'),
  log: join(runDir, 'qemu.log'),
  serial: join(runDir, 'serial.log'),
});

/**
 * The QEMU command line. A restore must use the same devices and memory size as the VM the
 * snapshot came from, so the config is stored with every memory snapshot.
 */
/**
 * The uid (and gid) a VM's QEMU runs as, one per VM from a reserved range (2 000 000 000 + 0..99 999 999,
 * above systemd's container range; no account needed): a QEMU that a guest took over can touch
 * neither the host's files nor another VM's QEMU. QEMU opens everything it needs (disk, RAM file,
 * sockets, logs) as root first and drops to it before the guest runs (`-runas`); migration files
 * come as open descriptors. Derived from the sandbox id, moved on while a live process has it.
 */
export async function vmmUid(id: string): Promise<number> {
  const used = new Set<number>();
  // a /proc/PID directory belongs to the process's uid: one stat each, in parallel
  const pids = (await readdir('/proc').catch(orElse([] as string[], 'readdir', 'ENOENT'))).filter((p) =>
    /^\d+$/.test(p),
  );
  const owners = await Promise.all(
    pids.map((p) =>
      stat(`/proc/${p}`).then(
        (st) => st.uid,
        () => 0,
      ),
    ),
  );
  for (const uid of owners) if (uid >= VMM_UID_BASE) used.add(uid);
  let uid = VMM_UID_BASE + (parseInt(id.slice(0, 8), 16) % VMM_UID_SPAN);
  while (used.has(uid)) uid = VMM_UID_BASE + ((uid - VMM_UID_BASE + 1) % VMM_UID_SPAN);
  return uid;
}

/** TCG's translation cache, MiB (within the driver's VMM_OVERHEAD beside QEMU's own memory) */
const TCG_TB_MIB = 128;

export function qemuArgs(runDir: string, c: VmConfig, incoming: boolean, uid?: number): string[] {
  const f = vmFiles(runDir);
  return [
    '-name',
    'snaplab',
    '-M',
    c.memoryBackend || c.ram ? `${c.machine},memory-backend=ram0` : c.machine,
    ...(c.memoryBackend || c.ram ? ['-object', memoryBackend(c)] : []),
    // TCG's translation cache grows to 1 GiB by default (QEMU 7.2): a systemd guest's took 259 MiB
    // and the OOM killer took QEMU at its cgroup's limit (guest RAM + VMM_OVERHEAD). Held to 128 MiB
    '-accel',
    c.accel === 'tcg' ? `tcg,tb-size=${TCG_TB_MIB}` : c.accel,
    '-m',
    `${c.memoryMb}M`,
    '-smp',
    String(c.cpus),
    '-nodefaults',
    '-no-user-config',
    '-display',
    'none',
    '-no-reboot',
    // QEMU's own seccomp filter: its default deny list, no obsolete calls, no scheduler or resource
    // changes. spawn=deny and elevateprivileges=deny make -daemonize fail (QEMU 7.2, measured).
    '-sandbox',
    'on,obsolete=deny,resourcecontrol=deny',
    '-kernel',
    c.kernel,
    '-initrd',
    c.initrd,
    '-append',
    c.append,
    '-serial',
    `file:${f.serial}`,
    // the disk and its backing, each node named: QEMU opens the base read only and does not follow
    // a backing name written in the overlay. Write-back cache: QEMU flushes when it stops (pause,
    // snapshot), so the host file is whole then
    '-blockdev',
    JSON.stringify({ driver: 'file', filename: c.diskBase, 'node-name': 'base-file', 'read-only': true }),
    '-blockdev',
    JSON.stringify({ driver: 'raw', file: 'base-file', 'node-name': 'base', 'read-only': true }),
    '-blockdev',
    JSON.stringify({ driver: 'file', filename: c.disk, 'node-name': 'disk-file', discard: 'unmap' }),
    '-blockdev',
    JSON.stringify({ driver: 'qcow2', file: 'disk-file', backing: 'base', 'node-name': 'root', discard: 'unmap' }),
    '-device',
    'virtio-blk-pci,drive=root',
    '-device',
    'virtio-serial-pci',
    '-chardev',
    `socket,path=${f.chardev},server=on,wait=off,id=agent`,
    '-device',
    'virtserialport,chardev=agent,name=snaplab',
    // the taps exist already (persistent, made by `up`, owned by root): QEMU opens them before -runas
    ...(c.net?.nics ?? []).flatMap((n, k) => [
      '-netdev',
      `tap,id=net${k},ifname=${n.tap},script=no,downscript=no`,
      '-device',
      `virtio-net-pci,netdev=net${k},mac=${n.mac}`,
    ]),
    '-qmp',
    `unix:${f.qmp},server=on,wait=off`,
    '-pidfile',
    f.pid,
    '-daemonize',
    ...(uid !== undefined ? ['-runas', `${uid}:${uid}`] : []),
    ...(incoming ? ['-incoming', 'defer'] : []),
  ];
}

/**
 * The `ram0` backend: the VM's own RAM file (shared: a memory snapshot copies it), a snapshot's
 * RAM file mapped copy-on-write (every restore of it reads the same pages; its writes are its
 * own), or anonymous memory. (QEMU 7.2's `readonly=on` makes the guest's RAM read only, not the
 * file: a private mapping of a read-only file needs `rom=off`, QEMU 8.2. The file is mode 0444.)
 */
function memoryBackend(c: VmConfig): string {
  const size = `size=${c.memoryMb}M`;
  if (!c.ram) return `memory-backend-ram,id=ram0,${size}`;
  const path = `mem-path=${c.ram.path.replace(/,/g, ',,')}`;
  return `memory-backend-file,id=ram0,${size},${path},share=${c.ram.share ? 'on' : 'off'}`;
}

/** The last lines of a VM's logs (QEMU's own and the guest's serial console), for error messages. */
export async function logTail(runDir: string): Promise<string> {
  const f = vmFiles(runDir);
  const tail = async (p: string): Promise<string> =>
    (await readFile(p, 'utf8').catch(orElse('', 'readFile', 'ENOENT'))).trim().split('\n').slice(-8).join('\n');
  const [q, s, r] = await Promise.all([tail(f.log), tail(f.serial), tail(f.relayLog)]);
  return [q && `qemu: ${q}`, r && `relay: ${r}`, s && `guest console:\n${s}`].filter(Boolean).join('\n');
}

/**
 * Start QEMU daemonized (it outlives this process) and already inside the sandbox's cgroup (a
 * shell joins it, then execs QEMU: no moment outside its limits, nothing gc cannot find);
 * resolves with its pid once it is running. QEMU runs in a jail of its own (jail.ts) unless
 * SNAPLAB_QEMU_JAIL=off.
 */
export async function startQemu(
  runDir: string,
  c: VmConfig,
  incoming: boolean,
  cgroupProcs: string[] = [],
  uid?: number,
): Promise<number> {
  const f = vmFiles(runDir);
  const { openSync, closeSync } = await import('node:fs');
  const log = openSync(f.log, 'a');
  const join = 'for f in $SNAPLAB_CGROUP_PROCS; do echo $$ > "$f" || exit 125; done; exec "$@"';
  const qemu = [QEMU, ...qemuArgs(runDir, c, incoming, uid)];
  const jail = jailed() ? await jailArgs(runDir, c, qemu) : qemu;
  // a scenario machine's QEMU (and its jail) starts in the machine's network namespace
  const argv = c.net ? ['nsenter', `--net=${c.net.netns}`, '--', ...jail] : jail;
  const child = spawn('/bin/sh', ['-c', join, 'snaplab-qemu', ...argv], {
    stdio: ['ignore', log, log],
    detached: true,
    env: { ...process.env, SNAPLAB_CGROUP_PROCS: cgroupProcs.join(' ') },
  });
  closeSync(log);
  const code = await new Promise<number>((resolve, reject) => {
    child.once('error', (e) =>
      reject(
        new SnaplabError(
          'DRIVER_UNAVAILABLE',
          `cannot start ${QEMU}: ${e.message}`,
          'apt-get install qemu-system-x86',
          { cause: e },
        ),
      ),
    );
    child.once('exit', (c2) => resolve(c2 ?? 1));
  });
  if (code !== 0) {
    throw new SnaplabError(
      'LAUNCH_FAILED',
      `${QEMU} exited ${code}: ${(await logTail(runDir)) || 'no output'}`,
      code === 125
        ? "could not join the sandbox's cgroup: run `snaplab doctor`"
        : "check the VM settings (QEMU's own message is above)",
    );
  }
  const pid = Number((await readFile(f.pid, 'utf8')).trim());
  if (!pid) throw new SnaplabError('LAUNCH_FAILED', `${QEMU} wrote no pid file`, `see ${f.log}`);
  return pid;
}
