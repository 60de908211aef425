import { spawn } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SnaplabError } from '../../errors.js';

export interface VmConfig {
  accel: 'kvm' | 'tcg';
  machine: 'pc';
  memoryMb: number;
  cpus: number;
  kernel: string;
  initrd: string;
  append: string;
}

export const QEMU = 'qemu-system-x86_64';

/** Paths of a VM's files in its run directory. */
export const vmFiles = (runDir: string): Record<'qmp' | 'chardev' | 'pid' | 'log' | 'serial', string> => ({
  qmp: join(runDir, 'qmp.sock'),
  chardev: join(runDir, 'agent.sock'),
  pid: join(runDir, 'qemu.pid'),
  log: join(runDir, 'qemu.log'),
  serial: join(runDir, 'serial.log'),
});

/**
 * The QEMU command line. A restore must use the same devices and memory size as the VM the
 * snapshot came from, so the config is stored with every memory snapshot.
 */
export function qemuArgs(runDir: string, c: VmConfig, incoming: boolean): string[] {
  const f = vmFiles(runDir);
  return [
    '-name', 'snaplab',
    '-M', c.machine,
    '-accel', c.accel,
    '-m', `${c.memoryMb}M`,
    '-smp', String(c.cpus),
    '-nodefaults', '-no-user-config', '-display', 'none', '-no-reboot',
    '-kernel', c.kernel, '-initrd', c.initrd, '-append', c.append,
    '-serial', `file:${f.serial}`,
    '-device', 'virtio-serial-pci',
    '-chardev', `socket,path=${f.chardev},server=on,wait=off,id=agent`,
    '-device', 'virtserialport,chardev=agent,name=snaplab',
    '-qmp', `unix:${f.qmp},server=on,wait=off`,
    '-pidfile', f.pid,
    '-daemonize',
    ...(incoming ? ['-incoming', 'defer'] : []),
  ];
}

/** Start QEMU daemonized (it outlives this process); resolves with its pid once it is running. */
export async function startQemu(runDir: string, c: VmConfig, incoming: boolean): Promise<number> {
  const f = vmFiles(runDir);
  const { openSync, closeSync } = await import('node:fs');
  const log = openSync(f.log, 'a');
  const child = spawn(QEMU, qemuArgs(runDir, c, incoming), { stdio: ['ignore', log, log], detached: true });
  closeSync(log);
  const code = await new Promise<number>((resolve, reject) => {
    child.once('error', (e) => reject(new SnaplabError('DRIVER_UNAVAILABLE', `cannot start ${QEMU}: ${e.message}`, 'apt-get install qemu-system-x86')));
    child.once('exit', (c2) => resolve(c2 ?? 1));
  });
  if (code !== 0) {
    const text = (await readFile(f.log, 'utf8').catch(() => '')).trim().split('\n').slice(-5).join('\n');
    throw new SnaplabError('LAUNCH_FAILED', `${QEMU} exited ${code}: ${text || 'no output'}`, `see ${f.log}`);
  }
  const pid = Number((await readFile(f.pid, 'utf8')).trim());
  if (!pid) throw new SnaplabError('LAUNCH_FAILED', `${QEMU} wrote no pid file`, `see ${f.log}`);
  return pid;
}
