import {
  BUILTIN_IMAGE,
  DAEMON_DEFAULTS,
  DEFAULT_DRIVER,
  DEFAULT_IMAGE,
  DEFAULT_ON_TIMEOUT,
  ON_TIMEOUT_ACTIONS,
} from '../defaults.js';
import { SnaplabError } from '../errors.js';
import type { Command } from 'commander';
import { keyValues } from '../lab/io/exec.js';
import type { LabApi, LabCreateOptions, SandboxApi } from '../sdk/api.js';
import { createMany, LeftError, PARALLEL_MAX } from '../sdk/bulk.js';
import { parsePositiveInt } from '../lab/sizes.js';
import type { StorageKind } from '../storage/backend.js';
import { addTraceOption, interruptible, showTrace, withApi, type CommonOptions, collect } from './common.js';
import { addLimitOptions, limitsFrom, type LimitOptions } from './limits.js';
import { ms, printJson } from './output.js';
import { orElse } from '../cleanup.js';
import { TEMPLATES } from '../image/templates.js';
import { addEgressFlags, egressFrom, type EgressFlags } from './egress.js';

interface CreateCli extends CommonOptions, LimitOptions, EgressFlags {
  image?: string;
  name?: string;
  storage?: StorageKind;
  driver?: string;
  userns: boolean;
  ids?: string;
  init?: string;
  pool?: string;
  label: string[];
  timeout?: string;
  onTimeout: string;
  count?: string;
  parallel?: string;
}

/** Said every time a sandbox runs as host root: --no-userns, or storage that cannot idmap yet. */
export function warnHostRoot(box: { name: string; hostRoot: boolean }, asked: boolean): void {
  if (!box.hostRoot) return;
  const why = asked ? '--no-userns' : 'not available here';
  process.stderr.write(
    `warning: ${box.name} has no user namespace (${why}): root inside is root on the host, held back only by the capability set and the seccomp filter\n`,
  );
}

/**
 * The sandbox on stdout (its name, or --json), so that `name=$(snaplab create)` works; what it
 * took on stderr, when the lab timed it here (a daemon keeps its traces: `snaplab trace`).
 */
function printMade(box: SandboxApi, o: CommonOptions, verb: string): void {
  const t = box.lastTrace;
  if (o.json) printJson({ ...box.toJSON(), ...(t ? { operation: t.id, [`${verb}Ms`]: t.totalMs } : {}) });
  else process.stdout.write(`${box.name}\n`);
  if (t && !o.json) {
    const systemd = box.init === 'systemd' ? ` (systemd ${box.reason ?? 'running'})` : '';
    const from = box.origin ? ` from ${box.origin}` : '';
    process.stderr.write(`${verb}d ${box.name} (${box.id})${from} on ${box.storage} in ${ms(t.totalMs)}${systemd}\n`);
  }
  showTrace(o, t);
}

/** --ids N: checked with the rest of a create's options (resolveCreate), as a number */
const idsFrom = (o: { ids?: string }): { ids?: number } => (o.ids === undefined ? {} : { ids: Number(o.ids) });

function createOptions(o: CreateCli): LabCreateOptions {
  if (o.init !== undefined && o.init !== 'agent' && o.init !== 'systemd')
    throw new SnaplabError('BAD_INPUT', `unknown --init ${JSON.stringify(o.init)}`, 'agent or systemd');
  const onTimeout = ON_TIMEOUT_ACTIONS.find((a) => a === o.onTimeout);
  if (!onTimeout)
    throw new SnaplabError('BAD_INPUT', `unknown --on-timeout ${JSON.stringify(o.onTimeout)}`, 'kill, pause or stop');
  const limits = limitsFrom(o);
  const egress = egressFrom(o);
  const common: LabCreateOptions = {
    labels: keyValues(o.label, 'label', { unique: true }),
    ...(o.timeout !== undefined ? { timeoutS: Number(o.timeout) } : {}),
    onTimeout,
  };
  // `--pool=` (empty) is no pool; a standby comes with the pool's image, storage, driver and limits
  if (o.pool) return { ...common, pool: o.pool };
  return {
    ...common,
    image: o.image,
    name: o.name,
    storage: o.storage,
    driver: o.driver,
    ...(Object.keys(limits).length ? { limits } : {}),
    ...(o.userns ? {} : { userns: false }),
    ...idsFrom(o),
    ...(o.init ? { init: o.init } : {}),
    ...(egress ? { egress } : {}),
  };
}

