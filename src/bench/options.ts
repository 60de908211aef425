import { Command, CommanderError } from 'commander';
import { SnaplabError } from '../errors.js';
import { DRIVER_NAMES, driverInfo } from '../drivers/registry.js';
import { parsePositiveInt, parseSeconds, parseSize } from '../lab/sizes.js';
import type { StorageKind } from '../storage/backend.js';
import { BASELINES, RESTORE_BASELINES, SCENARIO_BASELINES, SYSTEM_BASELINES, type BaselineName } from './baselines.js';
import { SCENARIO_WORKLOADS, WORKLOADS, type Workload } from './workload-names.js';

/** The bench command's options as commander hands them over (strings, validated by `toPlan`). */
export interface BenchCli {
  workload: string;
  ladder?: string;
  concurrency?: string;
  reps: string;
  duration: string;
  count?: string;
  storage?: string;
  fill?: string;
  recycle?: string;
  poolSize?: string;
  userns?: string;
  egress?: string;
  init?: string;
  image?: string;
  baselines: string;
  scenario?: string;
  driver?: string;
  results?: string;
  compare?: string[];
  host?: string;
  json?: boolean;
  /** density: idle machines at each step */
  counts?: string;
}

/** What may differ between the two configurations of --compare. */
const COMPARABLE = ['storage', 'recycle', 'poolSize', 'fill', 'userns', 'egress', 'init', 'host'] as const;
export const DEFAULT_LADDER = [1, 2, 4, 8, 16, 32, 64];
const STORAGES: readonly StorageKind[] = ['btrfs', 'overlay', 'dir'];

/** The one definition of bench's options: the command and the --compare strings both parse with it. */
export function addBenchOptions(cmd: Command): Command {
  return cmd
    .option(
      '--workload <name>',
      `one of ${WORKLOADS.join(', ')}; or cli (whole snaplab processes as a shell runs them), or image-import (an OCI import beside tar -x), or interactive (keystroke echo, cp and port-forward throughput beside nsenter, cat and direct loopback), or egress (create with egress off and on, a download through it beside a veth, connection setup with 1 and 1000 rules), or density (the costs of one machine beside --counts idle ones)`,
      'exec',
    )
    .option(
      '--ladder <rungs>',
      `concurrency rungs, comma-separated (default ${DEFAULT_LADDER.join(',')}, cut to what the workload can run here: 1 for scenarios, the host's VM limit for --driver qemu)`,
    )
    .option(
      '--concurrency <n>',
      "shorthand for a one-rung ladder (density: creates in flight while filling, default 8, as the library's bulk create)",
    )
    .option('--counts <list>', 'density: idle machines at each step, e.g. 0,1000,5000,10000 (default 0,100)')
    .option('--reps <n>', 'repetitions of each rung', '3')
    .option('--duration <seconds>', 'length of each repetition', '2')
    .option('--count <n>', 'stop a repetition after this many operations (whichever comes first)')
    .option('--storage <kind>', 'btrfs, overlay or dir (default: the best that works here)')
    .option('--fill <sizes>', 'snapshot workload: data written into the sandbox first, e.g. 1M,1G (one series each)')
    .option('--recycle <on|off>', 'fresh-exec: reuse host resources that pass the clean check (default on)')
    .option('--pool-size <n>', 'fresh-exec: standbys kept warm')
    .option(
      '--userns <on|off>',
      'namespace sandboxes in a user namespace of their own (default on, where storage allows)',
    )
    .option('--egress <on|off>', 'raise, fresh-exec: machines with egress, no lists (default off; docs/egress.md)')
    .option(
      '--init <agent|systemd>',
      "raise, restore: systemd boots the image's own systemd (system machines; give --image)",
    )
    .option('--image <name>', 'raise, restore: the image machines are made from (default busybox)')
    .option(
      '--baselines <names>',
      `all, none, or some of ${BASELINES.join(',')} (scenario workloads: no-standby,down+up; raise --init systemd: nspawn)`,
      'all',
    )
    .option('--scenario <file>', 'scenario-up, scenario-reset: the scenario file')
    .option(
      '--driver <name>',
      'namespaces (default) or qemu (raise, exec, snapshot, restore, fresh-exec: a pool of paused VM restores)',
    )
    .option(
      '--host <url>',
      "exec, fresh-exec: through a daemon's API (http://HOST:PORT with SNAPLAB_TOKEN or http://KEY@HOST:PORT, or unix:/path/daemon.sock); `embedded`: in this process (the default), e.g. --compare '--host embedded' '--host unix:/var/lib/snaplab/daemon.sock'",
    )
    .option('--results <dir>', 'write rung-N.json, summary.json, summary.md and chart.svg into this new directory')
    .option(
      '--compare <options>',
      "two option strings run alternately: --compare 'A' 'B'",
      (v: string, prev: string[] = []) => [...prev, v],
    )
    .option('--json', 'print the summary as JSON (progress stays on stderr)');
}

