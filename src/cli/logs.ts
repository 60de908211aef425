import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { driverInfo } from '../drivers/registry.js';
import type { Command } from 'commander';
import { SnaplabError } from '../errors.js';
import { parsePositiveInt } from '../lab/sizes.js';
import { withLab, type CommonOptions } from './common.js';
import { EXIT_EXEC_FAILURE } from './output.js';
import { orElse } from '../cleanup.js';

/**
 * `snaplab logs MACHINE`: a system machine's journal (journalctl inside, -f follows); any other
 * machine's console and launch log as the host keeps it (its run directory's agent.log).
 */
export function registerLogs(program: Command): void {
  program
    .command('logs <machine>')
    .description(
      "a system machine's journal (journalctl -b inside); for other machines the log the host keeps (a VM's serial console)",
    )
    .option('-f, --follow', 'keep printing as entries come (system machines)')
    .option('-n, --lines <n>', 'the last N entries', '200')
    .option('--json', 'errors as JSON')
    .action((machine: string, o: CommonOptions & { follow?: boolean; lines: string }) =>
      withLab(
        o,
        async (lab) => {
          const box = await lab.get(machine);
          const lines = parsePositiveInt(o.lines, '--lines');
          try {
            if (box.info.init !== 'systemd') {
              if (o.follow)
                throw new SnaplabError(
                  'BAD_INPUT',
                  '--follow needs a system machine (its journal)',
                  `drop -f: ${box.info.name} has only the launch log the host keeps`,
                );
              // a VM's console is its serial log; a namespace machine's, the launcher's log
              const file = join(lab.home, 'run', box.info.id, driverInfo(box.info.driver).consoleLog);
              const text = await readFile(file, 'utf8').catch(orElse(undefined, `read ${file}`, 'ENOENT'));
              if (text === undefined)
                throw new SnaplabError(
                  'BAD_INPUT',
                  `${box.info.name} has no log on this host (${file})`,
                  'a machine that is not running keeps none',
                );
              process.stdout.write(
                text
                  .split('\n')
                  .slice(-lines - 1)
                  .join('\n'),
              );
              return 0;
            }
            const argv = ['journalctl', '--no-pager', '-b', '-n', String(lines), ...(o.follow ? ['-f'] : [])];
            const ac = new AbortController();
            process.once('SIGINT', () => ac.abort());
            const r = await box
              .exec(argv, {
                onStdout: (b) => process.stdout.write(b),
                onStderr: (b) => process.stderr.write(b),
                signal: ac.signal,
              })
              .catch((e: Error & { code?: string }) => {
                if (e.code === 'ABORTED') return { exitCode: 0 };
                throw e;
              });
            return r.exitCode;
          } finally {
            box.close();
          }
        },
        EXIT_EXEC_FAILURE,
      ),
    );
}
