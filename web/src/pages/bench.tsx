/**
 * Bench: the `snaplab bench --results` directories the daemon can see (GET /bench), and one of
 * them drawn (GET /bench/NAME, its summary.json): throughput and latency per rung, the A/B
 * comparison when there is one, and the same figures summary.md holds, as tables.
 */
import { api, enc } from '../api';
import { LineChart, PALETTE, ROW_HEAD, type ChartSeries } from '../chart';
import { Button, ErrorBox, Section } from '../components';
import { age } from '../format';
import { href, usePoll } from '../hooks';

/* The shape of summary.json, as src/bench/summary.ts writes it. A copy, not an import of that
 * type (as src/views.ts is for traces and scenarios): the page reads files written by any earlier
 * version, so the fields an older summary may lack are optional here, and not in the writer's. */
interface Latency {
  p50: number;
  p90: number;
  p99: number;
}
interface Rep {
  rep: number;
  throughput: number;
  ops: number;
  errors: number;
  wallMs: number;
  latencyMs: Latency;
  phasesMs?: Record<string, number>;
  firstError?: string;
}
interface Rung {
  concurrency: number;
  throughput: number;
  throughputRange?: { min: number; max: number };
  ops: number;
  errors: number;
  latencyMs: Latency;
  phasesMs?: Record<string, number>;
  reps?: Rep[];
}
interface Peak {
  concurrency: number;
  throughput: number;
}
interface Baseline {
  name: string;
  throughput?: number;
  latencyMs?: Latency;
  note?: string;
  floorMs?: number;
  slopeMsPerSlot?: number | null;
  peak?: Peak;
  rungs?: Rung[];
}
interface Side {
  throughput: number;
  throughputReps: number[];
  latencyMs: Latency;
  phasesMs?: Record<string, number>;
}
interface CompareConf {
  options: string;
  floorMs: number;
  slopeMsPerSlot: number | null;
  peak: Peak;
}
interface Compare {
  a: CompareConf;
  b: CompareConf;
  rungs: { concurrency: number; a: Side; b: Side; overlap: boolean; verdict: string }[];
}
interface Summary {
  workload: string;
  storage?: string;
  argv?: string[];
  startedAt: string;
  finishedAt?: string;
  settings?: {
    ladder: number[];
    reps: number;
    durationMs: number;
    count?: number;
    driver?: string;
    recycle?: boolean;
    poolSize?: number;
  };
  rungs: Rung[];
  floorMs: number;
  slopeMsPerSlot: number | null;
  peak: Peak;
  baselines?: Baseline[];
  ratios?: Record<string, number>;
  compare?: Compare;
  notes?: string[];
  extra?: Record<string, unknown>;
}
interface Entry {
  name: string;
  workload: string;
  storage: string | null;
  startedAt: string;
  rungs: number;
  compare: boolean;
}

/** Numbers exactly as summary.md writes them (src/bench/report-text.ts `n`): whole from 100 up. */
const n = (x: number | null | undefined, d = 1): string =>
  x === null || x === undefined || !Number.isFinite(x) ? '-' : x >= 100 ? x.toFixed(0) : x.toFixed(d);
const slope = (v: number | null | undefined): string => (v == null ? '-' : `${n(v, 3)} ms/slot`);
const phases = (p: Record<string, number> | undefined): string =>
  Object.entries(p ?? {})
    .map(([k, v]) => `${k} ${n(v, 2)}`)
    .join(', ');
const when = (iso: string): string =>
  Number.isNaN(Date.parse(iso)) ? iso : `${new Date(iso).toLocaleString()} (${age(iso)} ago)`;

export function BenchPage({ name }: { name?: string }) {
  // keyed by name: another result starts from "loading", never shows the last one under a new name
  return name ? <BenchResult key={name} name={name} /> : <BenchList />;
}