/**
 * Commander gives an option one value; `--compare 'A' 'B'` has two. Rewrite it as
 * `--compare A --compare B` before parsing (never after a `--`, where argv begins).
 */
export function spreadCompare(args: string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const a = args[i]!;
    if (a === '--') return [...out, ...args.slice(i)];
    out.push(a);
    if (a === '--compare' && i + 2 < args.length && args[i + 2] !== '--compare' && args[i + 2] !== '--') {
      out.push(args[i + 1]!, '--compare', args[i + 2]!);
      i += 2;
    }
  }
  return out;
}

/** Split an option string the way a shell would (quotes and backslashes; no expansion). */
export function splitWords(text: string): string[] {
  const words: string[] = [];
  const re = /"((?:[^"\\]|\\.)*)"|'([^']*)'|\\(.)|(\s+)|([^\s"'\\]+)/gs;
  let cur: string | undefined;
  for (const m of text.matchAll(re)) {
    if (m[4] !== undefined) {
      if (cur !== undefined) words.push(cur);
      cur = undefined;
      continue;
    }
    cur = (cur ?? '') + (m[1]?.replace(/\\(.)/g, '$1') ?? m[2] ?? m[3] ?? m[5] ?? '');
  }
  if (cur !== undefined) words.push(cur);
  return words;
}

/** Parse one --compare string with the command's own options; unknown options are errors. */
export function parseCompare(text: string): Partial<BenchCli> {
  const cmd = addBenchOptions(new Command('compare'))
    .exitOverride()
    .configureOutput({ writeOut: () => undefined, writeErr: () => undefined, outputError: () => undefined })
    .action(() => undefined);
  try {
    cmd.parse(splitWords(text), { from: 'user' });
  } catch (e) {
    const msg = e instanceof CommanderError ? e.message.replace(/^error: /, '') : String(e);
    throw new SnaplabError(
      'BAD_INPUT',
      `--compare ${JSON.stringify(text)}: ${msg}`,
      `each --compare string holds bench options, e.g. --compare '--recycle on' '--recycle off'`,
      { cause: e },
    );
  }
  const given = Object.keys(cmd.opts()).filter((k) => cmd.getOptionValueSource(k) === 'cli');
  const bad = given.filter((k) => !(COMPARABLE as readonly string[]).includes(k));
  if (bad.length) {
    throw new SnaplabError(
      'BAD_INPUT',
      `--compare ${JSON.stringify(text)}: --${kebab(bad[0]!)} cannot differ between the compared configurations`,
      `compare only ${COMPARABLE.map((k) => `--${kebab(k)}`).join(', ')}`,
    );
  }
  return Object.fromEntries(given.map((k) => [k, cmd.opts()[k]]));
}

const kebab = (k: string): string => k.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);

/** One configuration of the workload (the only one, or A or B of a comparison). */
export interface Variant {
  label: string;
  options: string;
  storage?: StorageKind;
  recycle: boolean;
  poolSize?: number;
  /** false: --userns off */
  userns?: boolean;
  /** true: --egress on */
  egress?: boolean;
  /** --init: systemd (system machines) or agent (even for an image whose default is systemd) */
  init?: 'systemd' | 'agent';
  /** --host: the daemon the workload goes through (absent: embedded) */
  host?: string;
  fills: (number | undefined)[];
}

export interface BenchPlan {
  workload: Workload;
  ladder: number[];
  reps: number;
  durationMs: number;
  count?: number;
  argv: string[];
  baselines: BaselineName[];
  /** scenario workloads: the scenario file */
  scenario?: string;
  driver?: string;
  /** raise, restore: the image (default busybox) */
  image?: string;
  results?: string;
  json: boolean;
  variants: Variant[];
}

const bad = (message: string, hint: string): SnaplabError => new SnaplabError('BAD_INPUT', message, hint);

