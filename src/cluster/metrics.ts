/**
 * A gateway's own metrics (Prometheus text): the nodes up, the sandboxes recorded by state, and the
 * time to choose a node. A node's metrics are its own daemon's, on its address.
 */
import type { ClusterCore } from './core.js';

/** `recent`: the quantiles of the last N placements only (a bench reads its own). */
export function gatewayMetrics(core: ClusterCore, recent = 0): string {
  const t = (recent > 0 ? core.placements.slice(-recent) : [...core.placements]).sort((a, b) => a - b);
  const q = (p: number): number => (t.length ? t[Math.min(t.length - 1, Math.floor(p * t.length))]! : 0);
  const byState: Record<string, number> = {};
  for (const e of core.view.sandboxes.values()) byState[e.state] = (byState[e.state] ?? 0) + 1;
  const text = [
    '# HELP snaplab_gateway_nodes Nodes up in the cluster',
    '# TYPE snaplab_gateway_nodes gauge',
    `snaplab_gateway_nodes ${core.view.nodes.size}`,
    '# HELP snaplab_gateway_sandboxes Sandboxes recorded in the cluster, by state',
    '# TYPE snaplab_gateway_sandboxes gauge',
    ...Object.entries(byState).map(([s, n]) => `snaplab_gateway_sandboxes{state="${s}"} ${n}`),
    '# HELP snaplab_gateway_placement_ms Time to choose a node (recent placements)',
    '# TYPE snaplab_gateway_placement_ms summary',
    `snaplab_gateway_placement_ms{quantile="0.5"} ${q(0.5)}`,
    `snaplab_gateway_placement_ms{quantile="0.99"} ${q(0.99)}`,
    `snaplab_gateway_placement_ms_count ${t.length}`,
  ];
  return `${text.join('\n')}\n`;
}
