import type { Command } from 'commander';
import { SnaplabError } from '../errors.js';
import type { Sandbox } from '../sdk/sandbox.js';
import { addTraceOption, showTrace, withLab, type CommonOptions } from './common.js';
import { printJson, printTable } from './output.js';

function age(ts: number): string {
  const s = Math.round((Date.now() - ts) / 1000);
  return s < 120 ? `${s}s` : s < 7200 ? `${Math.round(s / 60)}m` : `${Math.round(s / 3600)}h`;
}

export function registerLifecycle(program: Command): void {
  program
    .command('ls')
    .description('list sandboxes (state checked against the host)')
    .option('--json', 'print JSON')
    .action((o: CommonOptions) =>
      withLab(o, async (lab) => {
        const all = await lab.list();
        if (o.json) return printJson(all.map((b) => b.toJSON()));
        printTable(
          ['ID', 'NAME', 'STATE', 'IMAGE', 'STORAGE', 'DRIVER', 'AGE', 'NOTE'],
          all.map((b) => [
            b.id,
            b.name,
            b.state,
            b.image,
            b.storage,
            b.driver,
            age(b.info.createdAt),
            [
              b.hostRoot ? 'NO USER NAMESPACE (root inside is host root)' : '',
              b.info.init === 'systemd' ? 'systemd' : '',
              b.info.reason ?? (b.info.origin ? `from ${b.info.origin}` : ''),
            ]
              .filter(Boolean)
              .join('; '),
          ]),
        );
      }),
    );

  const rm = program
    .command('rm [sandboxes...]')
    .description('destroy sandboxes: kill their processes, delete their filesystems')
    .option('--all', 'remove every sandbox')
    .option('--json', 'print JSON');
  addTraceOption(rm);
  rm.action((names: string[], o: CommonOptions & { all?: boolean }) =>
    withLab(o, async (lab) => {
      if (!o.all && names.length === 0)
        throw new SnaplabError('BAD_INPUT', 'which sandboxes?', 'give ids or names, or --all');
      const boxes: Sandbox[] = o.all ? await lab.list() : await Promise.all(names.map((n) => lab.get(n)));
      const removed: string[] = [];
      for (const b of boxes) {
        showTrace(o, await b.destroy());
        removed.push(b.name);
      }
      if (o.json) printJson({ removed });
      else process.stdout.write(removed.length ? `removed ${removed.join(', ')}\n` : 'nothing to remove\n');
    }),
  );

  const stop = program
    .command('stop <sandboxes...>')
    .description(
      'stop machines and keep their filesystems: a system machine halts cleanly (killed past a 10 s grace); then snapshot or rm',
    )
    .option('--json', 'print JSON');
  addTraceOption(stop);
  stop.action((names: string[], o: CommonOptions) =>
    withLab(o, async (lab) => {
      for (const n of names) showTrace(o, await (await lab.get(n)).stop());
      if (o.json) printJson({ stopped: names });
      else process.stdout.write(`stopped ${names.join(', ')}\n`);
    }),
  );

  for (const verb of ['pause', 'resume'] as const) {
    const cmd = program
      .command(`${verb} <sandboxes...>`)
      .description(verb === 'pause' ? 'freeze every process of a sandbox (cgroup freezer)' : 'thaw a paused sandbox')
      .option('--json', 'print JSON');
    addTraceOption(cmd);
    cmd.action((names: string[], o: CommonOptions) =>
      withLab(o, async (lab) => {
        for (const n of names) {
          const b = await lab.get(n);
          showTrace(o, verb === 'pause' ? await b.pause() : await b.resume());
        }
        if (o.json) printJson({ [verb === 'pause' ? 'paused' : 'resumed']: names });
        else process.stdout.write(`${verb === 'pause' ? 'paused' : 'resumed'} ${names.join(', ')}\n`);
      }),
    );
  }
}
