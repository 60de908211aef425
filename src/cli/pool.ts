import { addEgressFlags, egressFrom, type EgressFlags } from './egress.js';
import type { Command } from 'commander';
import { parsePositiveInt } from '../lab/sizes.js';
import { DEFAULT_DRIVER, DEFAULT_IMAGE, DEFAULT_POOL_SIZE } from '../defaults.js';
import { DRIVER_NAMES } from '../drivers/registry.js';
import { SnaplabError } from '../errors.js';
import type { StorageKind } from '../storage/backend.js';
import type { PoolWarm } from '../store/records.js';
import { withLab, type CommonOptions } from './common.js';
import { addLimitOptions, limitsFrom, type LimitOptions } from './limits.js';
import { printJson, printTable } from './output.js';
import { noted } from '../cleanup.js';

function parseSize(v: string): number {
  if (v === '0') return 0;
  return parsePositiveInt(v, 'pool size');
}

const progress =
  (o: CommonOptions) =>
  (ready: number, target: number): void => {
    if (!o.json) process.stderr.write(`… ${ready}/${target} standbys ready\n`);
  };

export function registerPool(program: Command): void {
  const pool = program
    .command('pool')
    .description('pools of paused standbys: a fresh sandbox per execution, without waiting for a raise');

  registerPoolCreate(pool);
  registerPoolLs(pool);
  registerPoolResize(pool);
  registerPoolRm(pool);
  registerPoolServe(pool);
}

function registerPoolCreate(pool: Command): void {
  const create = pool
    .command('create <name>')
    .description('define a pool and raise its standbys (paused: an idle pool uses no CPU)')
    .option('--image <name>', 'image of every standby', DEFAULT_IMAGE)
    .option('--size <n>', 'standbys to keep ready', String(DEFAULT_POOL_SIZE))
    .option('--storage <kind>', 'btrfs, overlay or dir (default: the best that works here)')
    .option(
      '--driver <name>',
      `${DRIVER_NAMES.join(' or ')}; with qemu, standbys are paused VMs restored from a memory snapshot of one booted VM`,
      DEFAULT_DRIVER,
    )
    .option(
      '--no-recycle',
      'never give a used sandbox back to the pool, even when it is clean (VM standbys are never recycled)',
    )
    .option('--no-userns', 'standbys without a user namespace: root inside is root on the host')
    .option(
      '--warm <what>',
      "start it in each standby before it waits: `interpreter` (the code interpreter's server and kernel; such standbys are not recycled)",
    )
    .option('--json', 'print JSON');
  addLimitOptions(create);
  addEgressFlags(create);
  create.action(
    (
      name: string,
      o: CommonOptions &
        LimitOptions &
        EgressFlags & {
          image: string;
          size: string;
          storage?: StorageKind;
          recycle: boolean;
          driver: string;
          userns: boolean;
          warm?: string;
        },
    ) =>
      withLab(o, async (lab) => {
        const p = await lab.createPool(
          {
            name,
            image: o.image,
            size: parseSize(o.size),
            limits: limitsFrom(o),
            storage: o.storage,
            recycle: o.recycle ? undefined : false,
            driver: o.driver,
            userns: o.userns ? undefined : false,
            ...(egressFrom(o) ? { egress: egressFrom(o) } : {}),
            ...(o.warm === undefined ? {} : { warm: o.warm as PoolWarm }),
          },
          progress(o),
        );
        const s = await p.stats();
        if (o.json) printJson(s);
        else
          process.stdout.write(
            `pool ${name}: ${s.ready} standbys ready (${s.storage}); keep it filled with \`snaplab pool serve ${name}\`\n`,
          );
      }),
  );
}

function registerPoolLs(pool: Command): void {
  pool
    .command('ls')
    .description('list pools: target, ready, in use, and hits, misses, recycled, refused dirty, leaks')
    .option('--json', 'print JSON')
    .action((o: CommonOptions) =>
      withLab(o, async (lab) => {
        const all = await lab.pools();
        if (o.json) return printJson(all);
        printTable(
          [
            'POOL',
            'IMAGE',
            'STORAGE',
            'DRIVER',
            'WARM',
            'TARGET',
            'READY',
            'IN USE',
            'RAISING',
            'HITS',
            'MISSES',
            'RECYCLED',
            'REFUSED-DIRTY',
            'LEAKS',
          ],
          all.map((p) => [
            p.name,
            p.image,
            p.storage,
            p.driver,
            p.warm ?? '-',
            p.target,
            p.ready,
            p.inUse,
            p.raising,
            p.hits,
            p.misses,
            p.recycled,
            p.refusedDirty,
            p.leaks,
          ]),
        );
      }),
    );
}

function registerPoolResize(pool: Command): void {
  pool
    .command('resize <name> <size>')
    .description('change the target: shrinking removes paused standbys now, growing raises them now')
    .option('--json', 'print JSON')
    .action((name: string, size: string, o: CommonOptions) =>
      withLab(o, async (lab) => {
        const p = lab.pool(name);
        await p.resize(parseSize(size), progress(o));
        const s = await p.stats();
        if (o.json) printJson(s);
        else process.stdout.write(`pool ${name}: target ${s.target}, ${s.ready} ready\n`);
      }),
    );
}

function registerPoolRm(pool: Command): void {
  pool
    .command('rm <names...>')
    .description('destroy the standbys and forget the pool')
    .option('--json', 'print JSON')
    .action((names: string[], o: CommonOptions) =>
      withLab(o, async (lab) => {
        const out: Record<string, number> = {};
        for (const n of names) out[n] = await lab.pool(n).remove();
        if (o.json) printJson({ removed: out });
        else
          for (const [n, c] of Object.entries(out))
            process.stdout.write(`removed pool ${n} (${c} standbys destroyed)\n`);
      }),
    );
}

function registerPoolServe(pool: Command): void {
  pool
    .command('serve <name>')
    .description('hold the pool in the foreground: keep it at its target until interrupted (Ctrl-C)')
    .option('--json', 'status lines as JSON')
    .action((name: string, o: CommonOptions) =>
      withLab(o, async (lab) => {
        const p = lab.pool(name);
        p.start();
        let last = '';
        const report = async (): Promise<void> => {
          const s = await p.stats();
          const line = o.json
            ? JSON.stringify(s)
            : `pool ${name}: ready ${s.ready}/${s.target}, in use ${s.inUse}, raising ${s.raising}, hits ${s.hits}, misses ${s.misses}, recycled ${s.recycled}, refused-dirty ${s.refusedDirty}, leaks ${s.leaks}`;
          if (line !== last) process.stdout.write(`${line}\n`);
          last = line;
          const err = p.takeRefillErrors().at(-1);
          if (err) process.stderr.write(`refill failed: ${err}\n`);
        };
        await new Promise<void>((resolve) => {
          const timer = setInterval(() => void report().catch(noted(`report pool ${name}`)), 1000);
          const stop = (): void => {
            clearInterval(timer);
            resolve();
          };
          process.once('SIGINT', stop);
          process.once('SIGTERM', stop);
        });
        await p.stop();
        if (!o.json) process.stdout.write(`stopped holding ${name}; its standbys stay paused\n`);
      }),
    );
}

export function badPoolArgs(): SnaplabError {
  return new SnaplabError(
    'BAD_INPUT',
    'give --pool NAME or --image NAME, not both',
    'snaplab run --pool NAME -- argv (or --image busybox)',
  );
}
