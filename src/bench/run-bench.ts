import { BUILTIN_IMAGE, DEFAULT_IMAGE } from '../defaults.js';
import { Lab } from '../sdk/lab.js';
import type { LabApi } from '../sdk/api.js';
import type { StorageKind } from '../storage/backend.js';
import { bareSpawn, lxcArm, rawNamespace, runcArm, type Arm, type LoopLimits } from './baselines.js';
import { fit, overlap, verdict } from './fit.js';
import { climb, type ArmOutcome } from './ladder.js';
import type { BenchPlan, Variant } from './options.js';
import type { Progress } from './progress.js';
import {
  compareSide,
  ratiosOf,
  toBaseline,
  toRung,
  type Baseline,
  type BenchSummary,
  type Compare,
  type Rung,
} from './summary.js';
import { runWorkload } from './workloads.js';
import { downUp, noStandby } from './scenario-bench.js';
import { bootArm } from './boot-baseline.js';
import { nspawnArm } from './nspawn-baseline.js';
import { noted } from '../cleanup.js';

/** The baselines asked for that work here, and a note for each one that does not. */
async function prepareBaselines(
  lab: Lab,
  plan: BenchPlan,
  lim: LoopLimits,
  progress: Progress,
): Promise<{ arms: Arm[]; skipped: Baseline[] }> {
  const arms: Arm[] = [];
  const skipped: Baseline[] = [];
  const rootfs = async (): Promise<string> => (await lab.image(BUILTIN_IMAGE)).path;
  for (const name of plan.baselines) {
    let arm: Arm | string;
    if (name === 'down+up')
      arm = downUp(lab, { ...lim, file: plan.scenario!, storage: plan.variants[0]!.storage, driver: plan.driver });
    else if (name === 'no-standby')
      arm = noStandby(lab, { ...lim, file: plan.scenario!, storage: plan.variants[0]!.storage, driver: plan.driver });
    else if (name === 'boot') {
      const v = plan.variants[0]!;
      arm = bootArm(lab, lim, {
        driver: plan.driver,
        storage: v.storage,
        image: plan.image,
        init: v.init,
        userns: v.userns,
      });
    } else if (name === 'nspawn') arm = await nspawnArm((await lab.image(plan.image ?? DEFAULT_IMAGE)).path, lim);
    else if (name === 'bare-spawn') arm = bareSpawn(plan.argv, lim);
    else if (name === 'raw-namespace') arm = rawNamespace(plan.argv, await rootfs(), lim);
    else if (name === 'runc') arm = await runcArm(plan.argv, await rootfs(), lim);
    else arm = await lxcArm(plan.argv, lim);
    if (typeof arm === 'string') {
      skipped.push({ name, note: `skipped: ${arm}` });
      progress.note(`baseline ${name} skipped: ${arm}`);
    } else arms.push(arm);
  }
  return { arms, skipped };
}

const rungsOf = (o: ArmOutcome, ladder: number[]): Rung[] =>
  ladder.filter((c) => o.byRung.has(c)).map((c) => toRung(c, o.byRung.get(c)!));

function compareOf(a: Variant, b: Variant, ra: Rung[], rb: Rung[]): Compare {
  return {
    a: { options: a.options, ...fit(ra) },
    b: { options: b.options, ...fit(rb) },
    rungs: ra.flatMap((x) => {
      const y = rb.find((r) => r.concurrency === x.concurrency);
      if (!y) return [];
      const ta = x.reps.map((r) => r.throughput);
      const tb = y.reps.map((r) => r.throughput);
      return [
        {
          concurrency: x.concurrency,
          a: compareSide(x),
          b: compareSide(y),
          overlap: overlap(ta, tb),
          verdict: verdict(ta, tb),
        },
      ];
    }),
  };
}

/**
 * Run the whole bench: every workload configuration (one, A and B of --compare, or one per
 * --fill size) and every baseline, alternately on each rung and rep; then fit and summarise.
 */
export async function runBench(lab: Lab, plan: BenchPlan, progress: Progress): Promise<BenchSummary> {
  const startedAt = new Date().toISOString();
  const defaultStorage: StorageKind = await lab.context.defaultStorage();
  const lim: LoopLimits = { durationMs: plan.durationMs, count: plan.count };
  const remotes = new Map<string, Promise<LabApi>>();
  const arms = workloadArms(plan, lim, defaultStorage, labOf(lab, remotes));
  const { arms: baseArms, skipped } = await prepareBaselines(lab, plan, lim, progress);
  let outcomes: ArmOutcome[];
  try {
    outcomes = await climb(
      [...arms, ...baseArms.map((a) => ({ ...a, optional: true }))],
      plan.ladder,
      plan.reps,
      progress,
    );
  } finally {
    for (const a of baseArms) await a.dispose?.().catch(noted('dispose of a baseline arm'));
    for (const r of remotes.values())
      void r.then(
        (l) => l.close(),
        () => undefined,
      );
    progress.done();
  }
  const work = outcomes.slice(0, arms.length).map((o) => rungsOf(o, plan.ladder));
  const baselines: Baseline[] = outcomes.slice(arms.length).map((o) => {
    const rs = rungsOf(o, plan.ladder);
    const note = o.failed ? `${o.note ? `${o.note}; ` : ''}failed: ${o.failed}` : o.note;
    return rs.length ? toBaseline(o.name, rs, note) : { name: o.name, note: note ?? 'no rung completed' };
  });
  baselines.push(...skipped);
  return summarise(plan, work, baselines, { startedAt, storage: plan.variants[0]!.storage ?? defaultStorage });
}

