import type { Command } from 'commander';
import { existsSync } from 'node:fs';
import { isDynamicElf } from '../host/elf.js';
import { NamespacesDriver } from '../drivers/namespaces/driver.js';
import { QemuDriver } from '../drivers/qemu/driver.js';
import { probeCgroupMoves, probeCgroups } from '../host/cgroups.js';
import type { Availability } from '../host/probe-types.js';
import { which } from '../host/run.js';
import { toolsVerdict } from '../host/tools.js';
import { DEFAULT_HOME } from '../lab/context.js';
import { allBackends, pickDefault } from '../storage/index.js';
import { printJson, printTable, reportError } from './output.js';

interface Check extends Availability {
  name: string;
  kind: 'host' | 'driver' | 'storage' | 'image' | 'feature';
  /** a tuning: snaplab works without it, only slower */
  optional?: boolean;
}

async function busyboxCheck(): Promise<Availability> {
  const bb = (await which('busybox')) ?? '/bin/busybox';
  if (!existsSync(bb)) return { ok: false, reason: 'busybox not found (the built-in image needs it)', fix: 'apt-get install busybox-static' };
  if (isDynamicElf(bb)) return { ok: false, reason: `${bb} is dynamically linked`, fix: 'apt-get install busybox-static' };
  return { ok: true, reason: `static busybox at ${bb}` };
}

/** Probe everything snaplab needs; exit 0 when the default driver and a storage backend work. */
export async function doctor(home: string): Promise<{ ok: boolean; home: string; defaultDriver: string; defaultStorage: string | null; defaultStorageReason: string; checks: Check[] }> {
  const checks: Check[] = [];
  const root = process.getuid?.() === 0;
  checks.push({ name: 'root', kind: 'host', ok: root, reason: root ? 'running as root' : 'not root: namespaces, mounts and cgroups need root', ...(root ? {} : { fix: 'run as root (sudo)' }) });
  const cg = await probeCgroups();
  checks.push({ name: `cgroup v${cg.version}`, kind: 'host', ok: cg.ok, reason: cg.reason, ...(cg.fix ? { fix: cg.fix } : {}) });
  checks.push({ name: 'cgroup moves', kind: 'host', optional: true, ...(await probeCgroupMoves()) });
  const ns = await new NamespacesDriver(home).probe();
  checks.push({ name: 'namespaces', kind: 'driver', ...ns });
  checks.push({ name: 'qemu', kind: 'driver', optional: true, ...(await new QemuDriver(home).probe()) });
  for (const b of allBackends(home)) checks.push({ name: b.kind, kind: 'storage', ...(await b.probe()) });
  checks.push({ name: 'busybox image', kind: 'image', ...(await busyboxCheck()) });
  // features beyond a single sandbox: snaplab runs without them, but they fail when used
  checks.push({ name: 'scenarios', kind: 'feature', optional: true, ...((await toolsVerdict('scenario', 'scenarios')) ?? { ok: true, reason: 'ip and tc (iproute2) found' }) });
  checks.push({ name: 'image import', kind: 'feature', optional: true, ...((await toolsVerdict('image', 'image import')) ?? { ok: true, reason: 'tar and its decompressors found' }) });
  let defaultStorage: string | null = null;
  let defaultStorageReason = '';
  try {
    const d = await pickDefault(home);
    defaultStorage = d.kind;
    defaultStorageReason = d.reason;
  } catch (e) {
    defaultStorageReason = (e as Error).message;
  }
  return { ok: ns.ok && defaultStorage !== null, home, defaultDriver: 'namespaces', defaultStorage, defaultStorageReason, checks };
}

export function registerDoctor(program: Command): void {
  program
    .command('doctor')
    .description('check what works on this host, why not, and how to fix it')
    .option('--json', 'print JSON')
    .action(async (o: { json?: boolean }) => {
      try {
        const r = await doctor(process.env.SNAPLAB_HOME ?? DEFAULT_HOME);
        if (o.json) printJson(r);
        else {
          printTable(['CHECK', 'KIND', 'OK', 'DETAIL', 'FIX'], r.checks.map((c) => [c.name, c.kind, c.ok ? 'yes' : !c.optional ? 'NO' : c.kind === 'host' ? 'tune' : 'no', c.reason, c.ok ? '' : c.fix ?? '']));
          process.stdout.write(`\ndefault driver: namespaces; default storage: ${r.defaultStorage ?? 'none'} — ${r.defaultStorageReason}\nstate: ${r.home}\n${r.ok ? 'ready' : 'NOT READY: apply the fixes above'}\n`);
        }
        process.exitCode = r.ok ? 0 : 1;
      } catch (e) {
        reportError(e, !!o.json);
        process.exitCode = 2;
      }
    });
}
