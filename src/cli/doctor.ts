import type { Command } from 'commander';
import { envHome } from '../lab/home.js';
import { printJson, printTable, reportError } from './output.js';

export function registerDoctor(program: Command): void {
  program
    .command('doctor')
    .description('check what works on this host, why not, and how to fix it')
    .option('--json', 'print JSON')
    .action(async (o: { json?: boolean }) => {
      try {
        const { doctor } = await import('./doctor-checks.js');
        const r = await doctor(envHome());
        if (o.json) printJson(r);
        else {
          printTable(
            ['CHECK', 'KIND', 'OK', 'DETAIL', 'FIX'],
            r.checks.map((c) => [
              c.name,
              c.kind,
              c.ok ? 'yes' : !c.optional ? 'NO' : c.kind === 'host' ? 'tune' : 'no',
              c.reason,
              // a check that passes may still name a fix (an optional tool to install, a sysctl): shown too
              c.fix ?? '',
            ]),
          );
          process.stdout.write(
            `\ndefault driver: namespaces; default storage: ${r.defaultStorage ?? 'none'} — ${r.defaultStorageReason}\nstate: ${r.home}\n${r.ok ? 'ready' : 'NOT READY: apply the fixes above'}\n`,
          );
        }
        process.exitCode = r.ok ? 0 : 1;
      } catch (e) {
        reportError(e, !!o.json);
        process.exitCode = 2;
      }
    });
}
