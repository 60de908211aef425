import type { Command } from 'commander';
import type { ClusterStore } from '../cluster/store.js';
import { SnaplabError } from '../errors.js';
import { EXIT_USAGE, printJson, printTable, reportError } from './output.js';

/** Run `fn` with the cluster's store open; errors reported as every command reports them. */
export async function withCluster(
  url: string | undefined,
  json: boolean | undefined,
  fn: (store: ClusterStore) => Promise<void>,
): Promise<void> {
  let store: ClusterStore | undefined;
  try {
    const where = url ?? process.env.SNAPLAB_CLUSTER;
    if (!where)
      throw new SnaplabError(
        'BAD_INPUT',
        'no cluster given',
        'give --cluster etcd://HOST:PORT[,…] (or set SNAPLAB_CLUSTER)',
      );
    const { ClusterStore } = await import('../cluster/store.js');
    store = await ClusterStore.open(where);
    await fn(store);
  } catch (e) {
    reportError(e, json ?? false);
    process.exitCode = EXIT_USAGE;
  } finally {
    store?.close();
  }
}

const gib = (b: number): string => `${(b / 2 ** 30).toFixed(1)}G`;

export function registerCluster(program: Command): void {
  const cluster = program.command('cluster').description('a cluster of node daemons behind gateways (docs/cluster.md)');
  cluster
    .command('nodes')
    .description('the nodes that are up: capacity, sandboxes, ready standbys, labels, drains')
    .option('--cluster <etcd://host:port,…>', "the cluster's etcd members (default $SNAPLAB_CLUSTER)")
    .option('--json', 'print JSON')
    .action((o: { cluster?: string; json?: boolean }) =>
      withCluster(o.cluster, o.json, async (store) => {
        const [nodes, drained, sandboxes] = await Promise.all([store.nodes(), store.drained(), store.sandboxes()]);
        const lost = sandboxes.filter((s) => s.state === 'lost').length;
        if (o.json) return printJson({ nodes: nodes.map((n) => ({ ...n, drained: drained.has(n.name) })), lost });
        printTable(
          ['NODE', 'URL', 'STATE', 'SANDBOXES', 'READY', 'CORES', 'MEMORY FREE', 'DISK FREE', 'LABELS'],
          nodes.map((n) => [
            n.name,
            n.url,
            drained.has(n.name) ? 'drained' : 'up',
            n.sandboxes,
            Object.entries(n.pools)
              .map(([p, v]) => `${p}:${v.ready}/${v.size}`)
              .join(',') || '-',
            n.capacity.cores,
            gib(n.capacity.memoryFreeBytes),
            gib(n.capacity.diskFreeBytes),
            Object.entries(n.labels)
              .map(([k, v]) => `${k}=${v}`)
              .join(',') || '-',
          ]),
        );
        if (lost)
          process.stderr.write(
            `${lost} sandbox(es) lost with nodes that lapsed (GET /sandboxes on a gateway lists them)\n`,
          );
      }),
    );
  cluster
    .command('drain <node>')
    .description('stop placing new sandboxes on a node (its own keep running until they end); --undo places again')
    .option('--undo', 'take new sandboxes again')
    .option('--cluster <etcd://host:port,…>', "the cluster's etcd members (default $SNAPLAB_CLUSTER)")
    .option('--json', 'print JSON')
    .action((node: string, o: { cluster?: string; json?: boolean; undo?: boolean }) =>
      withCluster(o.cluster, o.json, async (store) => {
        await store.setDrain(node, !o.undo);
        const left = (await store.sandboxes()).filter((s) => s.node === node && s.state !== 'lost').length;
        if (o.json) return printJson({ node, drained: !o.undo, sandboxes: left });
        process.stderr.write(
          o.undo
            ? `node ${node} takes new sandboxes again\n`
            : `node ${node} is drained: no new sandboxes; ${left} still there\n`,
        );
      }),
    );
}