/** `create --count N`: the SDK's createMany, interruptible, its names on stdout one a line. */
async function createCounted(lab: LabApi, o: CreateCli): Promise<void> {
  const count = parsePositiveInt(o.count!, '--count');
  const parallel = o.parallel === undefined ? undefined : parsePositiveInt(o.parallel, '--parallel');
  if (o.trace) throw new SnaplabError('BAD_INPUT', '--trace shows one create', '`snaplab trace` lists every one made');
  const t0 = performance.now();
  const boxes = await interruptible(BULK_STOP, (signal) =>
    createMany(lab, count, createOptions(o), {
      ...(parallel ? { parallel } : {}),
      signal,
      ...(o.json
        ? {}
        : { onProgress: (p) => void process.stderr.write(`… ${p.done}/${p.total} created (${p.perSecond}/s)\n`) }),
    }),
  ).catch((e: unknown) => {
    // what it made and could not remove, each by name on stdout as the made ones are (JSON: the error's `left`)
    if (e instanceof LeftError && !o.json) process.stdout.write(e.left.map((n) => `${n}\n`).join(''));
    throw e;
  });
  const seconds = (performance.now() - t0) / 1000;
  if (boxes[0]) warnHostRoot(boxes[0], !o.userns);
  if (o.json) return printJson(boxes.map((b) => b.toJSON()));
  process.stdout.write(boxes.map((b) => `${b.name}\n`).join(''));
  process.stderr.write(
    `created ${boxes.length} in ${seconds.toFixed(1)} s (${(boxes.length / seconds).toFixed(1)}/s)\n`,
  );
}

const BULK_STOP = {
  still: 'still removing the sandboxes made',
  left: 'some it made may be left, and creates under way may finish: `snaplab ls` shows them, `snaplab rm` removes them',
  error: new SnaplabError('ABORTED', 'the create was interrupted', 'the sandboxes it made were removed; run it again'),
};

export function registerCreate(program: Command): void {
  const cmd = program
    .command('create')
    .description('create a sandbox; returns once a command has executed inside it')
    .option(
      '--image <name>',
      `image to start from (${BUILTIN_IMAGE} is built in; ${TEMPLATES.map((t) => t.name).join(' and ')} are built on first use; default ${DEFAULT_IMAGE})`,
    )
    .option('--name <name>', 'a name for the sandbox (default: generated)')
    .option('--storage <kind>', 'btrfs, overlay or dir (default: the best that works here)')
    .option('--driver <name>', `machine driver (default ${DEFAULT_DRIVER})`)
    .option('--no-userns', 'no user namespace: root inside is root on the host (warned about, shown in ls)')
    .option(
      '--ids <n>',
      'ids in its user namespace, a power of two from 1024 to 65536 (default); ids on disk beyond show as nobody inside',
    )
    .option(
      '--init <init>',
      "systemd: the image's own systemd boots (create returns once it is up; the default for images whose /sbin/init is systemd); agent: the agent is PID 1",
    )
    .option('--pool <name>', 'take a ready standby of this pool')
    .option('--label <k=v>', 'a label (repeatable)', collect, [])
    .option(
      '--timeout <s>',
      `its TTL in seconds (0: none; through a daemon, default the daemon's: ${DAEMON_DEFAULTS.defaultTimeoutS} unless its --default-timeout says)`,
    )
    .option(
      '--on-timeout <what>',
      'at the end of its TTL: kill (destroy it), pause (freeze it, memory kept: resume) or stop (its processes end, its files are kept: start)',
      DEFAULT_ON_TIMEOUT,
    )
    .option(
      '--count <n>',
      'make n alike, --parallel at a time, with progress on stderr; --name is then a prefix (NAME-1 …); one failure removes them all',
    )
    .option('--parallel <n>', `with --count: creates in flight, up to ${PARALLEL_MAX} (default 8)`)
    .option('--json', 'print the sandbox as JSON (with --count: an array)');
  addLimitOptions(cmd);
  addEgressFlags(cmd);
  addTraceOption(cmd);
  cmd.action((o: CreateCli) =>
    withApi(o, async (lab) => {
      if (o.count !== undefined) return createCounted(lab, o);
      if (o.parallel !== undefined)
        throw new SnaplabError('BAD_INPUT', '--parallel is for --count', 'add --count N, or leave --parallel out');
      // a built-in template built on first use takes a minute or more: its steps on stderr
      const onProgress = (s: string): void => void process.stderr.write(`… ${s}\n`);
      const box = await lab.create({ ...createOptions(o), onProgress });
      // a system machine's trace ends with its boot: the units that took longest, as systemd measured them
      const blame =
        o.trace && box.init === 'systemd'
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
      printMade(box, o, 'create');
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
    .description("start a new sandbox whose filesystem is the snapshot's (and its limits, unless some are given)")
    .option('--name <name>', 'a name for the new sandbox')
    .option('--no-userns', 'no user namespace: root inside is root on the host (warned about, shown in ls)')
    .option('--ids <n>', "ids in its user namespace (default: as the snapshot's sandbox had; see create --ids)")
    .option('--json', 'print the sandbox as JSON');
  addLimitOptions(cmd);
  addEgressFlags(cmd);
  addTraceOption(cmd);
  type RestoreCli = CommonOptions & LimitOptions & EgressFlags & { name?: string; userns: boolean; ids?: string };
  cmd.action((snapshot: string, o: RestoreCli) =>
    withApi(o, async (lab) => {
      const limits = limitsFrom(o);
      const egress = egressFrom(o);
      const box = await lab.restore(snapshot, {
        name: o.name,
        limits: Object.keys(limits).length ? limits : undefined,
        ...(o.userns ? {} : { userns: false }),
        ...idsFrom(o),
        ...(egress ? { egress } : {}),
      });
      box.close();
      warnHostRoot(box, !o.userns);
      printMade(box, o, 'restore');
    }),
  );
}
