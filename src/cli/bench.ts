import type { Command } from 'commander';
import { bareSpawn, runWorkload, WORKLOADS, type BenchSettings, type Workload } from '../bench/workloads.js';
import { renderSummary, toBaseline, toRung, type BenchSummary } from '../bench/summary.js';
import { SnaplabError } from '../errors.js';
import { parsePositiveInt, parseSeconds, parseSize } from '../lab/sizes.js';
import type { StorageKind } from '../storage/backend.js';
import { withLab, type CommonOptions } from './common.js';
import { printJson } from './output.js';

interface BenchCli extends CommonOptions {
  workload: string;
  concurrency: string;
  duration: string;
  count?: string;
  storage?: StorageKind;
  fill?: string;
}

export function registerBench(program: Command): void {
  program
    .command('bench [argv...]')
    .description('measure a lifecycle workload with the bare-host baseline from the same run')
    .option('--workload <name>', `one of ${WORKLOADS.join(', ')}`, 'exec')
    .option('--concurrency <n>', 'operations in flight at once', '8')
    .option('--duration <seconds>', 'how long to run each measurement', '3')
    .option('--count <n>', 'stop after this many operations (whichever comes first)')
    .option('--storage <kind>', 'btrfs, overlay or dir (default: the best that works here)')
    .option('--fill <sizes>', 'snapshot workload: data written into the sandbox first, e.g. 1M,1G (one series each)')
    .option('--json', 'print the summary as JSON')
    .action((argv: string[], o: BenchCli) =>
      withLab(o, async (lab) => {
        if (!(WORKLOADS as readonly string[]).includes(o.workload)) {
          throw new SnaplabError('BAD_INPUT', `unknown workload ${JSON.stringify(o.workload)}`, `use one of: ${WORKLOADS.join(', ')}`);
        }
        const w = o.workload as Workload;
        const fills = o.fill ? o.fill.split(',').map((f) => parseSize(f, 'fill size')) : [undefined];
        if (o.fill && w !== 'snapshot') throw new SnaplabError('BAD_INPUT', '--fill applies to the snapshot workload only', 'drop --fill or use --workload snapshot');
        const base: BenchSettings = {
          concurrency: parsePositiveInt(o.concurrency, 'concurrency'),
          durationMs: parseSeconds(o.duration, 'duration'),
          count: o.count === undefined ? undefined : parsePositiveInt(o.count, 'count'),
          storage: o.storage ?? (await lab.context.defaultStorage()),
          argv: argv.length ? argv : ['/bin/true'],
        };
        const progress = (s: string): void => {
          if (!o.json) process.stderr.write(`… ${s}\n`);
        };
        const summary: BenchSummary = { workload: w, storage: base.storage, argv: base.argv, startedAt: new Date().toISOString(), rungs: [], baselines: [], ratios: {} };
        const series: { fillBytes: number | undefined; latencyMs: unknown }[] = [];
        for (const fillBytes of fills) {
          progress(`${w} at concurrency ${base.concurrency}${fillBytes ? ` with ${fillBytes} bytes filled` : ''}`);
          const rung = toRung(base.concurrency, await runWorkload(lab, w, { ...base, fillBytes }));
          if (summary.rungs.length === 0) summary.rungs.push(rung);
          series.push({ fillBytes, latencyMs: rung.latencyMs });
        }
        progress(`baseline bare-spawn of ${base.argv.join(' ')} at concurrency ${base.concurrency}`);
        summary.baselines.push({ ...toBaseline('bare-spawn', await bareSpawn(base)), note: 'node child_process.spawn on the host' });
        const first = summary.rungs[0]!;
        const bare = summary.baselines[0]!;
        if (w === 'exec' && bare.throughput) summary.ratios['exec/bare-spawn throughput'] = Math.round((first.throughput / bare.throughput) * 100) / 100;
        if (w === 'raise' && bare.latencyMs) summary.ratios['raise/bare-spawn p50 latency'] = Math.round((first.latencyMs.p50 / bare.latencyMs.p50) * 10) / 10;
        if (series.length > 1) {
          summary.extra = { fills: series };
          const a = series[0]!.latencyMs as { p50: number };
          const b = series[series.length - 1]!.latencyMs as { p50: number };
          summary.ratios['snapshot p50 largest/smallest fill'] = Math.round((b.p50 / a.p50) * 100) / 100;
        }
        if (o.json) printJson(summary);
        else process.stdout.write(`${renderSummary(summary)}\n`);
      }),
    );
}
