/**
 * `GET /sandboxes/{id}/metrics` (the SDK's `getMetrics`): one sample, read when asked through the
 * Lab API's `sandbox.usage()`. E2B's API answers the samples its hosts took every few seconds
 * between `start` and `end`; nothing here samples in the background, so the answer is the sample
 * of now when now is in that range, else none. CPU use is the CPU time used since the previous
 * sample this front read of the sandbox (within ten minutes), else since the sandbox started,
 * over the wall time between, as a share of the CPUs it may use.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { SandboxUsage } from '../sdk/api.js';
import { SnaplabError } from '../errors.js';
import type { E2bState } from './state.js';

/** How long a sample is kept to measure the next one's CPU use against. */
const PREVIOUS_MS = 10 * 60_000;
/** At most this many sandboxes' previous samples are kept (the oldest go first). */
const KEPT = 4096;

/** E2B's SandboxMetric (spec/openapi.yml): every field its spec requires */
interface Sample {
  timestamp: string;
  /** the same time in Unix seconds */
  timestampUnix: number;
  cpuCount: number;
  cpuUsedPct: number;
  /** its cgroup's memory, page cache included (memCache of it) */
  memUsed: number;
  memTotal: number;
  memCache: number;
  diskUsed: number;
  diskTotal: number;
}

/** A time in the query as E2B's SDK sends it (Unix seconds), in ms; undefined when absent. */
function secondsQuery(req: FastifyRequest, name: 'start' | 'end'): number | undefined {
  const v = (req.query as Record<string, string | undefined>)[name];
  if (v === undefined || v === '') return undefined;
  const n = Number(v);
  if (!Number.isFinite(n) || n < 0)
    throw new SnaplabError('BAD_INPUT', `${name} must be a Unix time in seconds`, `e.g. ${name}=1764840000`);
  return n * 1000;
}

export class MetricsFront {
  private readonly previous = new Map<string, SandboxUsage>();

  /** CPU use since `from` as a percentage of the CPUs the sandbox may use. */
  private cpuPct(now: SandboxUsage, from: { at: number; cpuUsec: number }): number {
    const wallUs = (now.at - from.at) * 1000;
    if (wallUs <= 0) return 0;
    const pct = ((now.cpuUsec - from.cpuUsec) / wallUs / now.cpus) * 100;
    return Math.round(Math.min(100, Math.max(0, pct)) * 100) / 100;
  }

  sample(id: string, createdAt: number, now: SandboxUsage): Sample {
    const prev = this.previous.get(id);
    const from =
      prev && now.at - prev.at <= PREVIOUS_MS && prev.cpuUsec <= now.cpuUsec ? prev : { at: createdAt, cpuUsec: 0 };
    this.previous.delete(id);
    this.previous.set(id, now);
    if (this.previous.size > KEPT) this.previous.delete(this.previous.keys().next().value as string);
    return {
      timestamp: new Date(now.at).toISOString(),
      timestampUnix: Math.floor(now.at / 1000),
      cpuCount: now.cpus,
      cpuUsedPct: this.cpuPct(now, from),
      memUsed: now.memoryBytes,
      memTotal: now.memoryTotalBytes,
      memCache: now.memoryCacheBytes,
      diskUsed: now.diskUsedBytes ?? 0,
      diskTotal: now.diskTotalBytes ?? 0,
    };
  }

  forget(id: string): void {
    this.previous.delete(id);
  }
}

export function registerMetrics(app: FastifyInstance, state: E2bState): void {
  app.get('/sandboxes/:id/metrics', async (req, reply) => {
    const start = secondsQuery(req, 'start');
    const end = secondsQuery(req, 'end');
    const box = await (await state.lab(req)).get((req.params as { id: string }).id);
    const now = await box.usage();
    state.disks.seen(box, now.diskTotalBytes);
    // the SDK rounds its times to whole seconds: a range within a second of now holds a sample of now
    const inRange = (start === undefined || now.at >= start - 1000) && (end === undefined || now.at < end + 1000);
    return reply.send(inRange ? [state.metrics.sample(box.id, box.createdAt, now)] : []);
  });
}