function variantOf(
  o: Partial<BenchCli>,
  w: Workload,
  label: string,
  options: string,
  explicit: (k: keyof BenchCli) => boolean,
): Variant {
  if (o.storage !== undefined && !STORAGES.includes(o.storage as StorageKind))
    throw bad(`unknown storage ${JSON.stringify(o.storage)}`, `use one of: ${STORAGES.join(', ')}`);
  if (o.recycle !== undefined && o.recycle !== 'on' && o.recycle !== 'off')
    throw bad(`invalid --recycle ${JSON.stringify(o.recycle)}`, 'use --recycle on or --recycle off');
  if (w !== 'fresh-exec' && (explicit('recycle') || explicit('poolSize')))
    throw bad(
      '--recycle and --pool-size apply to the fresh-exec workload only',
      'drop them or use --workload fresh-exec',
    );
  if (w !== 'snapshot' && explicit('fill'))
    throw bad('--fill applies to the snapshot workload only', 'drop --fill or use --workload snapshot');
  if (o.userns !== undefined && o.userns !== 'on' && o.userns !== 'off')
    throw bad(`invalid --userns ${JSON.stringify(o.userns)}`, 'use --userns on or --userns off');
  if (o.egress !== undefined && o.egress !== 'on' && o.egress !== 'off')
    throw bad(`invalid --egress ${JSON.stringify(o.egress)}`, 'use --egress on or --egress off');
  if (o.egress === 'on' && w !== 'raise' && w !== 'fresh-exec')
    throw bad('--egress applies to the raise and fresh-exec workloads', 'use --workload raise or fresh-exec');
  if (o.init !== undefined && o.init !== 'agent' && o.init !== 'systemd')
    throw bad(`invalid --init ${JSON.stringify(o.init)}`, 'use --init agent or --init systemd');
  if (o.init === 'systemd' && w !== 'raise' && w !== 'restore')
    throw bad('--init systemd applies to the raise and restore workloads', 'use --workload raise or restore');
  const host = o.host === undefined || o.host === 'embedded' ? undefined : o.host;
  if (host !== undefined && w !== 'exec' && w !== 'fresh-exec')
    throw bad('--host applies to the exec and fresh-exec workloads', 'use --workload exec or fresh-exec');
  // a key given in a URL (http://KEY@HOST:PORT) is used, never written into results
  const redact = (t: string): string => t.replace(/\/\/[^@/\s]+@/g, '//…@');
  return {
    label: redact(label),
    options: redact(options),
    storage: o.storage as StorageKind | undefined,
    recycle: o.recycle !== 'off',
    poolSize: o.poolSize === undefined ? undefined : parsePositiveInt(o.poolSize, 'pool size'),
    ...(o.userns === 'off' ? { userns: false } : {}),
    ...(o.egress === 'on' ? { egress: true } : {}),
    ...(o.init === 'systemd' || o.init === 'agent' ? { init: o.init } : {}),
    ...(host !== undefined ? { host } : {}),
    fills: o.fill ? o.fill.split(',').map((f) => parseSize(f, 'fill size')) : [undefined],
  };
}

function parseLadder(text: string): number[] {
  const rungs = text.split(',').map((t) => parsePositiveInt(t.trim(), 'ladder rung'));
  if (new Set(rungs).size !== rungs.length)
    throw bad(`ladder ${JSON.stringify(text)} repeats a rung`, 'give each concurrency once, e.g. 1,2,4,8');
  return rungs.sort((a, b) => a - b);
}

/** What this host can run at once, found by the caller (bench/host-limits.ts) before the plan is made. */
export interface HostLimits {
  /** VMs that may boot or restore at the same time (the VM workloads' highest rung), and why */
  vms: { max: number; why: string };
}
/** Workloads whose concurrency is that many VMs starting or running at once (exec: one VM). */
const VM_START_WORKLOADS: readonly Workload[] = ['raise', 'restore', 'fresh-exec']; // snapshot boots its VMs one by one, untimed

/**
 * The ladder: the given one, checked against what the workload can run here, or the default one
 * cut to it: the scenario workloads run one scenario at a time; the VM workloads stop at
 * `host.vms.max`.
 */
function ladderOf(o: BenchCli, w: Workload, host: HostLimits): number[] {
  if (o.ladder !== undefined && o.concurrency !== undefined)
    throw bad('--ladder and --concurrency both given', '--concurrency N is a one-rung --ladder N: give one of them');
  const given =
    o.ladder !== undefined
      ? parseLadder(o.ladder)
      : o.concurrency !== undefined
        ? [parsePositiveInt(o.concurrency, 'concurrency')]
        : undefined;
  const flag = o.ladder !== undefined ? `--ladder ${o.ladder}` : `--concurrency ${o.concurrency}`;
  let max = Infinity;
  let why = '';
  let hint = '';
  if ((SCENARIO_WORKLOADS as readonly string[]).includes(w)) {
    max = 1;
    why = `${w} runs one scenario at a time`;
    hint = 'use --ladder 1 (the default for this workload), or leave the ladder out';
  } else if (driverInfo(o.driver).capabilities.ownKernel && VM_START_WORKLOADS.includes(w)) {
    max = host.vms.max;
    why = host.vms.why;
    hint = `use rungs up to ${max} (the default ladder stops below it), or raise SNAPLAB_VM_BOOT_TIMEOUT_MS to allow slower boots`;
  }
  if (given === undefined) return DEFAULT_LADDER.filter((r) => r <= max);
  const over = given.filter((r) => r > max);
  if (over.length) throw bad(`${flag}: rung ${over.join(', ')} is more than this workload can run here: ${why}`, hint);
  return given;
}

