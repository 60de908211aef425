import type { Command } from 'commander';
import type { CopyResult } from '../lab/io/copy.js';
import { SnaplabError } from '../errors.js';
import { withLab, type CommonOptions } from './common.js';
import { printJson } from './output.js';

/** One side of `snaplab cp`: MACHINE:PATH (a scenario machine is SCENARIO/MACHINE:PATH), a host path, or `-`. */
type Side = { machine: string; path: string } | { host: string } | { stream: true };

const MACHINE_SIDE = /^([A-Za-z0-9][\w.-]*(?:\/[A-Za-z0-9][\w.-]*)?):(.*)$/;

export function parseSide(arg: string): Side {
  if (arg === '-') return { stream: true };
  const m = MACHINE_SIDE.exec(arg);
  if (!m) return { host: arg };
  if (!m[2])
    throw new SnaplabError(
      'BAD_INPUT',
      `no path after ${m[1]}:`,
      `give the path in the machine, e.g. ${m[1]}:/etc/hosts`,
    );
  return { machine: m[1]!, path: m[2] };
}

interface CpCli extends CommonOptions {
  followLink?: boolean;
}

export function registerCp(program: Command): void {
  program
    .command('cp <src> <dest>')
    .description(
      'copy files or directories into, out of or between machines (MACHINE:PATH; - is a tar stream on stdin/stdout)',
    )
    .option('-L, --follow-link', 'copy what SRC links to, not the link itself')
    .option('--json', 'the result (bytes, warnings) as JSON; errors as JSON')
    .addHelpText(
      'after',
      `
As docker cp: a directory is copied whole (DIR/. copies its contents), modes, owners and times
are kept, symbolic links are copied as links and never followed on either side. DEST in a
machine is resolved inside it; nothing is written outside DEST. Copied out of a machine, files
lose setuid/setgid bits and device nodes are not made (root inside may have made anything).
A host path with a colon in its first component is written ./path.

Examples:
  snaplab cp ./site web:/var/www        a host directory into a machine
  snaplab cp web:/etc/nginx ./nginx     out of a machine
  snaplab cp lab/db:/var/log/. ./logs   a scenario machine's directory's contents
  tar -C src -c . | snaplab cp - web:/srv     a tar stream in (DEST must be a directory)
  snaplab cp web:/srv - | tar -t        a tar stream out`,
    )
    .action((src: string, dest: string, o: CpCli) =>
      withLab(o, async (lab) => {
        // exit codes: 0 copied; 1 copied with something left out (warnings say what); 2 failed
        const from = parseSide(src);
        const to = parseSide(dest);
        const follow = o.followLink === true;
        let r: CopyResult;
        if ('machine' in from && 'machine' in to)
          r = await (await lab.get(from.machine)).copyTo(from.path, await lab.get(to.machine), to.path, { follow });
        else if ('machine' in to && 'host' in from)
          r = await (await lab.get(to.machine)).copyIn(from.host, to.path, { follow });
        else if ('machine' in to && 'stream' in from)
          r = await (await lab.get(to.machine)).upload(to.path, process.stdin);
        else if ('machine' in from && 'host' in to)
          r = await (await lab.get(from.machine)).copyOut(from.path, to.host, { follow });
        else if ('machine' in from && 'stream' in to)
          r = await (await lab.get(from.machine)).download(from.path, process.stdout, { follow });
        else
          throw new SnaplabError(
            'BAD_INPUT',
            'one side of cp must be a machine path (MACHINE:PATH)',
            'e.g. `snaplab cp ./file web:/tmp/` or `snaplab cp web:/etc/hosts .`; for host to host use cp',
          );
        for (const w of r.warnings) process.stderr.write(`snaplab: cp: warning: ${w}\n`);
        if (o.json) printJson(r);
        return r.complete ? 0 : 1; // 1: copied, but something was left out (said above)
      }),
    );
}
