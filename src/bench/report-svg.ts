import type { BenchSummary } from './summary.js';

interface Point {
  concurrency: number;
  throughput: number;
  latencyMs: { p50: number; p99: number };
}

interface Series {
  name: string;
  color: string;
  rungs: Point[];
}

const COLORS = ['#1f6feb', '#d9480f', '#2b8a3e', '#7048e8', '#c2255c', '#495057'];
const W = 960;
const H = 440;
const PANEL = { w: 400, h: 300, top: 50, left: [70, 550] as const };

const esc = (s: string): string =>
  s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');

/** A round upper bound for an axis: 1, 2 or 5 × 10^k at or above max. */
function niceMax(max: number): number {
  if (!(max > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(max));
  return [1, 2, 5, 10].map((m) => m * p).find((v) => v >= max) ?? 10 * p;
}

function seriesOf(s: BenchSummary): Series[] {
  const out: Series[] = [
    { name: s.compare ? `${s.workload} A (${s.compare.a.options})` : s.workload, color: COLORS[0]!, rungs: s.rungs },
  ];
  if (s.compare) {
    const b = s.compare.rungs.map((r) => ({ concurrency: r.concurrency, ...r.b }));
    out.push({ name: `${s.workload} B (${s.compare.b.options})`, color: COLORS[1]!, rungs: b });
  }
  for (const base of s.baselines)
    if (base.rungs?.length)
      out.push({ name: base.name, color: COLORS[out.length % COLORS.length]!, rungs: base.rungs });
  return out;
}

/**
 * chart.svg: throughput (left) and p50/p99 latency (right, p99 dashed) against concurrency on a
 * log2 axis, the workload and every baseline. Hand-written SVG: no dependency.
 */
export function renderSvg(s: BenchSummary): string {
  const series = seriesOf(s);
  const cs = [...new Set(series.flatMap((x) => x.rungs.map((r) => r.concurrency)))].sort((a, b) => a - b);
  const lo = Math.log2(cs[0] ?? 1);
  const hi = Math.log2(cs[cs.length - 1] ?? 1);
  const x = (left: number, c: number): number =>
    left + (hi === lo ? PANEL.w / 2 : ((Math.log2(c) - lo) / (hi - lo)) * PANEL.w);
  const maxT = niceMax(Math.max(0, ...series.flatMap((x) => x.rungs.map((r) => r.throughput))));
  const maxL = niceMax(
    Math.max(0, ...series.flatMap((x) => x.rungs.map((r) => r.latencyMs.p99)).filter(Number.isFinite)),
  );
  const y = (v: number, max: number): number => PANEL.top + PANEL.h - (v / max) * PANEL.h;
  const el: string[] = [];
  const axes = (left: number, max: number, title: string): void => {
    el.push(
      `<text x="${left + PANEL.w / 2}" y="${PANEL.top - 14}" text-anchor="middle" font-weight="bold">${esc(title)}</text>`,
    );
    for (let i = 0; i <= 5; i++) {
      const v = (max / 5) * i;
      const yy = y(v, max);
      el.push(`<line x1="${left}" y1="${yy}" x2="${left + PANEL.w}" y2="${yy}" stroke="#e9ecef"/>`);
      el.push(`<text x="${left - 6}" y="${yy + 4}" text-anchor="end">${+v.toPrecision(3)}</text>`);
    }
    for (const c of cs)
      el.push(`<text x="${x(left, c)}" y="${PANEL.top + PANEL.h + 16}" text-anchor="middle">${c}</text>`);
    el.push(`<text x="${left + PANEL.w / 2}" y="${PANEL.top + PANEL.h + 34}" text-anchor="middle">concurrency</text>`);
    el.push(`<rect x="${left}" y="${PANEL.top}" width="${PANEL.w}" height="${PANEL.h}" fill="none" stroke="#868e96"/>`);
  };
  axes(PANEL.left[0], maxT, 'throughput (operations/s)');
  axes(PANEL.left[1], maxL, 'latency (ms): p50 solid, p99 dashed');
  const line = (pts: [number, number][], color: string, dash = ''): void => {
    if (pts.length > 1)
      el.push(
        `<polyline fill="none" stroke="${color}" stroke-width="2"${dash ? ` stroke-dasharray="${dash}"` : ''} points="${pts.map(([a, b]) => `${a.toFixed(1)},${b.toFixed(1)}`).join(' ')}"/>`,
      );
    for (const [a, b] of pts) el.push(`<circle cx="${a.toFixed(1)}" cy="${b.toFixed(1)}" r="3" fill="${color}"/>`);
  };
  for (const sr of series) {
    line(
      sr.rungs.map((r) => [x(PANEL.left[0], r.concurrency), y(r.throughput, maxT)]),
      sr.color,
    );
    line(
      sr.rungs
        .filter((r) => Number.isFinite(r.latencyMs.p50))
        .map((r) => [x(PANEL.left[1], r.concurrency), y(r.latencyMs.p50, maxL)]),
      sr.color,
    );
    line(
      sr.rungs
        .filter((r) => Number.isFinite(r.latencyMs.p99))
        .map((r) => [x(PANEL.left[1], r.concurrency), y(r.latencyMs.p99, maxL)]),
      sr.color,
      '6 4',
    );
  }
  series.forEach((sr, i) => {
    const lx = 70 + (i % 3) * 290;
    const ly = H - 36 + Math.floor(i / 3) * 18;
    el.push(
      `<rect x="${lx}" y="${ly - 9}" width="14" height="4" fill="${sr.color}"/><text x="${lx + 20}" y="${ly - 4}">${esc(sr.name)}</text>`,
    );
  });
  const title = `snaplab bench ${s.workload}${s.storage ? ` on ${s.storage}` : ''} — ${s.startedAt}`;
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="12">`,
    `<rect width="${W}" height="${H}" fill="white"/>`,
    `<text x="${W / 2}" y="20" text-anchor="middle" font-size="14">${esc(title)}</text>`,
    ...el,
    '</svg>',
    '',
  ].join('\n');
}