/** Validate everything before anything runs: a bad value is an error, never silently ignored. */
export function toPlan(
  o: BenchCli,
  argv: string[],
  explicit: (k: keyof BenchCli) => boolean = (k) => o[k] !== undefined,
  host: HostLimits = { vms: { max: Infinity, why: '' } },
): BenchPlan {
  if (!(WORKLOADS as readonly string[]).includes(o.workload))
    throw bad(`unknown workload ${JSON.stringify(o.workload)}`, `use one of: ${WORKLOADS.join(', ')}`);
  const w = o.workload as Workload;
  if (o.counts !== undefined) throw bad('--counts applies to the density workload only', 'use --workload density');
  if (o.driver !== undefined && !DRIVER_NAMES.includes(o.driver))
    throw bad(`unknown driver ${JSON.stringify(o.driver)}`, `use ${DRIVER_NAMES.join(' or ')}`);
  const ladder = ladderOf(o, w, host);
  const scenarioWork = (SCENARIO_WORKLOADS as readonly string[]).includes(w);
  if (scenarioWork && !o.scenario)
    throw bad(
      `${w} needs a scenario file`,
      `snaplab bench --workload ${w} --scenario examples/scenarios/tiny-service/scenario.yaml`,
    );
  if (!scenarioWork && o.scenario !== undefined)
    throw bad(
      '--scenario applies to the scenario-up and scenario-reset workloads only',
      'drop --scenario or pick a scenario workload',
    );
  // a system machine's raise on namespaces: against systemd-nspawn booting the same tree
  const systemRaise = w === 'raise' && o.init === 'systemd' && !driverInfo(o.driver).capabilities.ownKernel;
  const known: readonly string[] = scenarioWork
    ? SCENARIO_BASELINES
    : w === 'restore'
      ? RESTORE_BASELINES
      : systemRaise
        ? SYSTEM_BASELINES
        : BASELINES;
  const names =
    o.baselines === 'all' ? [...known] : o.baselines === 'none' ? [] : o.baselines.split(',').map((n) => n.trim());
  for (const n of names)
    if (!known.includes(n))
      throw bad(`unknown baseline ${JSON.stringify(n)} for ${w}`, `use all, none, or some of ${known.join(',')}`);
  const compare = o.compare ?? [];
  if (compare.length !== 0 && compare.length !== 2)
    throw bad(
      `--compare takes two option strings, got ${compare.length}`,
      "e.g. --compare '--recycle on' '--recycle off'",
    );
  const owns = compare.map(parseCompare); // every string parsed (unknown options found) before any value is judged
  const variants = compare.length
    ? compare.map((text, i) => {
        const own = owns[i]!;
        return variantOf({ ...o, ...own }, w, i === 0 ? 'A' : 'B', text, (k) => explicit(k) || own[k] !== undefined);
      })
    : [variantOf(o, w, w, '', explicit)];
  if (driverInfo(o.driver).capabilities.memorySnapshot && w === 'fresh-exec') {
    if (o.recycle === 'on' || owns.some((x) => x.recycle === 'on'))
      throw bad('VM standbys are never recycled', 'drop --recycle: each execution gets a fresh restore');
    for (const v of variants) v.recycle = false;
  }
  if (variants.length === 2 && variants.some((v) => v.fills.length > 1))
    throw bad(
      '--fill with several sizes cannot be combined with --compare',
      'compare one fill size, or drop --compare',
    );
  return {
    workload: w,
    ladder,
    reps: parsePositiveInt(o.reps, 'reps'),
    durationMs: parseSeconds(o.duration, 'duration'),
    count: o.count === undefined ? undefined : parsePositiveInt(o.count, 'count'),
    argv: argv.length ? argv : ['/bin/true'],
    baselines: names as BaselineName[],
    ...(o.scenario !== undefined ? { scenario: o.scenario } : {}),
    ...(o.driver !== undefined ? { driver: o.driver } : {}),
    ...(o.image !== undefined ? { image: o.image } : {}),
    results: o.results,
    json: !!o.json,
    variants,
  };
}
