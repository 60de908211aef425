import { mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { SnaplabError } from '../errors.js';
import { renderMarkdown } from './report-md.js';
import { renderSvg } from './report-svg.js';
import type { BenchSummary } from './summary.js';

/**
 * Check the results directory before anything runs (a long ladder must not end in a write
 * error): it must be new or empty, so that one run's files are never mixed with another's.
 */
export function prepareResultsDir(dir: string): string {
  const abs = resolve(dir);
  let entries: string[] = [];
  try {
    entries = readdirSync(abs);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOTDIR')
      throw new SnaplabError('BAD_INPUT', `--results ${dir} is a file`, 'give a new directory', { cause: e });
    if (code !== 'ENOENT')
      throw new SnaplabError(
        'BAD_INPUT',
        `cannot read --results ${dir}: ${(e as Error).message}`,
        'give a directory you can write',
        { cause: e },
      );
  }
  if (entries.length)
    throw new SnaplabError(
      'BAD_INPUT',
      `--results ${dir} is not empty`,
      'give a new directory, or remove the old results first',
    );
  try {
    mkdirSync(abs, { recursive: true });
  } catch (e) {
    throw new SnaplabError(
      'BAD_INPUT',
      `cannot create --results ${dir}: ${(e as Error).message}`,
      'give a directory you can write',
      { cause: e },
    );
  }
  return abs;
}

/** The JSON of one rung: the workload's reps, B's when comparing, and every baseline's on that rung. */
export function rungFile(s: BenchSummary, concurrency: number): Record<string, unknown> {
  return {
    workload: s.workload,
    storage: s.storage,
    argv: s.argv,
    startedAt: s.startedAt,
    concurrency,
    rung: s.rungs.find((r) => r.concurrency === concurrency),
    ...(s.compare
      ? {
          compare: {
            a: s.compare.a.options,
            b: s.compare.b.options,
            ...s.compare.rungs.find((r) => r.concurrency === concurrency),
          },
        }
      : {}),
    baselines: s.baselines.flatMap((b) => {
      const r = b.rungs?.find((x) => x.concurrency === concurrency);
      return r ? [{ name: b.name, ...r }] : [];
    }),
  };
}

/** Write rung-<c>.json for every rung, summary.json, summary.md and chart.svg; returns the paths. */
export function writeResults(dir: string, s: BenchSummary): string[] {
  const files: [string, string][] = [
    ...s.rungs.map((r): [string, string] => [
      `rung-${r.concurrency}.json`,
      `${JSON.stringify(rungFile(s, r.concurrency), null, 2)}\n`,
    ]),
    ['summary.json', `${JSON.stringify(s, null, 2)}\n`],
    ['summary.md', renderMarkdown(s)],
    ['chart.svg', renderSvg(s)],
  ];
  mkdirSync(dir, { recursive: true });
  for (const [name, text] of files) writeFileSync(join(dir, name), text);
  return files.map(([name]) => join(dir, name));
}
