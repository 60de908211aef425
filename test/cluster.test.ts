/**
 * A cluster on one machine: a real 3-member etcd on 127.0.0.1 ports, 3 node daemons (each a
 * simulated host with a SNAPLAB_HOME of its own) and 2 gateways, all real processes. The contract
 * suite runs on the remote library through a gateway, and on a GatewayLab in this process (the
 * gateway's LabApi over the same nodes and etcd); then placement, one home's gc beside
 * another's, an etcd member killed, a gateway killed mid-stream, a node killed and back.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { request } from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import { connect, createServer, type AddressInfo, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Lab } from '../src/sdk/lab.js';
import type { LabApi } from '../src/sdk/api.js';
import { cli, cliAsync, sleep, startDaemon, until, type TestDaemon } from './daemon-helpers.js';
import { contractSuite } from './contract-suite.js';
import { freePort, startEtcd, type EtcdCluster } from './etcd-cluster.js';
import { Etcd3 } from 'etcd3';
import WebSocket from 'ws';
import { failureMeans, noted } from '../src/cleanup.js';
import { GatewayLab } from '../src/cluster/gateway-lab.js';

let etcd: EtcdCluster;
const homes: string[] = [];
const nodes: TestDaemon[] = [];
const gateways: TestDaemon[] = [];
let token: string;
let lab: LabApi;
let gatewayLab: GatewayLab;
const gatewayLabLog: Record<string, unknown>[] = [];
/** the GatewayLab's connect deadline: short, so that a partitioned node's test is quick */
const GATEWAY_LAB_CONNECT_MS = 2000;
/** and its answer deadline for reads: short too, but a loaded host's node answers a list well within it */
const GATEWAY_LAB_ANSWER_MS = 5000;
const LEASE_TTL_S = 3;

const startNode = (i: number): Promise<TestDaemon> =>
  startDaemon(homes[i]!, [
    '--node',
    '--cluster',
    etcd.url,
    '--node-name',
    `n${i}`,
    '--labels',
    `zone=z${i}`,
    '--lease-ttl',
    String(LEASE_TTL_S),
  ]);

async function api<T>(
  gw: TestDaemon,
  method: string,
  path: string,
  body?: unknown,
  key = token,
): Promise<{ status: number; body: T }> {
  const r = await fetch(`${gw.url}${path}`, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body ? { 'content-type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await r.text();
  return { status: r.status, body: (text ? JSON.parse(text) : null) as T };
}

/** A key of the cluster's that may read and exec, with at most `max` sandboxes: its token. */
function clusterKey(name: string, max: number): string {
  const k = cli(homes[0]!, [
    'key',
    'create',
    name,
    '--scope',
    'read,exec',
    '--max-sandboxes',
    String(max),
    '--cluster',
    etcd.url,
  ]);
  expect(k.code, k.err).toBe(0);
  return k.out.trim();
}

/** A request to a daemon on its Unix socket (no key: the socket is trusted), its answer as `api` gives it. */
async function onSocket(
  socketPath: string,
  method: string,
  path: string,
  body: unknown,
): Promise<{ status: number; body: unknown }> {
  const text = JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = request(
      {
        socketPath,
        method,
        path,
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) },
      },
      (res) => {
        let got = '';
        res.on('data', (b: Buffer) => (got += b.toString()));
        res.once('end', () => resolve({ status: res.statusCode ?? 0, body: got ? JSON.parse(got) : null }));
      },
    );
    req.once('error', reject);
    req.end(text);
  });
}

/** A node entry in etcd (n1's, as the emptiest of zone z1) whose address is `url`, for the length of `fn`. */
async function withFakeNode(name: string, url: string, fn: () => Promise<void>): Promise<void> {
  const client = new Etcd3({
    hosts: etcd.members.filter((m) => m.proc.exitCode === null && !m.proc.killed).map((m) => `http://${m.client}`),
  });
  const lease = client.lease(60);
  try {
    const n1 = gatewayLab.core.view.nodes.get('n1')!;
    const cap = n1.capacity;
    const capacity = { ...cap, memoryFreeBytes: cap.memoryBytes, diskFreeBytes: cap.diskBytes };
    await lease.put(`/snaplab/nodes/${name}`).value(JSON.stringify({ ...n1, name, url, sandboxes: 0, capacity }));
    await until(`the lab sees ${name}`, () => gatewayLab.core.view.nodes.has(name));
    await fn();
  } finally {
    await lease.revoke();
    client.close();
  }
}

beforeAll(async () => {
  etcd = await startEtcd(3);
  for (let i = 0; i < 3; i++) homes.push(mkdtempSync(join(tmpdir(), `snaplab-test-cluster-n${i}-`)));
  // the nodes start at once, each in its own home (a Node start and the home's first open: seconds
  // on a loaded host); every one that started is kept for afterAll, then the first failure thrown
  const started = await Promise.allSettled([0, 1, 2].map((i) => startNode(i)));
  for (const r of started) if (r.status === 'fulfilled') nodes.push(r.value);
  const failed = started.find((r) => r.status === 'rejected');
  if (failed) throw (failed as PromiseRejectedResult).reason;
  const k = cli(homes[0]!, ['key', 'create', 'cluster-test', '--scope', 'read,exec,admin', '--cluster', etcd.url]);
  expect(k.code, k.err).toBe(0);
  token = k.out.trim();
  // K = 3: every node is scored, so the spread below does not depend on the draw
  for (let i = 0; i < 2; i++)
    gateways.push(await startDaemon(homes[0]!, ['--gateway', '--cluster', etcd.url, '--choices', '3']));
  lab = await Lab.connect({ url: gateways[0]!.url, token });
  gatewayLab = await GatewayLab.open({
    cluster: etcd.url,
    token,
    choices: 3,
    connectTimeoutMs: GATEWAY_LAB_CONNECT_MS,
    answerTimeoutMs: GATEWAY_LAB_ANSWER_MS,
    log: (l) => gatewayLabLog.push(l),
  });
}, 120_000);

