import type { Command } from 'commander';
import { SnaplabError } from '../errors.js';
import { addTraceOption, showTrace, withLab, type CommonOptions } from './common.js';
import { ms, printJson, printTable } from './output.js';

export function registerSnapshot(program: Command): void {
  const snap = program
    .command('snapshot')
    .description('take, list and remove filesystem snapshots')
    .argument('[sandbox]', 'sandbox to snapshot')
    .option('--name <name>', 'name of the new snapshot')
    .option('--scenario <name>', 'snapshot every machine of a scenario as one consistent point')
    .option('--memory', 'the whole machine state too (VM driver): a restore continues its processes')
    .option('--json', 'print the snapshot as JSON')
    .enablePositionalOptions();
  addTraceOption(snap);
  snap.action(
    (sandbox: string | undefined, o: CommonOptions & { name?: string; scenario?: string; memory?: boolean }) =>
      withLab(o, async (lab) => {
        if (o.scenario) {
          if (!o.name)
            throw new SnaplabError(
              'BAD_INPUT',
              'a snapshot needs a name',
              `snaplab snapshot --scenario ${o.scenario} --name NAME`,
            );
          const r = await lab.scenario(o.scenario).snapshot(o.name);
          if (o.json)
            printJson({
              scenario: r.scenario,
              name: r.name,
              manifest: r.manifest,
              snapshotMs: r.trace.totalMs,
              operation: r.trace.id,
            });
          else
            process.stdout.write(
              `scenario ${o.scenario}: snapshot ${r.name} of every machine in ${ms(r.trace.totalMs)}\n`,
            );
          showTrace(o, r.trace);
          return;
        }
        if (!sandbox)
          throw new SnaplabError(
            'BAD_INPUT',
            'which sandbox?',
            'snaplab snapshot <sandbox> --name NAME (or `snaplab snapshot ls`)',
          );
        if (!o.name)
          throw new SnaplabError('BAD_INPUT', 'a snapshot needs a name', `snaplab snapshot ${sandbox} --name NAME`);
        const box = await lab.get(sandbox);
        const s = await box.snapshot(o.name, { memory: o.memory });
        box.close();
        const mem = s.record.memory;
        if (o.json)
          printJson({
            ...s.toJSON(),
            operation: s.lastTrace?.id,
            snapshotMs: s.lastTrace?.totalMs,
            ...(mem ? { memoryBytes: mem.bytes } : {}),
          });
        else
          process.stdout.write(
            `snapshot ${s.name} of ${box.name} taken in ${ms(s.lastTrace?.totalMs ?? 0)} ${mem ? `(memory: ${(mem.bytes / 2 ** 20).toFixed(1)} MiB; processes continue after a restore)` : '(processes are not saved)'}\n`,
          );
        showTrace(o, s.lastTrace);
      }),
  );
  snap
    .command('ls')
    .description('list snapshots')
    .option('--json', 'print JSON')
    .action((o: CommonOptions) =>
      withLab(o, async (lab) => {
        const all = await lab.snapshots();
        if (o.json) return printJson(all.map((s) => s.toJSON()));
        printTable(
          ['NAME', 'FROM', 'IMAGE', 'STORAGE', 'DRIVER', 'KIND', 'CREATED'],
          all.map((s) => {
            const j = s.toJSON();
            const kind = s.record.memory
              ? `memory (${(s.record.memory.bytes / 2 ** 20).toFixed(1)} MiB)`
              : 'filesystem';
            return [
              s.name,
              s.record.sandbox,
              s.record.image,
              s.storage,
              String(j.driver),
              kind,
              new Date(s.record.createdAt).toISOString(),
            ];
          }),
        );
      }),
    );
  snap
    .command('rm <names...>')
    .description('remove snapshots')
    .option('--json', 'print JSON')
    .action((names: string[], o: CommonOptions) =>
      withLab(o, async (lab) => {
        for (const n of names) await lab.removeSnapshot(n);
        if (o.json) printJson({ removed: names });
        else process.stdout.write(`removed ${names.join(', ')}\n`);
      }),
    );
}
