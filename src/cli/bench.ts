import { Command } from 'commander';
import { addBenchOptions, spreadCompare, toPlan, type BenchCli } from '../bench/options.js';
import { hostLimits } from '../bench/host-limits.js';
import { Progress } from '../bench/progress.js';
import { renderSummary } from '../bench/report-text.js';
import { prepareResultsDir, writeResults } from '../bench/results.js';
import { runBench } from '../bench/run-bench.js';
import { withLab } from './common.js';
import { printJson } from './output.js';

export function registerBench(program: Command): void {
  const cmd = program
    .command('bench [argv...]')
    .description('climb a concurrency ladder for a lifecycle workload, with same-run baselines (floor, slope, peak)');
  addBenchOptions(cmd);
  // `--compare 'A' 'B'` gives one option two values: spread them before commander parses
  const parseOptions = cmd.parseOptions.bind(cmd);
  cmd.parseOptions = (args: string[]) => parseOptions(spreadCompare(args));
  cmd.action((argv: string[], o: BenchCli) =>
    withLab(o, async (lab) => {
      const plan = toPlan(o, argv, (k) => o[k] !== undefined && cmd.getOptionValueSource(k) === 'cli', await hostLimits(lab.home));
      const results = plan.results ? prepareResultsDir(plan.results) : undefined;
      const summary = await runBench(lab, plan, new Progress(process.stderr));
      const written = results ? writeResults(results, summary) : [];
      if (plan.json) printJson(summary);
      else process.stdout.write(`${renderSummary(summary)}\n`);
      if (written.length) process.stderr.write(`results: ${written.join(', ')}\n`);
    }),
  );
}
