import type { Command } from 'commander';
import { SnaplabError } from '../errors.js';
import { addTraceOption, showTrace, throughDaemonRefused, withApi, withLab, type CommonOptions } from './common.js';
import { ms, printJson, printTable } from './output.js';
import { standbyFlag } from './scenario.js';

type SnapshotCli = CommonOptions & { name?: string; scenario?: string; memory?: boolean; standby?: 0 | 1 };

const mib = (bytes: unknown): string => `${(Number(bytes) / 2 ** 20).toFixed(1)} MiB`;

/** `snapshot --scenario`: every machine of a scenario at one point (the embedded lab's). */
function snapshotScenario(o: SnapshotCli & { scenario: string }): Promise<void> {
  return withLab(o, async (lab) => {
    if (process.env.SNAPLAB_HOST) throw throughDaemonRefused('snapshot --scenario');
    if (!o.name)
      throw new SnaplabError(
        'BAD_INPUT',
        'a snapshot needs a name',
        `snaplab snapshot --scenario ${o.scenario} --name NAME`,
      );
    const r = await lab.scenario(o.scenario).snapshot(o.name, o.standby === undefined ? {} : { standby: o.standby });
    if (o.json)
      printJson({
        scenario: r.scenario,
        name: r.name,
        manifest: r.manifest,
        snapshotMs: r.trace.totalMs,
        operation: r.trace.id,
      });
    else
      process.stdout.write(`scenario ${o.scenario}: snapshot ${r.name} of every machine in ${ms(r.trace.totalMs)}\n`);
    showTrace(o, r.trace);
  });
}

/**
 * One sandbox's snapshot: its name on stdout (or --json); what it took on stderr when the lab
 * timed it here (a daemon keeps its traces).
 */
function snapshotSandbox(sandbox: string | undefined, o: SnapshotCli): Promise<void> {
  return withApi(o, async (lab) => {
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
    const j = s.toJSON();
    const t = s.lastTrace;
    if (o.json) printJson({ ...j, ...(t ? { operation: t.id, snapshotMs: t.totalMs } : {}) });
    else process.stdout.write(`${s.name}\n`);
    if (t && !o.json) {
      const what =
        j.kind === 'memory'
          ? `(memory: ${mib(j.memoryBytes)}; processes continue after a restore)`
          : '(processes are not saved)';
      process.stderr.write(`snapshot ${s.name} of ${box.name} taken in ${ms(t.totalMs)} ${what}\n`);
    }
    showTrace(o, t);
  });
}

export function registerSnapshot(program: Command): void {
  const snap = program
    .command('snapshot')
    .description('take, list and remove filesystem snapshots')
    .argument('[sandbox]', 'sandbox to snapshot')
    .option('--name <name>', 'name of the new snapshot')
    .option('--scenario <name>', 'snapshot every machine of a scenario as one consistent point')
    .option(
      '--standby <0|1>',
      "with --scenario, 0: raise no standby of it (default: the scenario's setting)",
      standbyFlag,
    )
    .option('--memory', 'the whole machine state too (VM driver): a restore continues its processes')
    .option('--json', 'print the snapshot as JSON')
    .enablePositionalOptions();
  addTraceOption(snap);
  snap.action((sandbox: string | undefined, o: SnapshotCli) =>
    o.scenario ? snapshotScenario({ ...o, scenario: o.scenario }) : snapshotSandbox(sandbox, o),
  );
  snap
    .command('ls')
    .description('list snapshots')
    .option('--json', 'print JSON')
    .action((o: CommonOptions) =>
      withApi(o, async (lab) => {
        const all = (await lab.snapshots()).map((s) => s.toJSON());
        if (o.json) return printJson(all);
        printTable(
          ['NAME', 'FROM', 'IMAGE', 'STORAGE', 'DRIVER', 'KIND', 'CREATED'],
          all.map((j) => [
            String(j.name),
            String(j.sandbox),
            String(j.image),
            String(j.storage),
            String(j.driver),
            j.kind === 'memory' ? `memory (${mib(j.memoryBytes)})` : 'filesystem',
            String(j.createdAt),
          ]),
        );
      }),
    );
  snap
    .command('rm <names...>')
    .description('remove snapshots')
    .option('--json', 'print JSON')
    .action((names: string[], o: CommonOptions) =>
      withApi(o, async (lab) => {
        for (const n of names) await lab.removeSnapshot(n);
        if (o.json) printJson({ removed: names });
        else process.stdout.write(`removed ${names.join(', ')}\n`);
      }),
    );
}
