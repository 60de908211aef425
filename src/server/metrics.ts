/**
 * `GET /metrics` in Prometheus' text format (version 0.0.4): counters and histograms kept by the
 * daemon, gauges read when scraped (sandboxes by state, pools, host resources).
 */
import { freemem, loadavg, totalmem } from 'node:os';
import { statfs } from 'node:fs/promises';
import { orElse } from '../cleanup.js';

const BUCKETS_MS = [1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000];

class Histogram {
  readonly counts = new Map<string, { buckets: number[]; sum: number; n: number }>();

  observe(labels: string, ms: number): void {
    let h = this.counts.get(labels);
    if (!h) this.counts.set(labels, (h = { buckets: BUCKETS_MS.map(() => 0), sum: 0, n: 0 }));
    BUCKETS_MS.forEach((b, i) => {
      if (ms <= b) h!.buckets[i]!++;
    });
    h.sum += ms / 1000;
    h.n++;
  }

  render(name: string, help: string): string[] {
    const out = [`# HELP ${name} ${help}`, `# TYPE ${name} histogram`];
    for (const [labels, h] of this.counts) {
      const sep = labels ? `${labels},` : '';
      BUCKETS_MS.forEach((b, i) => {
        out.push(`${name}_bucket{${sep}le="${b / 1000}"} ${h.buckets[i]}`);
      });
      out.push(
        `${name}_bucket{${sep}le="+Inf"} ${h.n}`,
        `${name}_sum${labels ? `{${labels}}` : ''} ${h.sum}`,
        `${name}_count${labels ? `{${labels}}` : ''} ${h.n}`,
      );
    }
    return out;
  }
}

/** A label value, escaped as the text format wants. */
export const lv = (v: string): string => JSON.stringify(v);

export class Metrics {
  readonly exec = new Histogram();
  readonly phases = new Histogram();
  readonly requests = new Map<string, number>();

  request(route: string, status: number): void {
    const k = `route=${lv(route)},status="${status}"`;
    this.requests.set(k, (this.requests.get(k) ?? 0) + 1);
  }

  observeTrace(t: {
    kind: string;
    totalMs: number;
    phases: { name: string; depth: number; startMs: number; endMs: number }[];
  }): void {
    this.phases.observe(`operation=${lv(t.kind)},phase="total"`, t.totalMs);
    for (const p of t.phases)
      if (p.depth === 0) this.phases.observe(`operation=${lv(t.kind)},phase=${lv(p.name)}`, p.endMs - p.startMs);
  }

  async render(gauges: {
    sandboxes: Record<string, number>;
    pools: {
      name: string;
      ready: number;
      target: number;
      inUse: number;
      hits: number;
      misses: number;
      refusedDirty: number;
      leaks: number;
    }[];
    processes: number;
    execs: number;
    home: string;
    egress?: { machines: number; bytesOut: number; connections: number; denied: number };
    /** sandboxes the E2B front keeps a session of, when it listens */
    e2bSessions?: number;
  }): Promise<string> {
    const out: string[] = [];
    const gauge = (name: string, help: string, rows: [string, number][], type = 'gauge'): void => {
      out.push(
        `# HELP ${name} ${help}`,
        `# TYPE ${name} ${type}`,
        ...rows.map(([l, v]) => `${name}${l ? `{${l}}` : ''} ${v}`),
      );
    };
    gauge(
      'snaplab_sandboxes',
      'sandboxes by state',
      Object.entries(gauges.sandboxes).map(([s, n]) => [`state=${lv(s)}`, n]),
    );
    for (const [k, help, type] of [
      ['ready', 'paused standbys ready', 'gauge'],
      ['target', 'target size', 'gauge'],
      ['inUse', 'standbys taken and running', 'gauge'],
      ['hits', 'takes served by a standby', 'counter'],
      ['misses', 'takes that raised a sandbox', 'counter'],
      ['refusedDirty', 'returns refused by the clean check', 'counter'],
      ['leaks', 'standbys found dead or orphaned', 'counter'],
    ] as const) {
      const name = `snaplab_pool_${k.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`)}${type === 'counter' ? '_total' : ''}`;
      gauge(
        name,
        `pool: ${help}`,
        gauges.pools.map((p) => [`pool=${lv(p.name)}`, p[k]]),
        type,
      );
    }
    gauge('snaplab_processes_running', 'commands the daemon runs now (streamed and background)', [
      ['', gauges.processes],
    ]);
    gauge('snaplab_execs_running', 'one-shot execs running now', [['', gauges.execs]]);
    if (gauges.egress) {
      const e = gauges.egress;
      gauge('snaplab_egress_machines', 'machines with egress (docs/egress.md)', [['', e.machines]]);
      // sums over the machines there are now: a removed machine's counts go with it (gauges, not counters)
      gauge('snaplab_egress_bytes_out', "bytes they sent out through the home's router", [['', e.bytesOut]]);
      gauge('snaplab_egress_connections', 'connections out they opened that were let through', [['', e.connections]]);
      gauge('snaplab_egress_denied', 'packets of their connections refused (and spoofed ones dropped)', [
        ['', e.denied],
      ]);
    }
    if (gauges.e2bSessions !== undefined)
      gauge('snaplab_e2b_sessions', 'sandboxes the E2B front keeps a session of (docs/e2b.md)', [
        ['', gauges.e2bSessions],
      ]);
    out.push(...this.exec.render('snaplab_exec_duration_seconds', 'exec wall time, request to result'));
    out.push(
      ...this.phases.render('snaplab_phase_duration_seconds', 'traced operations of the daemon: total and per phase'),
    );
    gauge('snaplab_http_requests_total', 'requests by route and status', [...this.requests], 'counter');
    const [l1] = loadavg();
    gauge('snaplab_host_load1', 'host load average, 1 minute', [['', l1!]]);
    gauge('snaplab_host_memory_bytes', 'host memory', [
      ['kind="total"', totalmem()],
      ['kind="free"', freemem()],
    ]);
    const fs = await statfs(gauges.home).catch(orElse(undefined, `statfs ${gauges.home}`, 'ENOENT'));
    if (fs)
      gauge('snaplab_home_disk_bytes', 'the filesystem of SNAPLAB_HOME', [
        ['kind="total"', fs.blocks * fs.bsize],
        ['kind="free"', fs.bavail * fs.bsize],
      ]);
    return `${out.join('\n')}\n`;
  }
}
