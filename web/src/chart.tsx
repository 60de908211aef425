/**
 * A small hand-written SVG line chart (no chart library): series of points against a shared x,
 * each point with an optional spread (min–max, drawn as a vertical whisker) and its individual
 * reps (small hollow dots), axes with ticks and labels, a legend, and the same figures as an HTML
 * table for screen readers and keyboard users (the SVG itself is one `role="img"`).
 *
 * The drawing is as wide as its container (up to `width`), measured, so that 11px text stays
 * 11px on a narrow window instead of shrinking with the viewBox; wider containers scale it up.
 */
import { useEffect, useRef, useState } from 'preact/hooks';

export interface ChartPoint {
  x: number;
  /** may be null/NaN in old or empty data: the point is skipped and the line broken there */
  y: number;
  min?: number;
  max?: number;
  reps?: number[];
}

export interface ChartSeries {
  name: string;
  points: ChartPoint[];
  /** a baseline: dashed line, hollow markers */
  dashed?: boolean;
  /** default: the palette, by series index */
  color?: string;
  /** marker shape (to tell two series of one colour apart, e.g. p50 beside p99) */
  marker?: 'circle' | 'square';
  /** its points carry data-x / data-y with the raw values (a hook for tests and tooling) */
  marked?: boolean;
}

export interface LineChartProps {
  title: string;
  xLabel: string;
  yLabel: string;
  series: ChartSeries[];
  /** the widest the drawing gets in its own units (wider containers scale it up); default 640 */
  width?: number;
  height?: number;
  /** 'log2' suits concurrency ladders (1, 2, 4, 8 …): ticks then sit at the data's x values */
  xScale?: 'linear' | 'log2';
  xFormat?: (x: number) => string;
  /** values in the table and the tooltips (axis ticks are rounded on their own) */
  yFormat?: (y: number) => string;
  /** data-testid of the <svg> */
  testid?: string;
}

/** Distinct hues, each ≥ 4.5:1 against white. */
export const PALETTE = ['#1f5fbf', '#b84a00', '#1d6b2f', '#7a4fc4', '#a3195b', '#4d5663', '#00707a'];

/** a row header that reads like a cell (style.css styles th as a small, muted, sticky column head) */
export const ROW_HEAD = 'font-size:inherit;color:inherit;font-weight:600;position:static';

const finite = (v: number | null | undefined): v is number => typeof v === 'number' && Number.isFinite(v);
const plain = (v: number): string => String(+v.toPrecision(6));
const tick = (v: number): string =>
  Math.abs(v) >= 10_000 ? `${+(v / 1000).toPrecision(3)}k` : String(+v.toPrecision(4));

