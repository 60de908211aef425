import { resolve } from 'node:path';
import { InvalidArgumentError, type Command } from 'commander';
import { createHash } from 'node:crypto';
import { hostname } from 'node:os';
import { DAEMON_DEFAULTS } from '../defaults.js';
import { SnaplabError } from '../errors.js';
import { DEFAULT_HOME, envHome } from '../lab/home.js';
import { keyValues } from '../lab/io/exec.js';
import { checkLabels } from '../lab/meta.js';
import { EXIT_USAGE, reportError } from './output.js';
import type { ConnectionLimits } from '../server/limits.js';

export const int =
  (flag: string) =>
  (v: string): number => {
    const n = Number(v);
    if (!Number.isSafeInteger(n) || n < 0)
      throw new InvalidArgumentError(`${flag} takes a whole number ≥ 0, not ${JSON.stringify(v)}`);
    return n;
  };

interface ServeCli {
  socket?: string;
  listen?: string;
  e2bListen?: string;
  jsonLogs?: boolean;
  defaultTimeout: number;
  execTimeout: number;
  benchDir?: string;
  cluster?: string;
  node?: boolean;
  nodeName?: string;
  labels?: string;
  advertise?: string;
  leaseTtl: number;
  gateway?: boolean;
  choices: number;
  maxConnections?: number;
  maxUnauthenticatedPerPeer?: number;
  maxUnauthenticated?: number;
  maxStreamsPerKey?: number;
  headersTimeout?: number;
  requestTimeout?: number;
  keepAliveTimeout?: number;
  fdReserve?: number;
}

export function registerServe(program: Command): void {
  serveOptions(
    program
      .command('serve')
      .description(
        'run the API daemon in the foreground: a Unix socket (no key needed) and, with --listen, TCP with API keys (docs/api.md)',
      ),
  ).action(runServe);
}

function serveOptions(cmd: Command): Command {
  cmd
    .option('--socket <path>', 'Unix socket (default $SNAPLAB_HOME/daemon.sock, mode 0600)')
    .option('--listen <host:port>', 'also listen on TCP, bearer keys required (e.g. 127.0.0.1:7070)')
    .option(
      '--e2b-listen <host:port>',
      "also serve E2B's API and envd for code written for E2B's SDK (docs/e2b.md; e.g. 127.0.0.1:3000)",
    )
    .option('--json-logs', 'one JSON object per log line (stderr)')
    .option(
      '--default-timeout <s>',
      'TTL of a sandbox whose create gives none (0: none)',
      int('--default-timeout'),
      DAEMON_DEFAULTS.defaultTimeoutS,
    )
    .option(
      '--exec-timeout <ms>',
      'deadline of an exec whose request gives none (0: none)',
      int('--exec-timeout'),
      DAEMON_DEFAULTS.execTimeoutMs,
    )
    .option(
      '--bench-dir <dir>',
      'the dashboard shows the `bench --results` directories in here (default $SNAPLAB_HOME/bench)',
    )
    .option('--cluster <etcd://host:port,…>', "the cluster's etcd members (docs/cluster.md; default $SNAPLAB_CLUSTER)")
    .option('--node', 'join the cluster as a node: register under a lease, take work from gateways (needs --listen)')
    .option(
      '--node-name <name>',
      "this node's name in the cluster (default: the host name, and a hash of SNAPLAB_HOME when it is not the default)",
    )
    .option('--labels <k=v,…>', "the node's labels, for `placement: {labels}`")
    .option('--advertise <url>', 'the URL gateways reach this node at (default: the --listen address)')
    .option(
      '--lease-ttl <s>',
      'seconds without a keep-alive before the node is out and its sandboxes are lost',
      int('--lease-ttl'),
      10,
    )
    .option('--gateway', "serve the cluster's API in front of its nodes (no lab of its own; needs --listen)")
    .option('--choices <k>', 'a gateway places each create on the best of K random candidates', int('--choices'), 2);
  return limitOptions(cmd);
}

/** The TCP listener's limits (server/limits.ts; defaults in docs/api.md, Limits). */
function limitOptions(cmd: Command): Command {
  return cmd
    .option(
      '--max-connections <n>',
      'TCP connections at once (default 4096, kept below the fd limit)',
      int('--max-connections'),
    )
    .option(
      '--max-unauthenticated-per-peer <n>',
      'TCP connections without a valid key yet from one address (default 128)',
      int('--max-unauthenticated-per-peer'),
    )
    .option(
      '--max-unauthenticated <n>',
      'TCP connections without a valid key yet (default 512)',
      int('--max-unauthenticated'),
    )
    .option(
      '--max-streams-per-key <n>',
      'WebSocket and event streams open at once per key (default 64)',
      int('--max-streams-per-key'),
    )
    .option(
      '--headers-timeout <ms>',
      "a request's headers must arrive within this (default 10000)",
      int('--headers-timeout'),
    )
    .option(
      '--request-timeout <ms>',
      'a whole request, body included (default 600000; 0: none)',
      int('--request-timeout'),
    )
    .option(
      '--keep-alive-timeout <ms>',
      'an idle keep-alive connection closes after this (default 5000)',
      int('--keep-alive-timeout'),
    )
    .option(
      '--fd-reserve <n>',
      'file descriptors kept from TCP for the daemon (default: a quarter of its limit)',
      int('--fd-reserve'),
    );
}

