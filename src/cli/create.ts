import { SnaplabError } from '../errors.js';
import type { Command } from 'commander';
import type { StorageKind } from '../storage/backend.js';
import { addTraceOption, showTrace, withLab, type CommonOptions } from './common.js';
import { addLimitOptions, limitsFrom, type LimitOptions } from './limits.js';
import { ms, printJson } from './output.js';
import { orElse } from '../cleanup.js';

interface CreateCli extends CommonOptions, LimitOptions {
  image: string;
  name?: string;
  storage?: StorageKind;
  driver?: string;
  userns: boolean;
  init?: string;
}

/** Said every time a sandbox runs as host root: --no-userns, or storage that cannot idmap yet. */
export function warnHostRoot(box: { name: string; storage: string; hostRoot: boolean }, asked: boolean): void {
  if (!box.hostRoot) return;
  const why = asked ? '--no-userns' : 'not available here';
  process.stderr.write(
    `warning: ${box.name} has no user namespace (${why}): root inside is root on the host, held back only by the capability set and the seccomp filter\n`,
  );
}

export function registerCreate(program: Command): void {
  const cmd = program
    .command('create')
    .description('create a sandbox; returns once a command has executed inside it')
    .option('--image <name>', 'image to start from (busybox is built in)', 'busybox')
    .option('--name <name>', 'a name for the sandbox (default: generated)')
    .option('--storage <kind>', 'btrfs, overlay or dir (default: the best that works here)')
    .option('--driver <name>', 'machine driver', 'namespaces')
    .option('--no-userns', 'no user namespace: root inside is root on the host (warned about, shown in ls)')
    .option(
      '--init <init>',
      "systemd: the image's own systemd boots (create returns once it is up; the default for images whose /sbin/init is systemd); agent: the agent is PID 1",
    )
    .option('--json', 'print the sandbox as JSON');
  addLimitOptions(cmd);
  addTraceOption(cmd);
  cmd.action((o: CreateCli) =>
    withLab(o, async (lab) => {
      if (o.init !== undefined && o.init !== 'agent' && o.init !== 'systemd')
        throw new SnaplabError('BAD_INPUT', `unknown --init ${JSON.stringify(o.init)}`, 'agent or systemd');
      const box = await lab.create({
        image: o.image,
        name: o.name,
        storage: o.storage,
        driver: o.driver,
        limits: limitsFrom(o),
        userns: o.userns,
        init: o.init as 'agent' | 'systemd' | undefined,
      });
      // a system machine's trace ends with its boot: the units that took longest, as systemd measured them
      const blame =
        o.trace && box.info.init === 'systemd'
          ? (
              await box
                .exec(['systemd-analyze', 'blame', '--no-pager'])
                .catch(orElse(undefined, 'systemd-analyze blame'))
            )?.stdout
              .toString()
              .trim()
              .split('\n')
              .slice(0, 5)
          : undefined;
      box.close();
      warnHostRoot(box, !o.userns);
      if (o.json) printJson({ ...box.toJSON(), operation: box.lastTrace?.id, createMs: box.lastTrace?.totalMs });
      else {
        process.stdout.write(
          `created ${box.name} (${box.id}) on ${box.storage} in ${ms(box.lastTrace?.totalMs ?? 0)}${box.info.init === 'systemd' ? ` (systemd ${box.info.reason ?? 'running'})` : ''}\n`,
        );
      }
      showTrace(o, box.lastTrace);
      if (blame?.length)
        process.stderr.write(
          `slowest units (systemd-analyze blame):\n${blame.map((l) => `  ${l.trim()}`).join('\n')}\n`,
        );
    }),
  );
}

export function registerRestore(program: Command): void {
  const cmd = program
    .command('restore <snapshot>')
    .description("start a new sandbox whose filesystem is the snapshot's")
    .option('--name <name>', 'a name for the new sandbox')
    .option('--no-userns', 'no user namespace: root inside is root on the host (warned about, shown in ls)')
    .option('--json', 'print the sandbox as JSON');
  addLimitOptions(cmd);
  addTraceOption(cmd);
  cmd.action((snapshot: string, o: CommonOptions & LimitOptions & { name?: string; userns: boolean }) =>
    withLab(o, async (lab) => {
      const limits = limitsFrom(o);
      const box = await lab.restore(snapshot, {
        name: o.name,
        limits: Object.keys(limits).length ? limits : undefined,
        userns: o.userns,
      });
      box.close();
      warnHostRoot(box, !o.userns);
      if (o.json) printJson({ ...box.toJSON(), operation: box.lastTrace?.id, restoreMs: box.lastTrace?.totalMs });
      else
        process.stdout.write(`restored ${snapshot} as ${box.name} (${box.id}) in ${ms(box.lastTrace?.totalMs ?? 0)}\n`);
      showTrace(o, box.lastTrace);
    }),
  );
}