/** 1, 2 or 5 × 10^k: the round step nearest above raw. */
function niceStep(raw: number): number {
  if (!(raw > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw) ?? 10 * p;
}

/** Round ticks from lo to at least hi, about `count` of them. */
function niceTicks(lo: number, hi: number, count: number): number[] {
  const step = niceStep((hi - lo) / count || Math.abs(hi) || 1);
  const out: number[] = [];
  for (let v = Math.floor(lo / step) * step; out.length < 50; v += step) {
    out.push(+v.toPrecision(12));
    if (v >= hi) break;
  }
  return out;
}

/** The container's width in CSS pixels, updated as it changes. */
function useWidth(initial: number) {
  const ref = useRef<HTMLDivElement>(null);
  const [w, setW] = useState(initial);
  useEffect(() => {
    const el = ref.current;
    if (!el || typeof ResizeObserver === 'undefined') return;
    const ro = new ResizeObserver((entries) => {
      const cw = entries[0]?.contentRect.width;
      if (cw) setW(Math.round(cw));
    });
    ro.observe(el);
    return () => ro.disconnect();
  }, []);
  return [ref, w] as const;
}

function Marker({
  x,
  y,
  color,
  hollow,
  shape,
  r = 4,
  extra,
}: {
  x: number;
  y: number;
  color: string;
  hollow?: boolean;
  shape?: 'circle' | 'square';
  r?: number;
  extra?: Record<string, string>;
}) {
  const fill = hollow ? '#fff' : color;
  if (shape === 'square')
    return (
      <rect x={x - r} y={y - r} width={2 * r} height={2 * r} fill={fill} stroke={color} stroke-width="1.5" {...extra} />
    );
  return <circle cx={x} cy={y} r={r} fill={fill} stroke={color} stroke-width="1.5" {...extra} />;
}

/** Where everything goes: the drawing's size, the axes' ticks, and value → pixel on each axis. */
interface Geometry {
  W: number;
  H: number;
  m: { left: number; right: number; top: number; bottom: number };
  pw: number;
  ph: number;
  /** the x values that are drawn (positive ones only on a log2 scale), ascending */
  xs: number[];
  xTicks: number[];
  yTicks: number[];
  X: (x: number) => number;
  Y: (y: number) => number;
  /** the series with a spread (whiskers or several reps) */
  spread: ChartSeries[];
  /** how far a series with a spread is nudged at each x */
  nudge: (s: ChartSeries) => number;
}

function geometry(series: ChartSeries[], W: number, H: number, xScale: 'linear' | 'log2'): Geometry {
  const m = { left: 58, right: 14, top: 12, bottom: 42 };
  const pw = W - m.left - m.right;
  const ph = H - m.top - m.bottom;

  // the x domain, and what the y axis must reach (medians, spreads and reps alike)
  const pts = series.flatMap((s) => s.points);
  const xs = [...new Set(pts.map((p) => p.x).filter((x) => finite(x) && (xScale === 'linear' || x > 0)))].sort(
    (a, b) => a - b,
  );
  const ys = pts.flatMap((p) => [p.y, p.min, p.max, ...(p.reps ?? [])]).filter(finite);
  const yTicks = niceTicks(Math.min(0, ...ys), Math.max(0, ...ys), 4);
  const y0 = yTicks[0]!;
  const y1 = yTicks[yTicks.length - 1]! || 1;
  const xTicks =
    xScale === 'log2'
      ? xs
      : xs.length
        ? niceTicks(xs[0]!, xs[xs.length - 1]!, Math.min(6, Math.max(1, Math.floor(pw / 80)))).filter(
            (t) => t >= xs[0]! && t <= xs[xs.length - 1]!,
          )
        : [];
  const tx = (x: number): number => (xScale === 'log2' ? Math.log2(x) : x);
  const lo = xs.length ? tx(xs[0]!) : 0;
  const hi = xs.length ? tx(xs[xs.length - 1]!) : 1;
  const pad = 14; // keep the first and last points off the y axis and the right edge
  const X = (x: number): number => m.left + (hi === lo ? pw / 2 : pad + ((tx(x) - lo) / (hi - lo)) * (pw - 2 * pad));
  const Y = (y: number): number => m.top + ph - ((y - y0) / (y1 - y0)) * ph;

  // series with a spread are nudged apart a few pixels at the same x, so their whiskers and reps
  // do not sit on top of each other; the median point and the line stay at the true x
  const spread = series.filter((s) =>
    s.points.some((p) => (finite(p.min) && finite(p.max) && p.max > p.min) || (p.reps?.length ?? 0) > 1),
  );
  const nudge = (s: ChartSeries): number => {
    const i = spread.indexOf(s);
    return i < 0 ? 0 : (i - (spread.length - 1) / 2) * 7;
  };
  return { W, H, m, pw, ph, xs, xTicks, yTicks, X, Y, spread, nudge };
}

/** the line as a path, broken where a value is missing */
function linePath(s: ChartSeries, g: Geometry): string {
  let d = '';
  let pen = false;
  for (const p of [...s.points].sort((a, b) => a.x - b.x)) {
    if (!finite(p.y) || !g.xs.includes(p.x)) {
      pen = false;
      continue;
    }
    d += `${pen ? 'L' : 'M'}${g.X(p.x).toFixed(1)},${g.Y(p.y).toFixed(1)}`;
    pen = true;
  }
  return d;
}

export function LineChart({
  title,
  xLabel,
  yLabel,
  series,
  width = 640,
  height = 280,
  xScale = 'linear',
  xFormat = plain,
  yFormat = plain,
  testid,
}: LineChartProps) {
  const [ref, measured] = useWidth(width);
  const g = geometry(series, Math.max(280, Math.min(width, measured)), height, xScale);
  const color = (s: ChartSeries, i: number): string => s.color ?? PALETTE[i % PALETTE.length]!;
  return (
    <figure style="margin:0;min-width:0">
      <figcaption style="font-weight:600;margin-bottom:4px">{title}</figcaption>
      <div ref={ref}>
        <svg
          class="chart"
          role="img"
          aria-label={`${title}: ${yLabel} against ${xLabel}; the figures are in the table below`}
          viewBox={`0 0 ${g.W} ${g.H}`}
          data-testid={testid}
        >
          <title>{title}</title>
          <desc>{`${yLabel} against ${xLabel}, ${series.length} series: ${series.map((s) => s.name).join(', ')}. The same figures are in the table below the chart.`}</desc>
          <Axes g={g} xLabel={xLabel} yLabel={yLabel} xFormat={xFormat} />
          {series.map((s, i) => (
            <SeriesMarks key={s.name} s={s} c={color(s, i)} g={g} />
          ))}
        </svg>
      </div>
      <Legend title={title} series={series} color={color} spread={g.spread.length > 0} />
      <FiguresTable title={title} xLabel={xLabel} series={series} xs={g.xs} xFormat={xFormat} yFormat={yFormat} />
    </figure>
  );
}

/** The grid, the ticks and the axes with their labels. */
function Axes({
  g,
  xLabel,
  yLabel,
  xFormat,
}: {
  g: Geometry;
  xLabel: string;
  yLabel: string;
  xFormat: (x: number) => string;
}) {
  const { W, H, m, pw, ph, X, Y } = g;
  return (
    <>
      {/* grid and y ticks */}
      {g.yTicks.map((t) => (
        <g key={`y${t}`}>
          <line x1={m.left} x2={W - m.right} y1={Y(t)} y2={Y(t)} stroke="#e6e9ed" />
          <text x={m.left - 6} y={Y(t) + 4} text-anchor="end">
            {tick(t)}
          </text>
        </g>
      ))}
      {g.xTicks.map((t) => (
        <g key={`x${t}`}>
          <line class="axis" x1={X(t)} x2={X(t)} y1={m.top + ph} y2={m.top + ph + 4} />
          <text x={X(t)} y={m.top + ph + 16} text-anchor="middle">
            {xFormat(t)}
          </text>
        </g>
      ))}
      <line class="axis" x1={m.left} x2={W - m.right} y1={m.top + ph} y2={m.top + ph} />
      <line class="axis" x1={m.left} x2={m.left} y1={m.top} y2={m.top + ph} />
      <text x={m.left + pw / 2} y={H - 6} text-anchor="middle">
        {xLabel}
      </text>
      <text transform={`translate(13 ${m.top + ph / 2}) rotate(-90)`} text-anchor="middle">
        {yLabel}
      </text>
      {g.xs.length === 0 && (
        <text x={m.left + pw / 2} y={m.top + ph / 2} text-anchor="middle">
          no data
        </text>
      )}
    </>
  );
}

/** One series: its line, and at each x its whisker, its reps and its median's marker. */
function SeriesMarks({ s, c, g }: { s: ChartSeries; c: string; g: Geometry }) {
  const { X, Y } = g;
  const dx = g.nudge(s);
  return (
    <g data-series={s.name}>
      <path
        d={linePath(s, g)}
        fill="none"
        stroke={c}
        stroke-width="2"
        stroke-dasharray={s.dashed ? '6 4' : undefined}
      />
      {s.points
        .filter((p) => g.xs.includes(p.x))
        .map((p) => (
          <g key={p.x}>
            {finite(p.min) && finite(p.max) && p.max > p.min && (
              <path
                d={`M${X(p.x) + dx - 3},${Y(p.min)}h6M${X(p.x) + dx},${Y(p.min)}V${Y(p.max)}M${X(p.x) + dx - 3},${Y(p.max)}h6`}
                stroke={c}
                stroke-width="1.5"
                fill="none"
                opacity="0.75"
              />
            )}
            {(p.reps ?? []).filter(finite).map((r, k) => (
              <circle key={k} cx={X(p.x) + dx} cy={Y(r)} r="2.5" fill="#fff" stroke={c} stroke-width="1.2" />
            ))}
            {finite(p.y) && (
              <Marker
                x={X(p.x)}
                y={Y(p.y)}
                r={s.points.length > 24 ? 2 : 4}
                color={c}
                hollow={s.dashed}
                shape={s.marker}
                extra={s.marked ? { 'data-x': String(p.x), 'data-y': String(p.y) } : undefined}
              />
            )}
          </g>
        ))}
    </g>
  );
}

function Legend({
  title,
  series,
  color,
  spread,
}: {
  title: string;
  series: ChartSeries[];
  color: (s: ChartSeries, i: number) => string;
  spread: boolean;
}) {
  return (
    <ul
      aria-label={`legend: ${title}`}
      style="list-style:none;display:flex;flex-wrap:wrap;gap:4px 16px;margin:4px 0;padding:0;font-size:13px"
    >
      {series.map((s, i) => (
        <li key={s.name} style="display:flex;align-items:center;gap:6px">
          <svg width="30" height="12" viewBox="0 0 30 12" aria-hidden="true">
            <line
              x1="1"
              x2="29"
              y1="6"
              y2="6"
              stroke={color(s, i)}
              stroke-width="2"
              stroke-dasharray={s.dashed ? '6 4' : undefined}
            />
            <Marker x={15} y={6} r={3.5} color={color(s, i)} hollow={s.dashed} shape={s.marker} />
          </svg>
          {s.name}
        </li>
      ))}
      {spread && <li class="muted">whisker: reps' min–max; hollow dots: each rep</li>}
    </ul>
  );
}

/** The same figures as a table, for screen readers and keyboard users. */
function FiguresTable({
  title,
  xLabel,
  series,
  xs,
  xFormat,
  yFormat,
}: {
  title: string;
  xLabel: string;
  series: ChartSeries[];
  xs: number[];
  xFormat: (x: number) => string;
  yFormat: (y: number) => string;
}) {
  const rows = xs.map((x) => ({ x, cells: series.map((s) => s.points.find((p) => p.x === x)) }));
  const hasRange = series.map((s) => s.points.some((p) => finite(p.min) && finite(p.max)));
  const hasReps = series.map((s) => s.points.some((p) => (p.reps?.length ?? 0) > 0));
  return (
    <details>
      <summary>{title}: figures as a table</summary>
      <div class="table-wrap">
        <table>
          <thead>
            <tr>
              <th scope="col">{xLabel}</th>
              {series.map((s, i) => [
                <th scope="col" class="num" key={`v${i}`}>
                  {s.name}
                </th>,
                hasRange[i] && (
                  <th scope="col" class="num" key={`r${i}`}>
                    {s.name} range
                  </th>
                ),
                hasReps[i] && (
                  <th scope="col" key={`p${i}`}>
                    {s.name} reps
                  </th>
                ),
              ])}
            </tr>
          </thead>
          <tbody>
            {rows.map((r) => (
              <tr key={r.x}>
                <th scope="row" style={ROW_HEAD}>
                  {xFormat(r.x)}
                </th>
                {r.cells.map((p, i) => [
                  <td class="num" key={`v${i}`}>
                    {p && finite(p.y) ? yFormat(p.y) : '—'}
                  </td>,
                  hasRange[i] && (
                    <td class="num" key={`r${i}`}>
                      {p && finite(p.min) && finite(p.max) ? `${yFormat(p.min)}–${yFormat(p.max)}` : '—'}
                    </td>
                  ),
                  hasReps[i] && (
                    <td key={`p${i}`}>
                      {p?.reps?.length ? p.reps.map((v) => (finite(v) ? yFormat(v) : '—')).join(', ') : '—'}
                    </td>
                  ),
                ])}
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </details>
  );
}
