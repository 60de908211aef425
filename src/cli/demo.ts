import type { Command } from 'commander';
import type { TraceSummary } from '../timing/trace.js';
import { BUILTIN_IMAGE } from '../defaults.js';
import { withLab, type CommonOptions } from './common.js';
import { ms, printJson, table } from './output.js';

/** Phase table: one row per top-level phase of each operation. */
function phaseRows(t: TraceSummary): string[][] {
  const rows = t.phases.filter((p) => p.depth === 0).map((p) => [t.kind, p.name, ms(p.endMs - p.startMs)]);
  rows.push([t.kind, '(unattributed)', ms(t.unattributedMs)], [t.kind, 'TOTAL', ms(t.totalMs)]);
  return rows;
}

export function registerDemo(program: Command): void {
  program
    .command('demo')
    .description('create a sandbox, run a command, snapshot, change a file, restore, and print the phase table')
    .option('--storage <kind>', 'storage to use (default: the best that works here)')
    .option('--json', 'print JSON')
    .action((o: CommonOptions & { storage?: 'btrfs' | 'overlay' | 'dir' }) =>
      withLab(o, async (lab) => {
        const say = (s: string): void => {
          if (!o.json) process.stdout.write(`${s}\n`);
        };
        const traces: TraceSummary[] = [];
        const tag = Date.now().toString(36);
        await using box = await lab.create({ image: BUILTIN_IMAGE, name: `demo-${tag}`, storage: o.storage });
        traces.push(box.lastTrace!);
        say(
          `1. created ${box.name} on ${box.storage} storage in ${ms(box.lastTrace!.totalMs)} (a command ran inside before this returned)`,
        );
        const uname = await box.exec([
          'sh',
          '-c',
          'echo "pid $$ on $(hostname), $(ls /proc | grep -c "^[0-9]") processes visible"',
        ]);
        say(`2. exec: ${uname.stdout.toString().trim()}`);
        await box.exec(['sh', '-c', 'echo before > /root/state']);
        const snap = await box.snapshot(`demo-${tag}`);
        traces.push(snap.lastTrace!);
        say(`3. snapshot ${snap.name} in ${ms(snap.lastTrace!.totalMs)}`);
        await box.exec(['sh', '-c', 'echo after > /root/state']);
        say(`4. changed /root/state in the sandbox to "after"`);
        await using copy = await lab.restore(snap.name, { name: `demo-${tag}-restored` });
        traces.push(copy.lastTrace!);
        const seen = (await copy.exec(['cat', '/root/state'])).stdout.toString().trim();
        say(`5. restored ${snap.name} as ${copy.name} in ${ms(copy.lastTrace!.totalMs)}: /root/state reads "${seen}"`);
        await copy.destroy();
        await box.destroy();
        await lab.removeSnapshot(snap.name);
        if (o.json) return printJson({ restoredContent: seen, operations: traces });
        say(`\n${table(['OPERATION', 'PHASE', 'TIME'], traces.flatMap(phaseRows))}`);
        say(`\nwaterfalls: ${traces.map((t) => `snaplab trace ${t.id}`).join(' ; ')}`);
        return seen === 'before' ? 0 : 1;
      }),
    );
}
