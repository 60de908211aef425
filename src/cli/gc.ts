import type { Command } from 'commander';
import { addTraceOption, showTrace, withLab, type CommonOptions } from './common.js';
import { printJson } from './output.js';

export function registerGc(program: Command): void {
  const cmd = program
    .command('gc')
    .description('remove every snaplab mount, cgroup, process, directory and loop device that no live sandbox owns')
    .option('--json', 'print JSON');
  addTraceOption(cmd);
  cmd.action((o: CommonOptions) =>
    withLab(o, async (lab) => {
      const { removed, notes, trace } = await lab.gc();
      for (const n of notes) process.stderr.write(`note: ${n}\n`);
      if (o.json) printJson({ removed, notes, operation: trace.id });
      else
        process.stdout.write(
          removed.length
            ? `removed:\n  ${removed.join('\n  ')}\n(recorded as ${trace.id})\n`
            : `nothing to remove (recorded as ${trace.id})\n`,
        );
      showTrace(o, trace);
    }),
  );
}
