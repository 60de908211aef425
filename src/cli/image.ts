import type { Command } from 'commander';
import { formatBytes } from '../lab/sizes.js';
import { withLab, type CommonOptions } from './common.js';
import { printJson, printTable } from './output.js';
import { SnaplabError } from '../errors.js';

export function registerImage(program: Command): void {
  const image = program.command('image').description('import, list and remove root filesystem images');
  image
    .command('import <source>')
    .description('import a rootfs tarball (.tar, .tar.gz, .tar.xz, .tar.zst) or directory')
    .option('--name <name>', 'image name')
    .option('--json', 'print JSON')
    .action((source: string, o: CommonOptions & { name?: string }) =>
      withLab(o, async (lab) => {
        if (!o.name) throw new SnaplabError('BAD_INPUT', 'an image needs a name', `snaplab image import ${source} --name NAME`);
        const rec = await lab.importImage(source, o.name);
        if (o.json) printJson(rec);
        else process.stdout.write(`imported ${rec.name} (${formatBytes(rec.sizeBytes)})\n`);
      }),
    );
  image
    .command('ls')
    .description('list images (the built-in busybox image appears once it has been used)')
    .option('--json', 'print JSON')
    .action((o: CommonOptions) =>
      withLab(o, async (lab) => {
        const all = await lab.images();
        if (o.json) return printJson(all);
        printTable(['NAME', 'SIZE', 'SOURCE', 'CREATED'], all.map((i) => [i.name, formatBytes(i.sizeBytes), i.source, new Date(i.createdAt).toISOString()]));
      }),
    );
  image
    .command('rm <names...>')
    .description('remove images no sandbox or snapshot uses')
    .option('--json', 'print JSON')
    .action((names: string[], o: CommonOptions) =>
      withLab(o, async (lab) => {
        for (const n of names) await lab.removeImage(n);
        if (o.json) printJson({ removed: names });
        else process.stdout.write(`removed ${names.join(', ')}\n`);
      }),
    );
}