/** A variant with --host runs through that daemon (one connection pool per URL, for the whole bench). */
function labOf(lab: Lab, remotes: Map<string, Promise<LabApi>>): (v: Variant) => Promise<LabApi> {
  return (v) => {
    if (v.host === undefined) return Promise.resolve(lab);
    let r = remotes.get(v.host);
    if (!r) remotes.set(v.host, (r = Lab.connect({ url: v.host })));
    return r;
  };
}

/** The workload's arms: A and B of --compare, or one per --fill size. */
function workloadArms(
  plan: BenchPlan,
  lim: LoopLimits,
  defaultStorage: StorageKind,
  labFor: (v: Variant) => Promise<LabApi>,
): Arm[] {
  const workloadArm = (v: Variant, fillBytes: number | undefined, name: string): Arm => ({
    name,
    run: async (concurrency) =>
      runWorkload(await labFor(v), plan.workload, {
        concurrency,
        ...lim,
        storage: v.storage ?? defaultStorage,
        argv: plan.argv,
        fillBytes,
        recycle: v.recycle,
        poolSize: v.poolSize,
        scenario: plan.scenario,
        driver: plan.driver,
        userns: v.userns,
        egress: v.egress,
        init: v.init,
        image: plan.image,
      }),
  });
  const first = plan.variants[0]!;
  return plan.variants.length === 2
    ? plan.variants.map((v) => workloadArm(v, v.fills[0], `${plan.workload} ${v.label} (${v.options})`))
    : first.fills.map((f) => workloadArm(first, f, f === undefined ? plan.workload : `${plan.workload} fill ${f}`));
}

/** The summary: the first configuration's rungs and fit, the baselines, and a --compare or a --fill series. */
function summarise(
  plan: BenchPlan,
  work: Rung[][],
  baselines: Baseline[],
  run: { startedAt: string; storage: StorageKind },
): BenchSummary {
  const comparing = plan.variants.length === 2;
  const first = plan.variants[0]!;
  const rungs = work[0]!;
  const f = fit(rungs);
  const notes: string[] = [];
  const summary: BenchSummary = {
    workload: plan.workload,
    storage: run.storage,
    argv: plan.argv,
    startedAt: run.startedAt,
    finishedAt: new Date().toISOString(),
    settings: {
      ladder: plan.ladder,
      reps: plan.reps,
      durationMs: plan.durationMs,
      ...(plan.count ? { count: plan.count } : {}),
      ...(plan.driver ? { driver: plan.driver } : {}),
      ...(plan.workload === 'fresh-exec' && !comparing
        ? { recycle: first.recycle, ...(first.poolSize ? { poolSize: first.poolSize } : {}) }
        : {}),
    },
    rungs,
    ...f,
    baselines,
    ratios: ratiosOf({ workload: plan.workload, ...f, baselines }),
  };
  if (comparing) {
    summary.compare = compareOf(plan.variants[0]!, plan.variants[1]!, rungs, work[1]!);
    if (plan.reps < 2)
      notes.push('one rep per configuration: the spread is unknown, so every verdict is noise; use --reps 3');
  }
  if (first.fills.length > 1) addFillSeries(summary, first.fills, work);
  if (rungs.some((r) => r.errors > 0)) notes.push('some operations failed: see rungs[].reps[].firstError');
  if (notes.length) summary.notes = notes;
  return summary;
}

/** --fill with several sizes: each size's rungs, and how much slower the largest is than the smallest. */
function addFillSeries(summary: BenchSummary, fills: (number | undefined)[], work: Rung[][]): void {
  const series = fills.map((fillBytes, i) => ({
    fillBytes,
    latencyMs: work[i]![0]?.latencyMs,
    rungs: work[i]!,
  }));
  summary.extra = { fills: series };
  const a = series[0]!.latencyMs;
  const b = series[series.length - 1]!.latencyMs;
  if (a && b) summary.ratios['snapshot p50 largest/smallest fill'] = Math.round((b.p50 / a.p50) * 100) / 100;
}
