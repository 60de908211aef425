import type { Command } from 'commander';
import { formatBytes, parseSize } from '../lab/sizes.js';
import type { ImageRecord } from '../store/records.js';
import { withLab, type CommonOptions } from './common.js';
import { printJson, printTable } from './output.js';
import { SnaplabError } from '../errors.js';
import { registerImageBuild } from './image-build.js';

/** Where an image came from, in a few words: `docker-archive nginx:1.25`, `debian bookworm minbase`. */
export function originOf(i: ImageRecord): string {
  const p = i.provenance;
  if (!p) return i.source;
  if (p.kind === 'debian') return `debian ${String(p.build?.suite ?? '')} ${String(p.build?.variant ?? '')}`.trim();
  if (p.kind === 'oci' || p.kind === 'docker-archive') return `${p.kind} ${p.ref ?? p.source}`;
  return `${p.kind} ${p.source}`;
}

function inspectText(i: ImageRecord): string {
  const p = i.provenance;
  const c = i.config;
  const lines = [
    `name:      ${i.name}`,
    `origin:    ${originOf(i)}`,
    `size:      ${formatBytes(i.sizeBytes)}`,
    `created:   ${new Date(i.createdAt).toISOString()}`,
    `tree:      ${i.path}`,
  ];
  if (p?.init) lines.push(`init:      ${p.init} (machines boot it; --init agent to not)`);
  if (p?.configDigest) lines.push(`config:    ${p.configDigest}`);
  if (p?.manifestDigest) lines.push(`manifest:  ${p.manifestDigest}`);
  if (p?.layers?.length) {
    lines.push(`layers:    ${p.layers.length}`);
    for (const l of p.layers) lines.push(`  ${l.digest}  ${l.compression.padEnd(4)}  ${formatBytes(l.bytes)}`);
  }
  if (p?.build)
    lines.push(
      `build:     ${Object.entries(p.build)
        .map(([k, v]) => `${k}=${Array.isArray(v) ? v.join(',') : String(v)}`)
        .join(' ')}`,
    );
  if (c) {
    if (c.entrypoint) lines.push(`entrypoint: ${JSON.stringify(c.entrypoint)}`);
    if (c.cmd) lines.push(`cmd:       ${JSON.stringify(c.cmd)}`);
    if (c.workingDir) lines.push(`workdir:   ${c.workingDir}`);
    if (c.user) lines.push(`user:      ${c.user}`);
    for (const e of c.env) lines.push(`env:       ${e}`);
    for (const [k, v] of Object.entries(c.labels)) lines.push(`label:     ${k}=${v}`);
  }
  for (const n of p?.notes ?? []) lines.push(`note:      ${n}`);
  return lines.join('\n');
}

export function registerImage(program: Command): void {
  const image = program.command('image').description('build, import, list, inspect and remove root filesystem images');
  registerImageBuild(image);
  image
    .command('import <source>')
    .description(
      'import a docker save tarball, an OCI image layout (directory or tarball), or a rootfs tarball or directory; compressed or not',
    )
    .option('--name <name>', 'image name')
    .option('--tag <tag>', 'which image, when the archive holds several (a repo tag, or an OCI ref name)')
    .option('--max-size <size>', 'refuse an archive that unpacks to more than this (default 64G)')
    .option('--json', 'print JSON')
    .action((source: string, o: CommonOptions & { name?: string; tag?: string; maxSize?: string }) =>
      withLab(o, async (lab) => {
        if (!o.name)
          throw new SnaplabError('BAD_INPUT', 'an image needs a name', `snaplab image import ${source} --name NAME`);
        const maxBytes = o.maxSize === undefined ? undefined : parseSize(o.maxSize, '--max-size');
        const rec = await lab.importImage(source, o.name, { tag: o.tag, maxBytes });
        if (o.json) return printJson(rec);
        const layers = rec.provenance?.layers?.length;
        process.stdout.write(
          `imported ${rec.name} (${formatBytes(rec.sizeBytes)}${layers ? `, ${layers} layer${layers > 1 ? 's' : ''}` : ''}) from ${originOf(rec)}\n`,
        );
        for (const n of rec.provenance?.notes ?? []) process.stderr.write(`note: ${n}\n`);
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
        printTable(
          ['NAME', 'SIZE', 'LAYERS', 'ORIGIN', 'CREATED'],
          all.map((i) => [
            i.name,
            formatBytes(i.sizeBytes),
            String(i.provenance?.layers?.length ?? '-'),
            originOf(i),
            new Date(i.createdAt).toISOString(),
          ]),
        );
      }),
    );
  image
    .command('inspect <name>')
    .description('show an image: where it came from, its layers and digests, its run config')
    .option('--json', 'print JSON')
    .action((name: string, o: CommonOptions) =>
      withLab(o, async (lab) => {
        const rec = (await lab.images()).find((i) => i.name === name);
        if (!rec)
          throw new SnaplabError(
            'IMAGE_NOT_FOUND',
            `no image named ${JSON.stringify(name)}`,
            'list images with `snaplab image ls`',
          );
        if (o.json) return printJson(rec);
        process.stdout.write(`${inspectText(rec)}\n`);
      }),
    );
  image
    .command('rm <names...>')
    .description('remove images; refused while a sandbox or snapshot uses one, unless --force')
    .option('--force', 'also remove the sandboxes and snapshots that use it')
    .option('--json', 'print JSON')
    .action((names: string[], o: CommonOptions & { force?: boolean }) =>
      withLab(o, async (lab) => {
        const alsoRemoved: string[] = [];
        for (const n of names) alsoRemoved.push(...(await lab.removeImage(n, { force: o.force })).removed);
        if (o.json) return printJson({ removed: names, alsoRemoved });
        process.stdout.write(
          `removed ${names.join(', ')}${alsoRemoved.length ? ` (and ${alsoRemoved.join(', ')})` : ''}\n`,
        );
      }),
    );
}
