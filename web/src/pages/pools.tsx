/**
 * Pools: target, ready, in use, hits and misses, standbys refused as dirty, leaks; and for each,
 * takes per second and take latency over the last minute, from the stored traces of its takes.
 */
import { useEffect, useRef, useState } from 'preact/hooks';
import { api, enc } from '../api';
import { ErrorBox, Section } from '../components';
import { LineChart } from '../chart';
import { ms } from '../format';
import { usePoll } from '../hooks';

interface Pool {
  name: string;
  image: string;
  storage: string;
  driver?: string;
  target: number;
  ready: number;
  inUse: number;
  raising: number;
  dead: number;
  hits: number;
  misses: number;
  recycled: number;
  refusedDirty: number;
  leaks: number;
  recycle: boolean;
}

interface Take {
  id: string;
  at: number;
  kind: string;
  ms: number | null;
  hit: boolean;
}

const WINDOW_S = 60;

/** Takes per second and median take latency, one point per second of the last minute. */
export function perSecond(
  takes: Take[],
  now: number,
): { rate: { x: number; y: number }[]; latency: { x: number; y: number }[] } {
  const rate: { x: number; y: number }[] = [];
  const latency: { x: number; y: number }[] = [];
  const buckets = new Map<number, number[]>();
  for (const t of takes) {
    const s = Math.floor((t.at - now) / 1000);
    if (s < -WINDOW_S || s >= 0) continue;
    const b = buckets.get(s) ?? [];
    if (t.ms !== null) b.push(t.ms);
    else b.push(NaN);
    buckets.set(s, b);
  }
  for (let s = -WINDOW_S; s < 0; s++) {
    const b = buckets.get(s) ?? [];
    rate.push({ x: s, y: b.length });
    const okMs = b.filter(Number.isFinite).sort((x, y) => x - y);
    // a second without takes has no latency: NaN leaves a gap and keeps the axis a minute wide
    latency.push({ x: s, y: okMs.length ? okMs[Math.floor((okMs.length - 1) / 2)]! : NaN });
  }
  return { rate, latency };
}

function PoolCharts({ name }: { name: string }) {
  const takes = useRef<Take[]>([]);
  // the daemon's clock (the takes' times are on it), carried forward between answers
  const [now, setNow] = useState(Date.now());
  const [error, setError] = useState<unknown>(undefined);
  useEffect(() => {
    let live = true;
    let after: number | undefined;
    let skew = 0;
    let timer: ReturnType<typeof setTimeout>;
    const poll = async (): Promise<void> => {
      try {
        const got = await api<{ now: number; next: number; takes: Take[] }>(
          'GET',
          `/pools/${enc(name)}/takes${after === undefined ? `?since=${WINDOW_S * 1000}` : `?after=${after}`}`,
        );
        if (!live) return;
        after = got.next;
        skew = got.now - Date.now();
        const cut = got.now - WINDOW_S * 1000;
        takes.current = [...takes.current, ...got.takes].filter((t) => t.at >= cut);
        setError(undefined);
      } catch (e) {
        if (live) setError(e);
      }
      if (!live) return;
      setNow(Date.now() + skew);
      timer = setTimeout(() => void poll(), 1000);
    };
    void poll();
    return () => {
      live = false;
      clearTimeout(timer);
    };
  }, [name]);
  const { rate, latency } = perSecond(takes.current, now);
  const total = takes.current.length;
  return (
    <>
      <ErrorBox error={error} />
      <p class="muted">
        {total} takes in the last {WINDOW_S} s{total ? `, median ${ms(median(takes.current.map((t) => t.ms)))}` : ''}
      </p>
      <div class="grid" style={{ gridTemplateColumns: 'repeat(auto-fit, minmax(320px, 1fr))' }}>
        <LineChart
          title={`takes per second: ${name}`}
          xLabel="seconds ago"
          yLabel="takes/s"
          series={[{ name: 'takes/s', points: rate, marked: true }]}
          height={180}
          testid={`takes-${name}`}
        />
        <LineChart
          title={`take latency: ${name}`}
          xLabel="seconds ago"
          yLabel="ms (median)"
          series={[{ name: 'median take', points: latency, marked: true }]}
          height={180}
          testid={`take-latency-${name}`}
        />
      </div>
    </>
  );
}

function median(xs: (number | null)[]): number | null {
  const v = xs.filter((x): x is number => x !== null && Number.isFinite(x)).sort((a, b) => a - b);
  return v.length ? v[Math.floor((v.length - 1) / 2)]! : null;
}

export function PoolsPage() {
  const pools = usePoll(() => api<Pool[]>('GET', '/pools'), 1000);
  return (
    <>
      <h1>Pools</h1>
      <ErrorBox error={pools.error} />
      <Section title="Pools">
        <div class="table-wrap">
          <table data-testid="pools">
            <thead>
              <tr>
                <th>pool</th>
                <th>image</th>
                <th class="num">target</th>
                <th class="num">ready</th>
                <th class="num">in use</th>
                <th class="num">raising</th>
                <th class="num">hits</th>
                <th class="num">misses</th>
                <th class="num">recycled</th>
                <th class="num">refused dirty</th>
                <th class="num">leaks</th>
              </tr>
            </thead>
            <tbody>
              {(pools.data ?? []).map((p) => (
                <tr data-pool={p.name}>
                  <td>{p.name}</td>
                  <td>
                    {p.image}{' '}
                    <span class="muted">
                      {p.driver ?? 'namespaces'} · {p.storage}
                    </span>
                  </td>
                  <td class="num">{p.target}</td>
                  <td class="num" data-field="ready">
                    {p.ready}
                  </td>
                  <td class="num">{p.inUse}</td>
                  <td class="num">{p.raising}</td>
                  <td class="num" data-field="hits">
                    {p.hits}
                  </td>
                  <td class="num">{p.misses}</td>
                  <td class="num">{p.recycled}</td>
                  <td class="num">{p.refusedDirty}</td>
                  <td class="num">{p.leaks}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
        {pools.data && !pools.data.length && (
          <p class="muted">
            No pools. <code>snaplab pool create jobs --image busybox --size 8</code> (or POST /pools) keeps standbys
            warm.
          </p>
        )}
      </Section>
      {(pools.data ?? []).map((p) => (
        <Section key={p.name} title={`Takes: ${p.name}`}>
          <PoolCharts name={p.name} />
        </Section>
      ))}
    </>
  );
}
