import { SnaplabError } from '../errors.js';
import { parsePositiveInt, parseSeconds } from '../lab/sizes.js';
import type { CliBenchPlan } from './cli-bench.js';
import type { BenchCli } from './options.js';

/** The options the cli workload takes (--reps rounds, --concurrency loops, --duration, --json); the rest are errors. */
export function cliPlan(o: BenchCli, argv: string[], explicit: (k: keyof BenchCli) => boolean): CliBenchPlan {
  const allowed: (keyof BenchCli)[] = ['workload', 'reps', 'concurrency', 'duration', 'json'];
  const extra = (Object.keys(o) as (keyof BenchCli)[]).filter((k) => explicit(k) && !allowed.includes(k));
  if (extra.length || argv.length) {
    const what = extra.length
      ? `--${extra[0]!.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`
      : `argv ${JSON.stringify(argv.join(' '))}`;
    throw new SnaplabError(
      'BAD_INPUT',
      `the cli workload does not take ${what}`,
      'it takes --reps (rounds), --concurrency (parallel shell loops, default 8), --duration and --json',
    );
  }
  return {
    rounds: parsePositiveInt(o.reps, 'reps'),
    loops: o.concurrency === undefined ? 8 : parsePositiveInt(o.concurrency, 'concurrency'),
    durationMs: parseSeconds(o.duration, 'duration'),
    json: !!o.json,
  };
}