afterAll(async () => {
  lab?.close();
  await gatewayLab?.core.close().catch(noted('close the gateway lab'));
  for (const g of gateways) await g.stop().catch(noted('stop a gateway'));
  for (const n of nodes) await n.stop().catch(noted('stop a node'));
  // nine CLI calls (a Node start each) per home: the homes are cleaned at once (one home's gc leaves
  // another's sandboxes alone, as a case below shows)
  const steps = [
    ['pool', 'rm', 'cpool-gateway'],
    ['pool', 'rm', 'tpool-gateway'],
    ['pool', 'rm', 'cpool-gateway-lab'],
    ['pool', 'rm', 'warm'],
    ['rm', '--all'],
    ['snapshot', 'rm', 'csnap-gateway'],
    ['snapshot', 'rm', 'csnap-gateway-lab'],
    ['image', 'rm', '--force', 'busybox'],
    ['gc'],
  ];
  await Promise.all(
    homes.map(async (h) => {
      for (const args of steps) await cliAsync(h, args, 120_000);
      rmSync(h, { recursive: true, force: true });
    }),
  );
  await etcd?.stop();
}, 300_000);

describe('through a gateway, the library', () => contractSuite('gateway', () => lab));

describe("in this process, the GatewayLab (placement, then the nodes' remote labs)", () =>
  contractSuite('gateway-lab', () => gatewayLab));

