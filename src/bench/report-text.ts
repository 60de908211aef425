import type { BenchSummary, Rung } from './summary.js';

const n = (x: number | null | undefined, d = 1): string =>
  x === null || x === undefined || !Number.isFinite(x) ? '-' : x >= 100 ? x.toFixed(0) : x.toFixed(d);
const range = (r: Rung): string => (r.reps.length > 1 ? `${n(r.throughputRange.min)}–${n(r.throughputRange.max)}` : '');

/** Rows of the per-rung table, shared by the terminal and Markdown reports. */
export function rungRows(s: BenchSummary): { headers: string[]; rows: string[][] } {
  const bases = s.baselines.filter((b) => b.rungs?.length);
  const headers = [
    'concurrency',
    'throughput /s',
    'reps range',
    'p50 ms',
    'p90 ms',
    'p99 ms',
    'errors',
    ...bases.flatMap((b) => [`${b.name} /s`, `${b.name} p50`]),
  ];
  const rows = s.rungs.map((r) => [
    String(r.concurrency),
    n(r.throughput),
    range(r),
    n(r.latencyMs.p50, 2),
    n(r.latencyMs.p90, 2),
    n(r.latencyMs.p99, 2),
    String(r.errors),
    ...bases.flatMap((b) => {
      const br = b.rungs!.find((x) => x.concurrency === r.concurrency);
      return br ? [n(br.throughput), n(br.latencyMs.p50, 2)] : ['-', '-'];
    }),
  ]);
  return { headers, rows };
}

export function headline(s: BenchSummary): string {
  const set = s.settings;
  const how = set
    ? `; ladder ${set.ladder.join(',')} × ${set.reps} rep${set.reps > 1 ? 's' : ''} × ${set.durationMs / 1000} s`
    : '';
  return `workload ${s.workload}${s.storage ? ` on ${s.storage}` : ''}${s.argv ? ` (${s.argv.join(' ')})` : ''}${how}`;
}

export function fitLines(s: BenchSummary): string[] {
  const lines = [
    `floor ${n(s.floorMs, 2)} ms (p50 at concurrency ${s.rungs[0]?.concurrency ?? '-'}), slope ${s.slopeMsPerSlot === null ? '- (one rung)' : `${n(s.slopeMsPerSlot, 3)} ms/slot`}, peak ${n(s.peak.throughput)}/s at concurrency ${s.peak.concurrency}`,
  ];
  for (const b of s.baselines) {
    if (b.peak)
      lines.push(
        `baseline ${b.name}: floor ${n(b.floorMs, 2)} ms, slope ${b.slopeMsPerSlot == null ? '-' : `${n(b.slopeMsPerSlot, 3)} ms/slot`}, peak ${n(b.peak.throughput)}/s at concurrency ${b.peak.concurrency}${b.note ? ` (${b.note})` : ''}`,
      );
    else lines.push(`baseline ${b.name}: ${b.note ?? 'not measured'}`);
  }
  for (const [k, v] of Object.entries(s.ratios)) lines.push(`ratio ${k}: ${v}`);
  return lines;
}

export function compareLines(s: BenchSummary): string[] {
  const c = s.compare;
  if (!c) return [];
  const lines = [`compare A (${c.a.options}) vs B (${c.b.options}), throughput per rep:`];
  for (const r of c.rungs) {
    lines.push(
      `  concurrency ${r.concurrency}: A ${n(r.a.throughput)}/s [${r.a.throughputReps.join(', ')}] vs B ${n(r.b.throughput)}/s [${r.b.throughputReps.join(', ')}]: ${r.overlap ? 'reps overlap' : 'reps apart'} → ${r.verdict}`,
    );
  }
  lines.push(
    `  A: floor ${n(c.a.floorMs, 2)} ms, peak ${n(c.a.peak.throughput)}/s at ${c.a.peak.concurrency}; B: floor ${n(c.b.floorMs, 2)} ms, peak ${n(c.b.peak.throughput)}/s at ${c.b.peak.concurrency}`,
  );
  return lines;
}

/** Rows under headers, each column as wide as its widest cell. */
export function pad(headers: string[], rows: string[][]): string[] {
  const cells = [headers, ...rows];
  const w = headers.map((_, i) => Math.max(...cells.map((r) => (r[i] ?? '').length)));
  return cells.map((r) =>
    r
      .map((c, i) => c.padEnd(w[i]!))
      .join('  ')
      .trimEnd(),
  );
}

const phases = (p: Record<string, number>): string =>
  Object.entries(p)
    .map(([k, v]) => `${k} ${n(v, 2)}`)
    .join(', ');

/** The human summary on stdout. */
export function renderSummary(s: BenchSummary): string {
  const { headers, rows } = rungRows(s);
  const lines = [headline(s), ...pad(headers, rows).map((l) => `  ${l}`)];
  for (const r of s.rungs)
    if (Object.keys(r.phasesMs).length) lines.push(`  phases at ${r.concurrency} (median ms): ${phases(r.phasesMs)}`);
  lines.push(...fitLines(s), ...compareLines(s));
  if (s.extra)
    for (const [k, v] of Object.entries(s.extra)) if (k !== 'fills') lines.push(`${k}: ${JSON.stringify(v)}`);
  const fills = s.extra?.fills as { fillBytes?: number; latencyMs?: { p50: number } }[] | undefined;
  for (const f of fills ?? [])
    lines.push(
      `fill ${f.fillBytes ?? 0} bytes: p50 ${n(f.latencyMs?.p50, 2)} ms at concurrency ${s.rungs[0]?.concurrency}`,
    );
  for (const note of s.notes ?? []) lines.push(`note: ${note}`);
  return lines.join('\n');
}

export { phases as formatPhases, n as formatNumber };
