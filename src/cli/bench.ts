import type { Command } from 'commander';
import { addBenchOptions, spreadCompare, toPlan, type BenchCli } from '../bench/options.js';
import { DEFAULT_DRIVER } from '../defaults.js';
import { findDriverInfo } from '../drivers/registry.js';
import { cliPlan } from '../bench/cli-plan.js';
import { interruptible, withLab } from './common.js';
import { DEFAULT_PARALLEL, PARALLEL_MAX } from '../sdk/bulk.js';
import { printJson } from './output.js';
import type { Lab } from '../sdk/lab.js';
import { SnaplabError } from '../errors.js';

/**
 * The density workload: Ctrl-C (or SIGTERM, SIGHUP) stops it between steps, and it removes every
 * machine it made before it exits.
 */
async function densityCommand(o: BenchCli): Promise<void> {
  const [{ densityBench, parseCounts, renderDensitySummary, writeDensityResults }, { Progress }, sizes, results] =
    await Promise.all([
      import('../bench/density-bench.js'),
      import('../bench/progress.js'),
      import('../lab/sizes.js'),
      import('../bench/results.js'),
    ]);
  const opts = {
    counts: parseCounts(o.counts ?? '0,100'),
    samples: o.count === undefined ? 20 : sizes.parsePositiveInt(o.count, 'count'),
    // the library's own bulk create, as `create --count` runs it
    concurrency: o.concurrency === undefined ? DEFAULT_PARALLEL : sizes.parsePositiveInt(o.concurrency, 'concurrency'),
  };
  if (opts.concurrency > PARALLEL_MAX)
    throw new SnaplabError(
      'BAD_INPUT',
      `--concurrency ${opts.concurrency}`,
      `at most ${PARALLEL_MAX} creates in flight`,
    );
  const dir = o.results ? results.prepareResultsDir(o.results) : undefined;
  const summary = await interruptible(
    {
      first: "interrupted: removing the bench's machines",
      still: "still removing the bench's machines",
      left: "the bench's machines may be left in its home (/tmp/snaplab-bench-density-*): `SNAPLAB_HOME=DIR snaplab rm --all`, then `snaplab gc` there",
      error: new SnaplabError(
        'ABORTED',
        'the density bench was interrupted',
        'its machines were removed; run it again',
      ),
    },
    (signal) => densityBench(opts, new Progress(process.stderr), signal),
  );
  const written = dir ? writeDensityResults(dir, summary) : [];
  if (o.json) printJson(summary);
  else process.stdout.write(`${renderDensitySummary(summary)}\n`);
  if (written.length) process.stderr.write(`results: ${written.join(', ')}\n`);
}

/** The egress workload (docs/egress.md). */
async function egressCommand(lab: Lab, o: BenchCli): Promise<void> {
  const [{ egressBench, renderEgressSummary }, { Progress }, { parsePositiveInt }] = await Promise.all([
    import('../bench/egress-bench.js'),
    import('../bench/progress.js'),
    import('../lab/sizes.js'),
  ]);
  const summary = await egressBench(
    lab,
    { rounds: parsePositiveInt(o.reps, 'reps'), raises: 10, mib: 1024, connects: 200 },
    new Progress(process.stderr),
  );
  if (o.json) printJson(summary);
  else process.stdout.write(`${renderEgressSummary(summary)}\n`);
}

export function registerBench(program: Command): void {
  const cmd = program
    .command('bench [argv...]')
    .description('climb a concurrency ladder for a lifecycle workload, with same-run baselines (floor, slope, peak)');
  addBenchOptions(cmd);
  const parseOptions = cmd.parseOptions.bind(cmd); // `--compare 'A' 'B'` gives one option two values: spread first
  cmd.parseOptions = (args: string[]) => parseOptions(spreadCompare(args));
  cmd.action((argv: string[], o: BenchCli) =>
    withLab(o, async (lab) => {
      if (o.workload === 'image-import') {
        const [{ imageBench, renderImageSummary }, { Progress }, { parsePositiveInt }] = await Promise.all([
          import('../bench/image-bench.js'),
          import('../bench/progress.js'),
          import('../lab/sizes.js'),
        ]);
        const summary = await imageBench(lab, parsePositiveInt(o.reps, 'reps'), new Progress(process.stderr));
        if (o.json) printJson(summary);
        else process.stdout.write(`${renderImageSummary(summary)}\n`);
        return;
      }
      if (o.workload === 'interactive') {
        const [{ interactiveBench, renderInteractiveSummary }, { Progress }, { parsePositiveInt }] = await Promise.all([
          import('../bench/interactive-bench.js'),
          import('../bench/progress.js'),
          import('../lab/sizes.js'),
        ]);
        const summary = await interactiveBench(
          lab,
          {
            driver: o.driver ?? DEFAULT_DRIVER,
            rounds: parsePositiveInt(o.reps, 'reps'),
            keystrokes: 100,
            fileMiB: findDriverInfo(o.driver)?.capabilities.ownKernel ? 256 : 1024,
          },
          new Progress(process.stderr),
        );
        if (o.json) printJson(summary);
        else process.stdout.write(`${renderInteractiveSummary(summary)}\n`);
        return;
      }
      if (o.workload === 'egress') return egressCommand(lab, o);
      if (o.workload === 'density') return densityCommand(o);
      if (o.workload === 'cli') {
        const explicit = (k: keyof BenchCli): boolean => cmd.getOptionValueSource(k) === 'cli';
        const plan = cliPlan(o, argv, explicit);
        const [{ cliBench, renderCliSummary }, { Progress }] = await Promise.all([
          import('../bench/cli-bench.js'),
          import('../bench/progress.js'),
        ]);
        const summary = await cliBench(lab, plan, new Progress(process.stderr));
        if (plan.json) printJson(summary);
        else process.stdout.write(`${renderCliSummary(summary)}\n`);
        return;
      }
      const [{ hostLimits }, { Progress }, { renderSummary }, { prepareResultsDir, writeResults }, { runBench }] =
        await Promise.all([
          import('../bench/host-limits.js'),
          import('../bench/progress.js'),
          import('../bench/report-text.js'),
          import('../bench/results.js'),
          import('../bench/run-bench.js'),
        ]);
      const plan = toPlan(
        o,
        argv,
        (k) => o[k] !== undefined && cmd.getOptionValueSource(k) === 'cli',
        findDriverInfo(o.driver)?.capabilities.ownKernel ? await hostLimits(lab.home) : undefined,
      );
      const results = plan.results ? prepareResultsDir(plan.results) : undefined;
      const summary = await runBench(lab, plan, new Progress(process.stderr));
      const written = results ? writeResults(results, summary) : [];
      if (plan.json) printJson(summary);
      else process.stdout.write(`${renderSummary(summary)}\n`);
      if (written.length) process.stderr.write(`results: ${written.join(', ')}\n`);
    }),
  );
}