describe('a cluster', () => {
  it('serves the CLI unchanged (SNAPLAB_HOST=the gateway)', () => {
    const viaGateway = (args: string[]): { code: number; out: string; err: string } =>
      cli(homes[0]!, args, undefined, { SNAPLAB_HOST: gateways[1]!.url, SNAPLAB_TOKEN: token });
    const made = viaGateway(['create', '--name', 'through-cli', '--json']);
    expect(made.code, made.err).toBe(0);
    expect(viaGateway(['exec', 'through-cli', '--', 'echo', 'hi']).out).toBe('hi\n');
    const ls = viaGateway(['ls', '--json']);
    expect(ls.code, ls.err).toBe(0);
    expect((JSON.parse(ls.out) as { name: string }[]).map((b) => b.name)).toContain('through-cli');
    expect(viaGateway(['rm', 'through-cli']).code).toBe(0);
    expect(viaGateway(['exec', 'through-cli', '--', 'true']).err).toMatch(/SANDBOX_NOT_FOUND|no sandbox/);
  });

  it('lists its nodes, each with its capacity and labels', async () => {
    const r = cli(homes[0]!, ['cluster', 'nodes', '--cluster', etcd.url, '--json']);
    expect(r.code, r.err).toBe(0);
    const v = JSON.parse(r.out) as {
      nodes: { name: string; labels: Record<string, string>; capacity: { cores: number; memoryBytes: number } }[];
    };
    expect(v.nodes.map((n) => n.name).sort()).toEqual(['n0', 'n1', 'n2']);
    for (const n of v.nodes) {
      expect(n.labels.zone).toBe(`z${n.name.slice(1)}`);
      expect(n.capacity.cores).toBeGreaterThan(0);
      expect(n.capacity.memoryBytes).toBeGreaterThan(0);
    }
    // a second node under a taken name is refused (another home holds it)
    const dupHome = mkdtempSync(join(tmpdir(), 'snaplab-test-cluster-dup-'));
    const dup = await startDaemon(dupHome, ['--node', '--cluster', etcd.url, '--node-name', 'n0']).then(
      async (d) => {
        await d.stop();
        return 'started';
      },
      (e: Error) => e.message,
    );
    rmSync(dupHome, { recursive: true, force: true });
    expect(dup).toMatch(/NODE_EXISTS|a node named n0 is in the cluster/);
  });

  it("spreads creates by the score, honours labels, and uses a pool's standbys where they are", async () => {
    // a node that has the image scores above one that has not: give each node the image first
    for (let i = 0; i < 3; i++) {
      const b = await api<{ id: string; node: string }>(gateways[0]!, 'POST', '/sandboxes', {
        placement: { labels: { zone: `z${i}` } },
      });
      expect(b.body.node).toBe(`n${i}`);
      await api(gateways[0]!, 'DELETE', `/sandboxes/${b.body.id}`);
    }
    await until('every node says it has the image', async () =>
      (await api<{ images: string[] }[]>(gateways[1]!, 'GET', '/cluster/nodes')).body.every((n) =>
        n.images.includes('busybox'),
      ),
    );
    // what a gateway's view says the nodes hold (their entries, each written after its sandboxes' own)
    const held = async (gw: TestDaemon): Promise<number> =>
      (await api<{ sandboxes: number }[]>(gw, 'GET', '/cluster/nodes')).body.reduce((a, n) => a + n.sandboxes, 0);
    // settled: both say the same twice, 300 ms apart (a node publishes its count a moment after
    // a removal is answered, so a count read at once may still hold the image loop's last one)
    let last = -1;
    const base = await until('the nodes to settle', async () => {
      await sleep(300);
      const [a, b] = [await held(gateways[0]!), await held(gateways[1]!)];
      const settled = a === b && a === last;
      last = a === b ? a : -1;
      return settled && { n: a };
    });
    const made = [];
    for (let i = 0; i < 6; i++) {
      // the gateway placing it has seen the ones before (placement reads its view: a create answered
      // by the other gateway a moment ago may not have reached it yet, and its node would look emptier)
      await until(`gateway ${i % 2} sees ${i} made`, async () => (await held(gateways[i % 2]!)) === base.n + i);
      const r = await api<{ id: string; node: string }>(gateways[i % 2]!, 'POST', '/sandboxes', {
        labels: { spread: 'yes' },
      });
      expect(r.status, JSON.stringify(r.body)).toBe(201);
      made.push(r.body);
    }
    const per = new Map<string, number>();
    for (const m of made) per.set(m.node, (per.get(m.node) ?? 0) + 1);
    expect([...per.values()]).toEqual([2, 2, 2]);
    // placement labels pick the node
    const z2 = await api<{ node: string; id: string }>(gateways[0]!, 'POST', '/sandboxes', {
      placement: { labels: { zone: 'z2' } },
    });
    expect([z2.status, z2.body.node]).toEqual([201, 'n2']);
    const none = await api<{ code: string }>(gateways[0]!, 'POST', '/sandboxes', {
      placement: { labels: { zone: 'mars' } },
    });
    expect([none.status, none.body.code]).toEqual([503, 'NODE_UNAVAILABLE']);
    // a pool defined on n1 only: its creates go there, and take its standbys
    const op = await api<{ id: string }>(gateways[0]!, 'POST', '/pools', {
      name: 'warm',
      image: 'busybox',
      size: 2,
      placement: { labels: { zone: 'z1' } },
    });
    expect(op.status).toBe(202);
    await until(
      'the pool is ready',
      async () =>
        (await api<{ state: string }>(gateways[1]!, 'GET', `/operations/${op.body.id}?wait=5`)).body.state === 'done',
      60_000,
    );
    const taken: string[] = [];
    for (let i = 0; i < 2; i++) {
      const t = await api<{ node: string; id: string; reason: string }>(gateways[i]!, 'POST', '/sandboxes', {
        pool: 'warm',
      });
      expect([t.status, t.body.node, t.body.reason]).toEqual([201, 'n1', 'taken from pool warm']);
      taken.push(t.body.id);
    }
    for (const id of taken) await api(gateways[0]!, 'DELETE', `/sandboxes/${id}`);
    // each gateway finds each sandbox, whoever placed it
    const listed = (await api<{ id: string; node: string }[]>(gateways[1]!, 'GET', '/sandboxes?label=spread=yes')).body;
    expect(listed.map((s) => s.id).sort()).toEqual(made.map((m) => m.id).sort());
    for (const m of made.slice(0, 2))
      expect(
        (
          await api<{ exitCode: number; stdout: string }>(gateways[1]!, 'POST', `/sandboxes/${m.id}/exec`, {
            argv: ['hostname'],
          })
        ).body.exitCode,
      ).toBe(0);
    for (const m of made) expect((await api(gateways[0]!, 'DELETE', `/sandboxes/${m.id}`)).status).toBe(204);
    expect((await api(gateways[0]!, 'DELETE', `/sandboxes/${z2.body.id}`)).status).toBe(204);
  }, 180_000);

  it('keeps keys to their own sandboxes and quotas cluster-wide; a removed key loses its streams', async () => {
    const tenant = clusterKey('tenant', 2);
    const as = <T>(gw: TestDaemon, method: string, path: string, body?: unknown) =>
      api<T>(gw, method, path, body, tenant);
    // four creates at once through two gateways: the quota holds cluster-wide
    const tries = await Promise.all(
      [0, 1, 2, 3].map((i) => as<{ id: string; code?: string }>(gateways[i % 2]!, 'POST', '/sandboxes', {})),
    );
    const ok = tries.filter((t) => t.status === 201);
    expect(tries.map((t) => t.status).sort()).toEqual([201, 201, 429, 429]);
    // another key's sandbox is not found to it, however it is asked
    const admins = (await api<{ id: string }>(gateways[0]!, 'POST', '/sandboxes', {})).body;
    expect((await as<{ code: string }>(gateways[1]!, 'GET', `/sandboxes/${admins.id}`)).body.code).toBe(
      'SANDBOX_NOT_FOUND',
    );
    expect(
      (await as<{ code: string }>(gateways[1]!, 'POST', `/sandboxes/${admins.id}/exec`, { argv: ['true'] })).status,
    ).toBe(404);
    expect((await as<{ id: string }[]>(gateways[1]!, 'GET', '/sandboxes')).body.map((b) => b.id).sort()).toEqual(
      ok.map((t) => t.body.id).sort(),
    );
    // a GatewayLab bound to the key: the same sandboxes, the same quota, the same refusals
    const tenantLab = gatewayLab.as(
      await until('the lab knows the key', () => {
        try {
          return gatewayLab.core.callerOf(tenant);
        } catch {
          return undefined;
        }
      }),
    );
    expect((await tenantLab.list()).map((b) => b.id).sort()).toEqual(ok.map((t) => t.body.id).sort());
    await expect(tenantLab.get(admins.id)).rejects.toMatchObject({ code: 'SANDBOX_NOT_FOUND' });
    await expect(tenantLab.create()).rejects.toMatchObject({ code: 'QUOTA_EXCEEDED' });
    // its event stream ends once the key is removed
    const events = await fetch(`${gateways[1]!.url}/events`, { headers: { authorization: `Bearer ${tenant}` } });
    const ended = (async () => {
      for await (const _ of events.body as unknown as AsyncIterable<Uint8Array>) {
        /* drain */
      }
    })();
    expect(cli(homes[0]!, ['key', 'rm', 'tenant', '--cluster', etcd.url]).code).toBe(0);
    await expect(
      Promise.race([
        ended.then(
          () => 'ended',
          () => 'ended',
        ),
        sleep(10_000).then(() => 'still open'),
      ]),
    ).resolves.toBe('ended');
    expect((await as(gateways[0]!, 'GET', '/sandboxes')).status).toBe(401);
    await until('the lab refuses the removed key', () =>
      tenantLab.list().then(
        () => false,
        (e: { code?: string }) => e.code === 'UNAUTHORIZED',
      ),
    );
    for (const t of [...ok.map((x) => x.body.id), admins.id]) await api(gateways[0]!, 'DELETE', `/sandboxes/${t}`);
  }, 60_000);

  it('stops and starts a sandbox through a gateway: the events say stopped and started, and a stopped one still counts against its key', async () => {
    const key = clusterKey('stopper', 1);
    const as = <T>(method: string, path: string, body?: unknown) => api<T>(gateways[1]!, method, path, body, key);
    const seen: string[] = [];
    const events = new AbortController();
    const stream = fetch(`${gateways[0]!.url}/events`, {
      headers: { authorization: `Bearer ${key}` },
      signal: events.signal,
    })
      .then(async (r) => {
        for await (const chunk of r.body as unknown as AsyncIterable<Uint8Array>)
          seen.push(Buffer.from(chunk).toString());
      })
      .catch(failureMeans(undefined)); // ended by the abort
    const made = await as<{ id: string }>('POST', '/sandboxes', {});
    expect(made.status, JSON.stringify(made.body)).toBe(201);
    const id = made.body.id;
    const told = (type: string): boolean =>
      seen
        .join('')
        .split('\n\n')
        .some((block) => block.includes(`event: ${type}\n`) && block.includes(`"sandbox":"${id}"`));
    try {
      const stopped = await as<{ state: string; stopped: boolean }>('POST', `/sandboxes/${id}/stop`);
      expect([stopped.status, stopped.body.state, stopped.body.stopped]).toEqual([200, 'dead', true]);
      // the gateway's events are the node's entries as it publishes them: seen stopped before the start
      await until('the cluster events said stopped', () => told('stopped'), 20_000);
      // held: its volume and range are kept, so the key's one sandbox is taken
      const over = await as<{ code: string }>('POST', '/sandboxes', {});
      expect([over.status, over.body.code]).toEqual([429, 'QUOTA_EXCEEDED']);
      const started = await as<{ state: string }>('POST', `/sandboxes/${id}/start`);
      expect([started.status, started.body.state]).toEqual([200, 'running']);
      await until('the cluster events said started', () => told('started'), 20_000);
      // told as what it is: not a pause's resume, not an exit, not a removal and a new sandbox
      expect(['resumed', 'exited', 'destroyed'].filter(told)).toEqual([]);
    } finally {
      events.abort();
      await stream;
      await as('DELETE', `/sandboxes/${id}`);
      cli(homes[0]!, ['key', 'rm', 'stopper', '--cluster', etcd.url]);
    }
  }, 60_000);

  it("serves the daemon's own key and scenario routes over the cluster, their bodies checked by the same schemas", async () => {
    const made = await api<{ name: string; token: string; scopes: string[]; hash?: string }>(
      gateways[0]!,
      'POST',
      '/keys',
      { name: 'via-gateway', scopes: ['read'] },
    );
    expect(made.status).toBe(201);
    expect(made.body).toMatchObject({ name: 'via-gateway', scopes: ['read'] });
    expect(made.body.hash).toBeUndefined();
    // made through one gateway, known to the other (etcd): it reads, and may not make keys
    const listed = await until('the other gateway knows the key', async () => {
      const r = await fetch(`${gateways[1]!.url}/keys`, { headers: { authorization: `Bearer ${made.body.token}` } });
      return r.status === 403 ? r : undefined;
    });
    expect(((await listed.json()) as { code: string }).code).toBe('FORBIDDEN');
    const keys = (await api<{ name: string; hash?: string }[]>(gateways[1]!, 'GET', '/keys')).body;
    expect(keys.find((k) => k.name === 'via-gateway')).toMatchObject({ name: 'via-gateway' });
    expect(keys.every((k) => k.hash === undefined)).toBe(true);
    // a property the schema does not know is refused, as a daemon refuses it
    const bad = await api<{ code: string }>(gateways[0]!, 'POST', '/keys', { name: 'x', colour: 'red' });
    expect([bad.status, bad.body.code]).toEqual([400, 'BAD_INPUT']);
    expect((await api(gateways[0]!, 'DELETE', '/keys/via-gateway')).status).toBe(204);
    const again = await api<{ code: string }>(gateways[0]!, 'DELETE', '/keys/via-gateway');
    expect([again.status, again.body.code]).toEqual([404, 'KEY_NOT_FOUND']);
    // scenarios the same way: asked of the nodes, their bodies checked by the daemon's schema
    expect((await api<unknown[]>(gateways[0]!, 'GET', '/scenarios')).body).toEqual([]);
    const none = await api<{ code: string }>(gateways[1]!, 'GET', '/scenarios/nope');
    expect([none.status, none.body.code]).toEqual([404, 'SCENARIO_NOT_FOUND']);
    const odd = await api<{ code: string }>(gateways[0]!, 'POST', '/scenarios', { file: '/x.yaml', colour: 'red' });
    expect([odd.status, odd.body.code]).toEqual([400, 'BAD_INPUT']);
    // who the caller is, and the gateway's own metrics, through the shared routes
    expect((await api<{ key: string; gateway: boolean }>(gateways[1]!, 'GET', '/whoami')).body).toMatchObject({
      key: 'cluster-test',
      gateway: true,
    });
    const metrics = await fetch(`${gateways[0]!.url}/metrics?recent=5`, {
      headers: { authorization: `Bearer ${token}` },
    });
    expect(await metrics.text()).toContain('snaplab_gateway_nodes 3');
    // usage: each node's machines, each with its node
    const box = (await api<{ id: string; node: string }>(gateways[0]!, 'POST', '/sandboxes', {})).body;
    const usage = (await api<{ id: string; node: string }[]>(gateways[1]!, 'GET', '/usage')).body;
    expect(usage.find((u) => u.id === box.id)).toMatchObject({ id: box.id, node: box.node });
    // a page's usage: those ids only, from whichever node holds each
    const page = (await api<{ id: string; node: string }[]>(gateways[1]!, 'GET', `/usage?id=${box.id},nope`)).body;
    expect(page.map((u) => [u.id, u.node])).toEqual([[box.id, box.node]]);
    // a relabel reaches the cluster's entry on the node's next heartbeat, which reads the store's
    // changes, not every record (a full comparison is a minute apart: this waits 10 s)
    await until('its entry written', () => gatewayLab.core.view.sandboxes.get(box.id)?.state === 'running');
    await sleep(2500); // past the publishes its create's events asked for, and a heartbeat
    const patched = await api(gateways[0]!, 'PATCH', `/sandboxes/${box.id}`, { labels: { relabelled: 'yes' } });
    expect(patched.status, JSON.stringify(patched.body)).toBe(200);
    await until(
      'the new label in its entry',
      () => gatewayLab.core.view.sandboxes.get(box.id)?.labels.relabelled,
      10_000,
    );
    expect((await api(gateways[0]!, 'DELETE', `/sandboxes/${box.id}`)).status).toBe(204);
  });

  it("serves a sandbox's own calls by the daemon's routes: a daemon's document, its refusals, its WebSocket checks", async () => {
    // the gateway's document is its own app's: a daemon's paths, and the cluster's one route, but
    // the dashboard's bench results, which are a node's host's (the gateway refuses them)
    const doc = async (url: string) =>
      (await (await fetch(`${url}/openapi.json`)).json()) as { paths: Record<string, Record<string, unknown>> };
    const [gw, node] = [await doc(gateways[0]!.url), await doc(nodes[0]!.url)];
    const dashboard = ['/bench', '/bench/{name}'];
    expect(Object.keys(node.paths)).toEqual(expect.arrayContaining(dashboard));
    expect(Object.keys(gw.paths).sort()).toEqual(
      [...Object.keys(node.paths).filter((p) => !dashboard.includes(p)), '/cluster/nodes'].sort(),
    );
    expect(gw.paths['/sandboxes/{id}/exec']).toEqual(node.paths['/sandboxes/{id}/exec']);
    expect(gw.paths['/sandboxes/{id}/files']).toEqual(node.paths['/sandboxes/{id}/files']);
    // a body a daemon refuses on a sandbox's call, the gateway refuses with the same answer
    const box = (await api<{ id: string; node: string }>(gateways[0]!, 'POST', '/sandboxes', {})).body;
    const home = nodes[Number(box.node.slice(1))]!;
    for (const [method, path, body] of [
      ['POST', `/sandboxes/${box.id}/exec`, { argv: ['true'], colour: 'red' }],
      ['POST', `/sandboxes/${box.id}/exec`, { argv: [] }],
      ['POST', `/sandboxes/${box.id}/exec`, { argv: ['true'], timeoutMs: -5 }],
      ['POST', `/sandboxes/${box.id}/timeout`, { timeoutS: -1 }],
      ['PATCH', `/sandboxes/${box.id}`, { labels: { a: { b: 1 } } }],
    ] as const) {
      const viaGateway = await api(gateways[1]!, method, path, body);
      const daemon = await onSocket(home.socket, method, path, body);
      expect(viaGateway.status, `${method} ${path}`).toBe(400);
      expect(viaGateway).toEqual(daemon);
    }
    // refused by the gateway's own route: the node saw only the requests made to it directly
    const refusedHere = (): number =>
      home
        .log()
        .split('\n')
        .filter((l) => l.includes(`/sandboxes/${box.id}`) && / 400 /.test(l)).length;
    await until('the node logged its refusals', () => refusedHere() >= 5);
    expect(refusedHere()).toBe(5);
    // and what it takes, its node serves: a one-shot exec, a file up and down, its labels
    const ran = await api<{ stdout: string }>(gateways[1]!, 'POST', `/sandboxes/${box.id}/exec`, {
      argv: ['sh', '-c', 'echo hi'],
    });
    expect([ran.status, ran.body.stdout]).toEqual([200, 'hi\n']);
    const auth = { authorization: `Bearer ${token}` };
    const put = await fetch(`${gateways[0]!.url}/sandboxes/${box.id}/files?path=/tmp/f`, {
      method: 'PUT',
      headers: { ...auth, 'content-type': 'application/octet-stream' },
      body: 'bytes through the gateway',
    });
    expect(await put.json()).toEqual({ bytes: 25 });
    const got = await fetch(`${gateways[1]!.url}/sandboxes/${box.id}/files?path=/tmp/f`, { headers: auth });
    expect(await got.text()).toBe('bytes through the gateway');
    const patched = await api<{ labels: Record<string, string> }>(gateways[0]!, 'PATCH', `/sandboxes/${box.id}`, {
      labels: { via: 'gateway' },
    });
    expect(patched.body.labels).toEqual({ via: 'gateway' });
    // a WebSocket's query is checked by its route's schema before anything is joined, as a daemon's
    const refused = await new Promise<number>((resolve, reject) => {
      const ws = new WebSocket(
        `${gateways[0]!.url.replace('http', 'ws')}/sandboxes/${box.id}/processes/p1/attach?offset=-1`,
        {
          headers: auth,
        },
      );
      // answered before any switch: its status read, the request let go
      ws.once('unexpected-response', (req, res) => {
        resolve(res.statusCode ?? 0);
        req.destroy();
      });
      ws.once('open', () => reject(new Error('joined')));
      ws.once('error', reject);
    });
    expect(refused).toBe(400);
    // a WebSocket route asked without an upgrade: what a daemon answers
    expect((await fetch(`${gateways[0]!.url}/sandboxes/${box.id}/exec`, { headers: auth })).status).toBe(404);
    // the dashboard is a node's
    const dash = await fetch(`${gateways[0]!.url}/`);
    expect([dash.status, ((await dash.json()) as { code: string }).code]).toEqual([400, 'BAD_INPUT']);
    expect((await api(gateways[0]!, 'DELETE', `/sandboxes/${box.id}`)).status).toBe(204);
  }, 60_000);

  it('a create placed on a node that refuses connections is retried once elsewhere; bad /rpc frames are errors, not crashes', async () => {
    // a node entry whose address nobody listens on, the emptiest of zone z1: placement picks it
    const client = new Etcd3({
      hosts: etcd.members.filter((m) => m.proc.exitCode === null && !m.proc.killed).map((m) => `http://${m.client}`),
    });
    const lease = client.lease(30);
    const n1 = (await api<Record<string, unknown>[]>(gateways[0]!, 'GET', '/cluster/nodes')).body.find(
      (n) => n.name === 'n1',
    )!;
    const cap = n1.capacity as Record<string, number>;
    const ghost = {
      ...n1,
      name: 'ghost',
      url: `http://127.0.0.1:${await freePort()}`,
      sandboxes: 0,
      capacity: { ...cap, memoryFreeBytes: cap.memoryBytes, diskFreeBytes: cap.diskBytes },
    };
    await lease.put('/snaplab/nodes/ghost').value(JSON.stringify(ghost));
    try {
      await until('the gateway sees the ghost', async () =>
        (await api<{ name: string }[]>(gateways[0]!, 'GET', '/cluster/nodes')).body.some((n) => n.name === 'ghost'),
      );
      const c = await api<{ node: string; id: string }>(gateways[0]!, 'POST', '/sandboxes', {
        placement: { labels: { zone: 'z1' } },
      });
      expect([c.status, c.body.node]).toEqual([201, 'n1']);
      expect(gateways[0]!.log()).toMatch(/create retried on another node.*"from":"ghost","to":"n1"/);
      await api(gateways[0]!, 'DELETE', `/sandboxes/${c.body.id}`);
      // the GatewayLab's create is placed and retried by the same code
      await until('the lab sees the ghost', () => gatewayLab.core.view.nodes.has('ghost'));
      const viaLab = await gatewayLab.create({ placement: { labels: { zone: 'z1' } } });
      expect(viaLab.toJSON().node).toBe('n1');
      expect(gatewayLabLog).toContainEqual(expect.objectContaining({ from: 'ghost', to: 'n1' }));
      await viaLab.destroy();
    } finally {
      await lease.revoke();
      client.close();
    }
    // frames a client may send by mistake or malice: answered with errors, the gateway lives on
    const ws = new WebSocket(`${gateways[0]!.url.replace('http', 'ws')}/rpc`, {
      headers: { authorization: `Bearer ${token}` },
    });
    await new Promise((r, j) => {
      ws.once('open', r);
      ws.once('error', j);
    });
    const answers: string[] = [];
    ws.on('message', (d) => answers.push(String(d)));
    for (const f of ['null', '[1]', '{}', '{"op":"exec"}', '{"id":1,"op":"exec","sandbox":"no-such","argv":["true"]}'])
      ws.send(f);
    ws.send(Buffer.from([1, 2, 3]), { binary: true });
    await until('every frame answered', () => answers.length === 6);
    expect(answers.map((a) => (JSON.parse(a) as { error?: { code: string } }).error?.code).sort()).toEqual([
      'BAD_INPUT',
      'BAD_INPUT',
      'BAD_INPUT',
      'BAD_INPUT',
      'BAD_INPUT',
      'SANDBOX_NOT_FOUND',
    ]);
    ws.close();
    await new Promise((r) => ws.once('close', r));
    expect((await fetch(`${gateways[0]!.url}/healthz`)).status).toBe(200);
  }, 60_000);

  it("a GatewayLab's create on a node that never accepts the connection (a partition) is retried elsewhere at its connect deadline", async () => {
    // a listener that never accepts, its queue full: a further connection is never made (its SYN is dropped)
    const mute = spawn(
      'python3',
      [
        '-c',
        'import socket,time\ns=socket.socket()\ns.bind(("127.0.0.1",0))\ns.listen(0)\nprint(s.getsockname()[1],flush=True)\ntime.sleep(300)',
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    const port = Number(String((await once(mute.stdout!, 'data'))[0]).trim());
    const fill = [0, 1, 2].map(() => connect(port, '127.0.0.1').on('error', () => {}));
    try {
      await withFakeNode('mute', `http://127.0.0.1:${port}`, async () => {
        const t0 = Date.now();
        const box = await gatewayLab.create({ placement: { labels: { zone: 'z1' } } });
        expect(box.toJSON().node).toBe('n1');
        expect(Date.now() - t0).toBeGreaterThanOrEqual(GATEWAY_LAB_CONNECT_MS);
        expect(gatewayLabLog).toContainEqual(
          expect.objectContaining({ from: 'mute', to: 'n1', error: expect.stringMatching(/no connection within/) }),
        );
        await box.destroy();
      });
    } finally {
      for (const f of fill) f.destroy();
      mute.kill();
    }
  }, 60_000);

  it("a GatewayLab's fan-out leaves out a node that accepts and does not answer, at its answer deadline", async () => {
    const held: Socket[] = [];
    const hung = createServer((c) => held.push(c));
    await new Promise<void>((r) => hung.listen(0, '127.0.0.1', r));
    try {
      await withFakeNode('hung', `http://127.0.0.1:${(hung.address() as AddressInfo).port}`, async () => {
        const box = await gatewayLab.create({ name: 'beside-hung', placement: { labels: { zone: 'z0' } } });
        try {
          const t0 = Date.now();
          expect((await gatewayLab.list()).map((b) => b.name)).toContain('beside-hung');
          expect(Date.now() - t0).toBeGreaterThanOrEqual(GATEWAY_LAB_ANSWER_MS - 100);
          expect(gatewayLabLog).toContainEqual(
            expect.objectContaining({ node: 'hung', error: expect.stringMatching(/no answer from .* within 5 s/) }),
          );
        } finally {
          await box.destroy();
        }
      });
    } finally {
      for (const c of held) c.destroy();
      hung.close();
    }
  }, 60_000);

  it("one home's gc leaves another home's sandboxes alone", async () => {
    const box = await (lab as Awaited<ReturnType<typeof Lab.connect>>).create({
      name: 'other-home',
      placement: { labels: { zone: 'z1' } },
    });
    expect((await api<{ node: string }>(gateways[0]!, 'GET', '/sandboxes/other-home')).body.node).toBe('n1');
    // n0's and n2's gc, with n1's sandbox running beside them on this host
    for (const h of [homes[0]!, homes[2]!]) expect(cli(h, ['gc']).code).toBe(0);
    expect((await box.exec(['echo', 'alive'])).stdout).toBe('alive\n');
    await box.destroy();
  }, 60_000);

  it('keeps working when an etcd member dies', async () => {
    await etcd.members[0]!.kill();
    const box = await lab.create({ name: 'after-etcd' });
    expect((await box.exec(['echo', 'ok'])).stdout).toBe('ok\n');
    // the nodes keep their leases through it: all still in after more than a lease time
    await sleep((LEASE_TTL_S + 1) * 1000);
    const r = await api<{ name: string }[]>(gateways[1]!, 'GET', '/cluster/nodes');
    expect(r.body.map((n) => n.name).sort()).toEqual(['n0', 'n1', 'n2']);
    await box.destroy();
  }, 60_000);

  it('a gateway killed mid-stream: the client gets a clear error, the other gateway serves the next call', async () => {
    const box = await lab.create({ name: 'streamed' });
    let seen = '';
    // its outcome taken at once: the rejection comes while the gateway is being killed
    const outcome = box
      .exec(['sh', '-c', 'echo started; exec sleep 60'], { onStdout: (b) => (seen += b.toString()) })
      .then(
        () => 'it ended',
        (e: unknown) => e,
      );
    await until('the stream started', () => seen.includes('started'));
    await gateways[0]!.kill9();
    expect(await outcome).toMatchObject({ code: 'DAEMON_UNREACHABLE' });
    const other = await Lab.connect({ url: gateways[1]!.url, token });
    try {
      const again = await other.get('streamed');
      expect((await again.exec(['echo', 'served'])).stdout).toBe('served\n');
      // the stream's command went with its connection
      await until(
        'the command was killed',
        async () => !(await again.exec(['ps'])).stdout.includes('sleep 60'),
        10_000,
      );
      await again.destroy();
    } finally {
      other.close();
    }
    gateways[0] = await startDaemon(homes[0]!, ['--gateway', '--cluster', etcd.url, '--choices', '3']);
  }, 60_000);

  it('a node killed: its sandboxes are lost within the lease time, creates avoid it, and it collects them when back', async () => {
    const g = gateways[1]!;
    const events = new AbortController();
    const seen: string[] = [];
    const stream = fetch(`${g.url}/events`, { headers: { authorization: `Bearer ${token}` }, signal: events.signal })
      .then(async (r) => {
        for await (const chunk of r.body as unknown as AsyncIterable<Uint8Array>)
          seen.push(Buffer.from(chunk).toString());
      })
      .catch(failureMeans(undefined)); // the stream ends with an error when its node goes
    const doomed = (
      await api<{ id: string; name: string; node: string }>(g, 'POST', '/sandboxes', {
        placement: { labels: { zone: 'z2' } },
      })
    ).body;
    const forgotten = (
      await api<{ id: string; name: string; node: string }>(g, 'POST', '/sandboxes', {
        placement: { labels: { zone: 'z2' } },
      })
    ).body;
    expect([doomed.node, forgotten.node]).toEqual(['n2', 'n2']);
    const killedAt = Date.now();
    await nodes[2]!.kill9();
    const lost = await until(
      'the sandbox is reported lost',
      async () => {
        const s = (await api<{ id: string; state: string; reason: string }[]>(g, 'GET', '/sandboxes')).body.find(
          (x) => x.id === doomed.id,
        );
        return s?.state === 'lost' ? s : undefined;
      },
      20_000,
    );
    expect(Date.now() - killedAt).toBeLessThan((LEASE_TTL_S + 5) * 1000);
    expect(lost.reason).toMatch(/node n2 stopped answering/);
    const exec = await api<{ code: string }>(g, 'POST', `/sandboxes/${doomed.id}/exec`, { argv: ['true'] });
    expect([exec.status, exec.body.code]).toEqual([410, 'SANDBOX_LOST']);
    // the GatewayLab shows it as the gateway does: lost, with why, every call refused
    const viaLab = await until('the lab sees it lost', async () => {
      const b = await gatewayLab.get(doomed.id);
      return b.state === 'lost' ? b : undefined;
    });
    expect(viaLab.reason).toMatch(/node n2 stopped answering/);
    await expect(viaLab.exec(['true'])).rejects.toMatchObject({ code: 'SANDBOX_LOST' });
    const listed = await gatewayLab.list();
    expect(listed.find((b) => b.id === doomed.id)?.state).toBe('lost');
    // its count (the nodes' counts summed, the absent ones counted from the gateway's copy) agrees
    const lostListed = listed.filter((b) => b.state === 'lost').length;
    expect(lostListed).toBeGreaterThan(0);
    expect(await gatewayLab.count()).toMatchObject({
      total: listed.length,
      byState: expect.objectContaining({ lost: lostListed }),
    });
    // a metadata filter leaves them out, a `null` ("not set") too: their metadata is their node's alone
    const unset = { metadata: { 'never-set': [null] } };
    expect((await gatewayLab.list(unset)).some((b) => b.state === 'lost')).toBe(false);
    expect((await gatewayLab.count(unset)).byState.lost).toBeUndefined();
    // new creates avoid it
    for (let i = 0; i < 3; i++) {
      const c = await api<{ node: string; id: string }>(g, 'POST', '/sandboxes', {});
      expect(c.body.node).not.toBe('n2');
      await api(g, 'DELETE', `/sandboxes/${c.body.id}`);
    }
    await until(
      'the event stream told',
      () => seen.join('').includes('event: node.lost') && seen.join('').includes('event: lost'),
    );
    events.abort();
    await stream;
    // one lost record removed by its owner (through the GatewayLab) while the node is out: gone to everyone
    await (await gatewayLab.get(forgotten.id)).destroy();
    await until('the lab has forgotten it', () =>
      gatewayLab.get(forgotten.id).then(
        () => false,
        (e: { code?: string }) => e.code === 'SANDBOX_NOT_FOUND',
      ),
    );
    await until(
      'the gateway has forgotten it',
      async () => (await api(g, 'GET', `/sandboxes/${forgotten.id}`)).status === 404,
    );
    expect((await api<{ id: string }[]>(g, 'GET', '/sandboxes')).body.map((x) => x.id)).not.toContain(forgotten.id);
    // their machines outlived their daemon; back in the cluster, the node destroys what was
    // declared lost, the removed one too (its record stayed as a tombstone for this)
    const held = (): string[] => JSON.parse(cli(homes[2]!, ['ls', '--json']).out).map((s: { id: string }) => s.id);
    expect(held()).toEqual(expect.arrayContaining([doomed.id, forgotten.id]));
    nodes[2] = await startNode(2);
    await until(
      'the lost sandboxes are gone from its home',
      () => !held().some((id) => id === doomed.id || id === forgotten.id),
      20_000,
    );
    // it stays listed as lost until its record is deleted
    expect((await api<{ state: string }>(g, 'GET', `/sandboxes/${doomed.id}`)).body.state).toBe('lost');
    expect((await api(g, 'DELETE', `/sandboxes/${doomed.id}`)).status).toBe(204);
    expect((await api(g, 'GET', `/sandboxes/${doomed.id}`)).status).toBe(404);
  }, 90_000);
});
