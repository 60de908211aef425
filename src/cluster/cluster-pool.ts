/**
 * A pool in the cluster: one name defined on several nodes. Its stats are summed over the nodes
 * that hold it; a run goes where placement finds a ready standby (once more elsewhere if that node
 * could not be reached); a take is a create from it; a resize or a removal is done on each holder.
 */
import { SnaplabError } from '../errors.js';
import type { PoolStats } from '../lab/pools/admin.js';
import type { RunOutcome, RunSpec } from '../lab/pools/run.js';
import type { BufferOutput, PoolApi, PoolTakes, SandboxApi } from '../sdk/api.js';
import type { Text } from '../sdk/output.js';
import { onNode, refusedBy } from './core-errors.js';
import type { RemoteLab } from '../client/remote.js';
import type { ClusterCore } from './core.js';
import type { NodeInfo } from './store.js';

/** What a pool needs of its GatewayLab (given this, not the class: gateway-lab.ts imports this file). */
export interface PoolHost {
  readonly core: ClusterCore;
  remote(node: string, read?: boolean): RemoteLab;
  create(opts: { pool: string; timeoutS: number }): Promise<SandboxApi>;
  fromEach<T>(
    call: (lab: RemoteLab, n: NodeInfo) => Promise<T>,
    nodes?: NodeInfo[],
    read?: boolean,
  ): Promise<{ done: { node: string; value: T }[]; refused: { node: string; error: unknown }[] }>;
}

const COUNTS = ['target', 'ready', 'inUse', 'raising', 'dead'] as const;

/** Each pool once, its counts summed over the nodes that answered for it, with those nodes. */
export function sumPools(each: { node: string; value: PoolStats[] }[]): PoolStats[] {
  const by = new Map<string, PoolStats & { nodes: string[] }>();
  for (const a of each)
    for (const p of a.value) {
      const had = by.get(p.name);
      if (!had) {
        by.set(p.name, { ...p, nodes: [a.node] });
        continue;
      }
      const sums = had as unknown as Record<string, number>;
      for (const k of COUNTS) sums[k] = (sums[k] ?? 0) + ((p as unknown as Record<string, number>)[k] ?? 0);
      had.nodes.push(a.node);
    }
  return [...by.values()];
}

export class ClusterPool implements PoolApi {
  constructor(
    private readonly lab: PoolHost,
    readonly name: string,
  ) {}

  private notFound(): SnaplabError {
    return new SnaplabError('POOL_NOT_FOUND', `no pool named ${this.name} on any node`, 'define one: POST /pools');
  }

  async stats(): Promise<PoolStats> {
    const { done } = await this.lab.fromEach((lab) => lab.pool(this.name).stats());
    const [sum] = sumPools(done.map((d) => ({ node: d.node, value: [d.value] })));
    if (!sum) throw this.notFound();
    return sum;
  }

  async run(argv: string[], spec: RunSpec & BufferOutput): Promise<RunOutcome>;
  async run(argv: string[], spec?: RunSpec): Promise<Text<RunOutcome>>;
  async run(argv: string[], spec: RunSpec = {}): Promise<RunOutcome | Text<RunOutcome>> {
    const core = this.lab.core;
    const tried = new Set<string>();
    for (;;) {
      const node = await core.placeRun(this.name, tried);
      try {
        return await onNode(node, () => this.lab.remote(node).pool(this.name).run(argv, spec));
      } catch (e) {
        if (!(e as { connect?: boolean }).connect || tried.size) throw e;
        tried.add(node);
      } finally {
        core.runDone(node, this.name);
      }
    }
  }

  take(): Promise<SandboxApi> {
    return this.lab.create({ pool: this.name, timeoutS: 0 });
  }

  /** The nodes that hold it. */
  private async holders(): Promise<string[]> {
    const nodes = (await this.lab.fromEach((lab) => lab.pool(this.name).stats())).done.map((d) => d.node);
    if (!nodes.length) throw this.notFound();
    return nodes;
  }

  private async onHolders<T>(call: (pool: PoolApi) => Promise<T>): Promise<T[]> {
    const names = new Set(await this.holders());
    const nodes = [...this.lab.core.view.nodes.values()].filter((n) => names.has(n.name));
    const { done, refused } = await this.lab.fromEach((lab) => call(lab.pool(this.name)), nodes, false);
    if (refused.length) throw refusedBy(refused);
    return done.map((d) => d.value);
  }

  /**
   * The takes of its standbys on every node that holds it. A cluster's cursor is a time (ms since
   * the epoch), not one node's place in its traces: `after` gives the takes that started after it,
   * `next` is the latest start seen (or the first ask's time).
   */
  async takes(from: { after?: number; since?: number } = {}): Promise<PoolTakes> {
    const now = Date.now();
    const since = from.after !== undefined ? Math.min(86_400_000, Math.max(0, now - from.after) + 60_000) : from.since;
    const { done } = await this.lab.fromEach((lab) => lab.pool(this.name).takes({ since }));
    if (!done.length) throw this.notFound();
    const takes = done
      .flatMap((d) => d.value.takes)
      .filter((t) => from.after === undefined || t.at > from.after)
      .sort((a, b) => a.at - b.at);
    return { now, next: takes.reduce((m, t) => Math.max(m, t.at), from.after ?? (takes.length ? 0 : now)), takes };
  }

  async resize(size: number): Promise<void> {
    await this.onHolders((p) => p.resize(size));
  }

  async remove(): Promise<number> {
    return (await this.onHolders((p) => p.remove())).reduce((a, n) => a + n, 0);
  }
}