function limitsOf(o: ServeCli): Partial<ConnectionLimits> {
  return {
    maxConnections: o.maxConnections,
    maxUnauthenticatedPerPeer: o.maxUnauthenticatedPerPeer,
    maxUnauthenticated: o.maxUnauthenticated,
    maxStreamsPerKey: o.maxStreamsPerKey,
    headersTimeoutMs: o.headersTimeout,
    requestTimeoutMs: o.requestTimeout,
    keepAliveTimeoutMs: o.keepAliveTimeout,
    fdReserve: o.fdReserve,
  };
}

async function runServe(o: ServeCli): Promise<void> {
  try {
    const cluster = o.cluster ?? process.env.SNAPLAB_CLUSTER;
    if ((o.node || o.gateway) && !cluster)
      throw new SnaplabError(
        'BAD_INPUT',
        `--${o.node ? 'node' : 'gateway'} needs --cluster`,
        'give --cluster etcd://HOST:PORT[,…] (or set SNAPLAB_CLUSTER)',
      );
    if (o.node && o.gateway)
      throw new SnaplabError(
        'BAD_INPUT',
        '--node and --gateway are two processes',
        'run a gateway and each node separately',
      );
    if (o.gateway) return await runGateway(cluster!, o);
    const { serve } = await import('../server/serve.js');
    const node = o.node
      ? {
          cluster: cluster!,
          name: o.nodeName ?? defaultNodeName(),
          labels: parseLabels(o.labels),
          advertise: o.advertise,
          leaseTtlS: o.leaseTtl,
        }
      : undefined;
    if (o.leaseTtl < 2)
      throw new SnaplabError('BAD_INPUT', '--lease-ttl is at least 2 s', 'a node renews its lease 4 times per TTL');
    const server = await serve({
      socket: o.socket,
      listen: o.listen,
      e2bListen: o.e2bListen,
      jsonLogs: o.jsonLogs,
      defaultTimeoutS: o.defaultTimeout,
      execTimeoutMs: o.execTimeout,
      benchDir: o.benchDir && resolve(o.benchDir),
      node,
      limits: limitsOf(o),
    });
    process.stdout.write(
      `${JSON.stringify({ socket: server.socket, url: server.url, ...(server.e2bUrl ? { e2bUrl: server.e2bUrl } : {}), pid: process.pid, ...(node ? { node: node.name } : {}) })}\n`,
    );
    await new Promise<void>((resolve) => {
      const stop = (): void => resolve();
      process.once('SIGTERM', stop);
      process.once('SIGINT', stop);
    });
    await server.close();
  } catch (e) {
    reportError(e, false);
    process.exitCode = EXIT_USAGE;
  }
}

/** The default node name: the host's, made unique per home when several homes share it. */
function defaultNodeName(): string {
  const home = envHome();
  return home !== DEFAULT_HOME
    ? `${hostname()}-${createHash('sha256').update(home).digest('hex').slice(0, 6)}`
    : hostname();
}

/** `--labels k=v[,k=v…]`: the one KEY=VALUE parser (keyValues), each key once */
export function parseLabels(text: string | undefined): Record<string, string> {
  return checkLabels('label', keyValues((text ?? '').split(',').filter(Boolean), 'label', { unique: true }));
}

async function runGateway(cluster: string, o: ServeCli): Promise<void> {
  if (!o.listen)
    throw new SnaplabError(
      'BAD_INPUT',
      'a gateway needs --listen',
      'add --listen HOST:PORT (127.0.0.1 unless you mean another address)',
    );
  const { Gateway } = await import('../cluster/gateway.js');
  const { logger } = await import('../server/serve.js');
  const lines = logger(o.jsonLogs ?? false);
  const g = await Gateway.start({ cluster, listen: o.listen, choices: o.choices, log: lines.log, limits: limitsOf(o) });
  process.stdout.write(`${JSON.stringify({ url: g.url, pid: process.pid, role: 'gateway' })}\n`);
  lines.log({ msg: 'gateway listening', url: g.url, nodes: [...g.view.nodes.keys()] });
  await new Promise<void>((resolve) => {
    process.once('SIGTERM', () => resolve());
    process.once('SIGINT', () => resolve());
  });
  await g.close();
  lines.flush();
}
