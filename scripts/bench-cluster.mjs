#!/usr/bin/env node
// The cluster's figures (docs/cluster.md, "Figures"), on one host: a 3-member etcd on 127.0.0.1,
// 3 node daemons with homes of their own, one gateway. Then, in the same run:
//   1. `snaplab bench --workload fresh-exec` through the gateway (3 nodes) against one node direct;
//   2. placement time (the gateway's own measure, /metrics) with 100 and 1000 sandboxes registered.
// Usage: node scripts/bench-cluster.mjs [--duration S] [--ladder 1,4,8] [--results DIR] [--placement-only]
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Etcd3 } from 'etcd3';

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const duration = arg('duration', '8');
const ladder = arg('ladder', '1,4,8');
const results = arg('results', undefined);
const procs = [];
const dirs = [];

const freePort = () =>
  new Promise((resolve) => {
    const s = createServer();
    s.listen(0, '127.0.0.1', () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
  });

function start(cmd, args, env = {}) {
  const p = spawn(cmd, args, { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  procs.push(p);
  let err = '';
  p.stderr.on('data', (b) => (err = (err + b).slice(-4000)));
  return new Promise((resolve, reject) => {
    let out = '';
    p.stdout.on('data', (b) => {
      out += b;
      if (out.includes('\n')) resolve(JSON.parse(out.split('\n')[0]));
    });
    p.once('exit', (c) => reject(new Error(`${cmd} ${args.join(' ')} exited ${c}: ${err}`)));
  });
}

const snaplab = (home, args) => {
  const r = spawnSync('snaplab', args, { env: { ...process.env, SNAPLAB_HOME: home }, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`snaplab ${args.join(' ')}: ${r.error?.message ?? r.stderr}`);
  return r.stdout;
};

async function main() {
  const dir = mkdtempSync(join(tmpdir(), 'snaplab-bench-cluster-'));
  dirs.push(dir);
  const { cluster, etcd } = await startEtcd(dir);
  const { homes, nodes, gw, clusterKey, nodeKey } = await startCluster(dir, cluster);
  console.error(`== cluster ${cluster}; gateway ${gw.url}; nodes ${nodes.map((n) => n.url).join(' ')}`);

  // 1. fresh-exec: through the gateway (3 nodes) vs node n0 direct, in one bench run
  const hostOf = (url, key) => url.replace('http://', `http://${key}@`);
  const bench = process.argv.includes('--placement-only')
    ? { status: 0, stdout: '' }
    : spawnSync(
        'snaplab',
        [
          'bench',
          '--workload',
          'fresh-exec',
          '--ladder',
          ladder,
          '--duration',
          duration,
          '--json',
          '--compare',
          `--host ${hostOf(gw.url, clusterKey)}`,
          `--host ${hostOf(nodes[0].url, nodeKey)}`,
          ...(results ? ['--results', results] : []),
        ],
        { env: { ...process.env, SNAPLAB_HOME: homes[0] }, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] },
      );
  if (bench.status !== 0) throw new Error('the fresh-exec bench failed');
  process.stdout.write(`${bench.stdout.trim()}\n`);

  // 2. placement with 100 and 1000 registered sandboxes (entries of the nodes, as nodes write them)
  const registry = await registerBenchNode(etcd);
  const placement = {};
  for (const count of [100, 1000]) placement[count] = await placementWith(count, etcd, gw, clusterKey);
  await registry.revoke();
  process.stdout.write(`${JSON.stringify({ placement }, null, 2)}\n`);
  etcd.close();
}

/** A 3-member etcd on 127.0.0.1, once it answers: its cluster URL and a client. */
async function startEtcd(dir) {
  const ports = await Promise.all(Array.from({ length: 6 }, freePort));
  const initial = [0, 1, 2].map((i) => `m${i}=http://127.0.0.1:${ports[i * 2 + 1]}`).join(',');
  for (const i of [0, 1, 2]) {
    const c = `127.0.0.1:${ports[i * 2]}`;
    const peer = `http://127.0.0.1:${ports[i * 2 + 1]}`;
    procs.push(
      spawn(
        'etcd',
        [
          '--name',
          `m${i}`,
          '--data-dir',
          join(dir, `m${i}`),
          '--listen-client-urls',
          `http://${c}`,
          '--advertise-client-urls',
          `http://${c}`,
          '--listen-peer-urls',
          peer,
          '--initial-advertise-peer-urls',
          peer,
          '--initial-cluster',
          initial,
          '--initial-cluster-state',
          'new',
          '--log-level',
          'error',
        ],
        { stdio: 'ignore' },
      ),
    );
  }
  const cluster = `etcd://${[0, 1, 2].map((i) => `127.0.0.1:${ports[i * 2]}`).join(',')}`;
  const etcd = new Etcd3({ hosts: [0, 1, 2].map((i) => `http://127.0.0.1:${ports[i * 2]}`) });
  for (let t = 0; ; t++) {
    if (
      await etcd
        .get('/x')
        .string()
        .then(
          () => true,
          () => false,
        )
    )
      break;
    if (t > 100) throw new Error('etcd did not start');
    await new Promise((r) => setTimeout(r, 200));
  }
  return { cluster, etcd };
}

/** 3 node daemons with homes of their own, one gateway, and a key for each side. */
async function startCluster(dir, cluster) {
  const homes = [0, 1, 2].map((i) => {
    const h = join(dir, `n${i}`);
    dirs.push(h);
    return h;
  });
  const nodes = [];
  for (const [i, home] of homes.entries())
    nodes.push(
      await start(
        'snaplab',
        ['serve', '--node', '--cluster', cluster, '--listen', '127.0.0.1:0', '--node-name', `n${i}`],
        { SNAPLAB_HOME: home },
      ),
    );
  const gw = await start('snaplab', ['serve', '--gateway', '--cluster', cluster, '--listen', '127.0.0.1:0']);
  const clusterKey = snaplab(homes[0], [
    'key',
    'create',
    'bench',
    '--scope',
    'read,exec,admin',
    '--cluster',
    cluster,
  ]).trim();
  const nodeKey = snaplab(homes[0], ['key', 'create', 'bench', '--scope', 'read,exec,admin']).trim();
  return { homes, nodes, gw, clusterKey, nodeKey };
}

/**
 * The registered sandboxes are a registry node's: up (under a lease), never chosen (no memory
 * free, no image), so every placement counts them and no node's sweep removes them as its own.
 */
async function registerBenchNode(etcd) {
  const registry = etcd.lease(600);
  await registry.put('/snaplab/nodes/bench-registry').value(
    JSON.stringify({
      name: 'bench-registry',
      url: 'http://127.0.0.1:9',
      labels: {},
      version: 'bench',
      pid: 0,
      home: '/nonexistent',
      startedAt: Date.now(),
      updatedAt: Date.now(),
      capacity: { cores: 1, memoryBytes: 1, memoryFreeBytes: 0, diskBytes: 1, diskFreeBytes: 0 },
      sandboxes: 0,
      pools: {},
      images: [],
      snapshots: [],
      drivers: [],
      storage: [],
    }),
  );
  return registry;
}

/** Placement and create times through the gateway with `count` sandboxes registered. */
async function placementWith(count, etcd, gw, clusterKey) {
  for (let i = 0; i < count; i++) {
    const id = `bench${String(i).padStart(7, '0')}`;
    await etcd.put(`/snaplab/sandboxes/${id}`).value(
      JSON.stringify({
        id,
        name: id,
        node: 'bench-registry',
        owner: 'bench',
        state: 'running',
        image: 'busybox',
        labels: {},
        createdAt: Date.now(),
      }),
    );
  }
  await new Promise((r) => setTimeout(r, 1000)); // the gateway's watch takes them in
  const made = [];
  const lat = [];
  for (let i = 0; i < 60; i++) {
    const t0 = performance.now();
    const r = await fetch(`${gw.url}/sandboxes`, {
      method: 'POST',
      headers: { authorization: `Bearer ${clusterKey}`, 'content-type': 'application/json' },
      body: '{}',
    });
    lat.push(performance.now() - t0);
    made.push((await r.json()).id);
  }
  const after = await metrics(gw.url, clusterKey, made.length);
  for (const id of made)
    await fetch(`${gw.url}/sandboxes/${id}`, {
      method: 'DELETE',
      headers: { authorization: `Bearer ${clusterKey}` },
    });
  await etcd.delete().prefix('/snaplab/sandboxes/bench');
  lat.sort((a, b) => a - b);
  return {
    placements: made.length,
    placementP50Ms: after.p50,
    placementP99Ms: after.p99,
    createP50Ms: lat[Math.floor(lat.length / 2)],
    createP99Ms: lat[Math.floor(lat.length * 0.99)],
  };
}

async function metrics(url, key, recent) {
  const text = await (
    await fetch(`${url}/metrics?recent=${recent}`, { headers: { authorization: `Bearer ${key}` } })
  ).text();
  const v = (re) => Number(re.exec(text)?.[1] ?? NaN);
  return {
    p50: v(/placement_ms\{quantile="0.5"\} ([\d.e-]+)/),
    p99: v(/placement_ms\{quantile="0.99"\} ([\d.e-]+)/),
    count: v(/placement_ms_count (\d+)/),
  };
}

try {
  await main();
} finally {
  for (const p of procs.reverse()) {
    p.kill('SIGTERM');
    await new Promise((r) => (p.exitCode !== null ? r() : p.once('exit', r)));
  }
  // each home emptied through snaplab (its btrfs pool is unmounted once it holds nothing), then removed
  let mounted = false;
  for (const h of dirs.slice(1)) {
    for (const args of [['rm', '--all'], ['image', 'rm', '--force', 'busybox'], ['gc']])
      spawnSync('snaplab', args, { env: { ...process.env, SNAPLAB_HOME: h } });
    mounted ||= spawnSync('findmnt', ['-rn', '-o', 'TARGET'])
      .stdout.toString()
      .split('\n')
      .some((m) => m.startsWith(h));
  }
  if (mounted)
    console.error(`left ${dirs[0]}: something is still mounted under it (run snaplab gc with SNAPLAB_HOME there)`);
  else rmSync(dirs[0], { recursive: true, force: true });
}