function BenchList() {
  const { data, error, reload } = usePoll(() => api<Entry[]>('GET', '/bench'));
  // the API lists by name; newest first reads better (ISO timestamps sort as strings)
  const rows = [...(data ?? [])].sort((a, b) => String(b.startedAt).localeCompare(String(a.startedAt)));
  return (
    <>
      <h1>Bench</h1>
      <Section title="Results" actions={<Button onClick={reload}>Reload</Button>}>
        <ErrorBox error={error} />
        {!data && !error && <p>loading…</p>}
        {data && rows.length === 0 && (
          <div>
            <p>No bench results yet. Write one into the daemon's bench directory:</p>
            <pre>snaplab bench --results $SNAPLAB_HOME/bench/NAME</pre>
            <p class="muted">
              Or show the results in another directory: <code>snaplab serve --bench-dir DIR</code>. Each result is a
              directory holding a summary.json.
            </p>
          </div>
        )}
        {rows.length > 0 && (
          <div class="table-wrap">
            <table>
              <thead>
                <tr>
                  <th scope="col">name</th>
                  <th scope="col">workload</th>
                  <th scope="col">storage</th>
                  <th scope="col">started</th>
                  <th scope="col" class="num">
                    rungs
                  </th>
                  <th scope="col">compare</th>
                </tr>
              </thead>
              <tbody>
                {rows.map((r) => (
                  <tr key={r.name}>
                    <td>
                      <a href={href('bench', r.name)}>{r.name}</a>
                    </td>
                    <td>{r.workload}</td>
                    <td>{r.storage ?? '—'}</td>
                    <td>
                      <time dateTime={r.startedAt}>{when(r.startedAt)}</time>
                    </td>
                    <td class="num">{r.rungs}</td>
                    <td>{r.compare ? 'A/B' : '—'}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        )}
      </Section>
    </>
  );
}

function BenchResult({ name }: { name: string }) {
  const { data: s, error, reload } = usePoll(() => api<Summary>('GET', `/bench/${enc(name)}`), 0, [name]);
  const back = (
    <p>
      <a href={href('bench')}>← all bench results</a>
    </p>
  );
  if (!s)
    return (
      <>
        {back}
        <ErrorBox error={error} />
        {!error && <p>loading…</p>}
      </>
    );
  const set = s.settings;
  return (
    <>
      {back}
      <h1>
        bench {name}: {s.workload}
        {s.storage ? ` on ${s.storage}` : ''}
      </h1>
      <ErrorBox error={error} />
      <Section title="Run" actions={<Button onClick={reload}>Reload</Button>}>
        <dl class="grid">
          <div>
            <dt>workload</dt>
            <dd>{s.workload}</dd>
          </div>
          <div>
            <dt>storage</dt>
            <dd>{s.storage ?? '—'}</dd>
          </div>
          <div>
            <dt>command</dt>
            <dd>
              <code>{s.argv?.length ? s.argv.join(' ') : '—'}</code>
            </dd>
          </div>
          <div>
            <dt>started</dt>
            <dd>
              <time dateTime={s.startedAt}>{s.startedAt}</time>
            </dd>
          </div>
          {s.finishedAt && (
            <div>
              <dt>finished</dt>
              <dd>
                <time dateTime={s.finishedAt}>{s.finishedAt}</time>
              </dd>
            </div>
          )}
          {set && (
            <div>
              <dt>ladder</dt>
              <dd>
                {set.ladder.join(', ')} × {set.reps} rep{set.reps > 1 ? 's' : ''} × {set.durationMs / 1000} s
              </dd>
            </div>
          )}
          {set?.driver && (
            <div>
              <dt>driver</dt>
              <dd>{set.driver}</dd>
            </div>
          )}
          {set?.count !== undefined && (
            <div>
              <dt>count</dt>
              <dd>{set.count}</dd>
            </div>
          )}
          {set?.poolSize !== undefined && (
            <div>
              <dt>pool size</dt>
              <dd>
                {set.poolSize}
                {set.recycle ? ' (recycle)' : ''}
              </dd>
            </div>
          )}
          {s.compare && (
            <div>
              <dt>A</dt>
              <dd>
                <code>{s.compare.a.options}</code>
              </dd>
            </div>
          )}
          {s.compare && (
            <div>
              <dt>B</dt>
              <dd>
                <code>{s.compare.b.options}</code>
              </dd>
            </div>
          )}
        </dl>
      </Section>
      <Charts s={s} />
      {s.compare && <CompareTable c={s.compare} />}
      <Figures s={s} />
    </>
  );
}

const lo = (xs: number[]): number | undefined => (xs.length ? Math.min(...xs) : undefined);
const hi = (xs: number[]): number | undefined => (xs.length ? Math.max(...xs) : undefined);
const baseColor = (i: number): string => PALETTE[(i + 2) % PALETTE.length]!;

/** What both charts draw: the workload's series names and colours (A and B on a compare), and the baselines with rungs. */
function chartParts(s: Summary) {
  const c = s.compare;
  return {
    c,
    bases: (s.baselines ?? []).filter((b) => b.rungs?.length),
    a: c ? `A (${c.a.options})` : s.workload,
    b: c ? `B (${c.b.options})` : '',
    ca: PALETTE[0]!,
    cb: PALETTE[1]!,
  };
}

/** Throughput per rung, with the reps' range and each rep. */
function throughputSeries(s: Summary): ChartSeries[] {
  const { c, bases, a, b, ca, cb } = chartParts(s);
  const throughput: ChartSeries[] = [
    {
      name: a,
      color: ca,
      marked: true,
      points: s.rungs.map((r) => ({
        x: r.concurrency,
        y: r.throughput,
        min: r.throughputRange?.min,
        max: r.throughputRange?.max,
        reps: r.reps?.map((x) => x.throughput),
      })),
    },
    ...(c
      ? [
          {
            name: b,
            color: cb,
            points: c.rungs.map((r) => ({
              x: r.concurrency,
              y: r.b.throughput,
              min: lo(r.b.throughputReps),
              max: hi(r.b.throughputReps),
              reps: r.b.throughputReps,
            })),
          },
        ]
      : []),
    ...bases.map((x, i) => ({
      name: x.name,
      color: baseColor(i),
      dashed: true,
      points: x.rungs!.map((r) => ({ x: r.concurrency, y: r.throughput })),
    })),
  ];
  return throughput;
}

function latencySeries(s: Summary): ChartSeries[] {
  const { c, bases, a, b, ca, cb } = chartParts(s);
  // p99 over all samples of a rung, with each rep's own p99 as the dots and their range;
  // p50 beside it in the same colour with square markers. B has no per-rep latency in the summary.
  const p99reps = (r: Rung): number[] => (r.reps ?? []).map((x) => x.latencyMs?.p99).filter((v) => Number.isFinite(v));
  const latency: ChartSeries[] = [
    {
      name: `${a} p99`,
      color: ca,
      marked: true,
      points: s.rungs.map((r) => ({
        x: r.concurrency,
        y: r.latencyMs.p99,
        min: lo(p99reps(r)),
        max: hi(p99reps(r)),
        reps: p99reps(r),
      })),
    },
    {
      name: `${a} p50`,
      color: ca,
      marker: 'square',
      points: s.rungs.map((r) => ({ x: r.concurrency, y: r.latencyMs.p50 })),
    },
    ...(c
      ? [
          { name: `${b} p99`, color: cb, points: c.rungs.map((r) => ({ x: r.concurrency, y: r.b.latencyMs.p99 })) },
          {
            name: `${b} p50`,
            color: cb,
            marker: 'square' as const,
            points: c.rungs.map((r) => ({ x: r.concurrency, y: r.b.latencyMs.p50 })),
          },
        ]
      : []),
    ...bases.map((x, i) => ({
      name: `${x.name} p99`,
      color: baseColor(i),
      dashed: true,
      points: x.rungs!.map((r) => ({ x: r.concurrency, y: r.latencyMs.p99 })),
    })),
  ];
  return latency;
}

/** Throughput and latency per rung: the workload (A and B on a compare), each baseline dashed. */
function Charts({ s }: { s: Summary }) {
  const throughput = throughputSeries(s);
  const latency = latencySeries(s);
  return (
    <Section title="Per rung">
      <div style="display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,440px),1fr));gap:16px">
        <LineChart
          title="Throughput per rung"
          xLabel="concurrency"
          yLabel="operations/s"
          xScale="log2"
          series={throughput}
          testid="chart-throughput"
        />
        <LineChart
          title="Latency per rung (p99, p50)"
          xLabel="concurrency"
          yLabel="latency ms"
          xScale="log2"
          series={latency}
          testid="chart-p99"
        />
      </div>
    </Section>
  );
}

/** One row per rung: A and B with their reps, B/A, whether the reps overlap, and the verdict as the summary states it. */
function CompareTable({ c }: { c: Compare }) {
  return (
    <Section title={`Compare A (${c.a.options}) vs B (${c.b.options})`}>
      <div class="table-wrap">
        <table>
          <thead>
            <tr>
              <th scope="col" class="num">
                concurrency
              </th>
              <th scope="col">A /s (reps)</th>
              <th scope="col">B /s (reps)</th>
              <th scope="col" class="num">
                B/A
              </th>
              <th scope="col" class="num">
                A p50 / p99 ms
              </th>
              <th scope="col" class="num">
                B p50 / p99 ms
              </th>
              <th scope="col">overlap</th>
              <th scope="col">verdict</th>
            </tr>
          </thead>
          <tbody>
            {c.rungs.map((r) => (
              <tr key={r.concurrency}>
                <th scope="row" class="num" style={ROW_HEAD}>
                  {r.concurrency}
                </th>
                <td>
                  {r.a.throughput} ({r.a.throughputReps.join(', ')})
                </td>
                <td>
                  {r.b.throughput} ({r.b.throughputReps.join(', ')})
                </td>
                <td class="num">{r.a.throughput > 0 ? (r.b.throughput / r.a.throughput).toFixed(2) : '-'}</td>
                <td class="num">
                  {n(r.a.latencyMs.p50, 2)} / {n(r.a.latencyMs.p99, 2)}
                </td>
                <td class="num">
                  {n(r.b.latencyMs.p50, 2)} / {n(r.b.latencyMs.p99, 2)}
                </td>
                <td>{r.overlap ? 'yes' : 'no'}</td>
                <td data-verdict={r.verdict}>
                  <strong>{r.verdict}</strong>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
      <p>
        A: floor {n(c.a.floorMs, 2)} ms, slope {slope(c.a.slopeMsPerSlot)}, peak {n(c.a.peak.throughput)}/s at{' '}
        {c.a.peak.concurrency}; B: floor {n(c.b.floorMs, 2)} ms, slope {slope(c.b.slopeMsPerSlot)}, peak{' '}
        {n(c.b.peak.throughput)}/s at {c.b.peak.concurrency}
      </p>
      <p class="muted">A win needs reps that do not overlap; overlapping reps, or one rep a side, are noise.</p>
    </Section>
  );
}

/** summary.md's figures: the per-rung table with the baselines beside it, the fit, ratios, phases, notes. */
function Figures({ s }: { s: Summary }) {
  const bases = (s.baselines ?? []).filter((b) => b.rungs?.length);
  const withPhases = s.rungs.filter((r) => Object.keys(r.phasesMs ?? {}).length);
  const bPhases = (s.compare?.rungs ?? []).filter((r) => Object.keys(r.b.phasesMs ?? {}).length);
  const failed = s.rungs.flatMap((r) =>
    (r.reps ?? []).filter((x) => x.errors > 0).map((x) => ({ c: r.concurrency, ...x })),
  );
  return (
    <Section title="Figures (as summary.md)">
      <div class="table-wrap">
        <table>
          <thead>
            <tr>
              {[
                'concurrency',
                'throughput /s',
                'reps range',
                'p50 ms',
                'p90 ms',
                'p99 ms',
                'errors',
                ...bases.flatMap((b) => [`${b.name} /s`, `${b.name} p50`]),
              ].map((h) => (
                <th scope="col" class={h === 'reps range' ? '' : 'num'} key={h}>
                  {h}
                </th>
              ))}
            </tr>
          </thead>
          <tbody>
            {s.rungs.map((r) => (
              <tr key={r.concurrency}>
                <th scope="row" class="num" style={ROW_HEAD}>
                  {r.concurrency}
                </th>
                <td class="num">{n(r.throughput)}</td>
                {/* as summary.md: a range only with more than one rep */}
                <td>
                  {(r.reps?.length ?? 0) > 1 && r.throughputRange
                    ? `${n(r.throughputRange.min)}–${n(r.throughputRange.max)}`
                    : ''}
                </td>
                <td class="num">{n(r.latencyMs.p50, 2)}</td>
                <td class="num">{n(r.latencyMs.p90, 2)}</td>
                <td class="num">{n(r.latencyMs.p99, 2)}</td>
                <td class="num">{r.errors}</td>
                {bases.flatMap((b) => {
                  const br = b.rungs!.find((x) => x.concurrency === r.concurrency);
                  return [
                    <td class="num" key={`${b.name}t`}>
                      {br ? n(br.throughput) : '-'}
                    </td>,
                    <td class="num" key={`${b.name}p`}>
                      {br ? n(br.latencyMs.p50, 2) : '-'}
                    </td>,
                  ];
                })}
              </tr>
            ))}
          </tbody>
        </table>
      </div>
      <ul>
        <li>
          floor {n(s.floorMs, 2)} ms (p50 at concurrency {s.rungs[0]?.concurrency ?? '-'}), slope{' '}
          {s.slopeMsPerSlot === null ? '- (one rung)' : slope(s.slopeMsPerSlot)}, peak {n(s.peak.throughput)}/s at
          concurrency {s.peak.concurrency}
        </li>
        {(s.baselines ?? []).map((b) => (
          <li key={b.name}>
            baseline {b.name}:{' '}
            {b.peak
              ? `floor ${n(b.floorMs, 2)} ms, slope ${slope(b.slopeMsPerSlot)}, peak ${n(b.peak.throughput)}/s at concurrency ${b.peak.concurrency}${b.note ? ` (${b.note})` : ''}`
              : (b.note ?? 'not measured')}
          </li>
        ))}
        {Object.entries(s.ratios ?? {}).map(([k, v]) => (
          <li key={k}>
            ratio {k}: <strong>{v}</strong>
          </li>
        ))}
      </ul>
      {failed.length > 0 && (
        <>
          <h3>Errors</h3>
          <ul>
            {failed.map((x) => (
              <li key={`${x.c}-${x.rep}`}>
                concurrency {x.c} rep {x.rep}: {x.errors} error{x.errors > 1 ? 's' : ''}
                {x.firstError ? `, first: ${x.firstError}` : ''}
              </li>
            ))}
          </ul>
        </>
      )}
      {withPhases.length + bPhases.length > 0 && (
        <>
          <h3>Phase medians (ms)</h3>
          <div class="table-wrap">
            <table>
              <thead>
                <tr>
                  <th scope="col">concurrency</th>
                  <th scope="col">phases</th>
                </tr>
              </thead>
              <tbody>
                {withPhases.map((r) => (
                  <tr key={`a${r.concurrency}`}>
                    <th scope="row" style={ROW_HEAD}>
                      {r.concurrency}
                      {s.compare ? ' (A)' : ''}
                    </th>
                    <td>{phases(r.phasesMs)}</td>
                  </tr>
                ))}
                {bPhases.map((r) => (
                  <tr key={`b${r.concurrency}`}>
                    <th scope="row" style={ROW_HEAD}>
                      {r.concurrency} (B)
                    </th>
                    <td>{phases(r.b.phasesMs)}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        </>
      )}
      {(s.notes ?? []).map((note) => (
        <blockquote key={note} style="margin:8px 0;padding-left:10px;border-left:3px solid #aab2bd">
          {note}
        </blockquote>
      ))}
      {s.extra && Object.keys(s.extra).length > 0 && (
        <details>
          <summary>extra (as the bench printed it)</summary>
          <pre style="overflow-x:auto">{JSON.stringify(s.extra, null, 2)}</pre>
        </details>
      )}
    </Section>
  );
}
