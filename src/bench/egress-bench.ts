/**
 * `snaplab bench --workload egress` (docs/egress.md): what egress costs, beside baselines from the
 * same run, in alternating rounds:
 * - raise to usable with egress off and on (the create's trace);
 * - a download of `mib` MiB from a server on the uplink, into a machine with egress, beside the
 *   same transfer between two namespaces joined by a plain veth;
 * - connection setup (connect to first byte) through the router with an allow list of 1 entry and
 *   of 1000.
 * The bench makes its own uplink namespace (SNAPLAB_UPLINK_NETNS) with its server on a
 * documentation address: no packet leaves the host. Clients run in the machine's own network
 * namespace (the path its processes take) as small Node programs, so both sides of each
 * comparison run the same client.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { homeTag, machineEgressNetns, slotOf } from '../host/net/egress-rules.js';
import { run } from '../host/run.js';
import { Lab as LabClass, type Lab } from '../sdk/lab.js';
import { mkdtempSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { SandboxApi } from '../sdk/api.js';
import type { Progress } from './progress.js';
import { pad } from './report-text.js';
import { latencySummary, type LatencySummary } from './stats.js';
import { bestEffort } from '../cleanup.js';

export interface EgressSummary {
  workload: 'egress';
  startedAt: string;
  finishedAt: string;
  settings: { rounds: number; raises: number; mib: number; connects: number };
  raise: { name: string; baseline: boolean; ms: LatencySummary & { samples: number } }[];
  throughput: { name: string; baseline: boolean; mibPerS: number[]; p50: number }[];
  connect: { name: string; baseline: boolean; ms: LatencySummary & { samples: number } }[];
  ratios: { raise: number; throughput: number; connect1000vs1: number };
}

const SERVER = '203.0.113.80';
const PORT = 9000;
const BASE_SERVER = '192.0.2.81';
const BASE_CLIENT = '192.0.2.82';

// A server that sends N bytes on each connection that writes "N\n", or one byte for "1\n"
const SERVER_JS = `
const net = require('node:net');
const chunk = Buffer.alloc(1 << 20);
for (const addr of process.argv.slice(1)) net.createServer((s) => {
  s.once('data', (d) => {
    let left = Number(String(d).trim());
    const more = () => { while (left > 0) { const n = Math.min(left, chunk.length); left -= n; if (!s.write(chunk.subarray(0, n))) return s.once('drain', more); } s.end(); };
    more();
  });
  s.on('error', () => {});
}).listen(${PORT}, addr, () => process.stdout.write('ready\\n'));
`;

// The client: "get HOST BYTES" (prints MiB/s) or "connect HOST N" (prints each connect's ms, JSON)
const CLIENT_JS = `
const net = require('node:net');
const [op, host, n] = process.argv.slice(1);
const once = (bytes) => new Promise((resolve, reject) => {
  const t0 = process.hrtime.bigint(); let got = 0; let first = 0;
  const s = net.connect(${PORT}, host, () => s.write(bytes + '\\n'));
  s.on('data', (d) => { if (!first) first = Number(process.hrtime.bigint() - t0) / 1e6; got += d.length; });
  s.on('end', () => resolve({ ms: Number(process.hrtime.bigint() - t0) / 1e6, first, got }));
  s.on('error', reject);
});
(async () => {
  if (op === 'get') { const r = await once(Number(n)); process.stdout.write(String((r.got / 2 ** 20) / (r.ms / 1000))); return; }
  const out = []; for (let i = 0; i < Number(n); i++) out.push((await once(1)).first);
  process.stdout.write(JSON.stringify(out));
})().catch((e) => { process.stderr.write(String(e)); process.exit(1); });
`;

const ns = (name: string, argv: string[]): Promise<{ stdout: string }> =>
  run('ip', ['netns', 'exec', name, ...argv], { timeoutMs: 600_000 });
const client = (netns: string, args: string[]): Promise<{ stdout: string }> =>
  ns(netns, [process.execPath, '-e', CLIENT_JS, '--', ...args]);

/** The uplink and the baseline's two namespaces, with their servers. */
async function outside(tag: string): Promise<{ up: string; a: string; b: string; servers: ChildProcess[] }> {
  const up = `slbench-up-${tag}`;
  const a = `slbench-a-${tag}`;
  const b = `slbench-b-${tag}`;
  for (const n of [up, a, b]) await run('ip', ['netns', 'add', n]);
  try {
    return { up, a, b, servers: await wireOutside(up, a, b) };
  } catch (e) {
    for (const n of [up, a, b]) await bestEffort(`delete ${n}`, () => run('ip', ['netns', 'del', n]));
    throw e;
  }
}

async function wireOutside(up: string, a: string, b: string): Promise<ChildProcess[]> {
  await run('ip', ['-n', up, 'link', 'set', 'lo', 'up']);
  await run('ip', ['-n', up, 'addr', 'add', `${SERVER}/32`, 'dev', 'lo']);
  await run('ip', ['-n', a, 'link', 'add', 'v0', 'type', 'veth', 'peer', 'name', 'v1', 'netns', b]);
  await run('ip', ['-n', a, 'addr', 'add', `${BASE_CLIENT}/24`, 'dev', 'v0']);
  await run('ip', ['-n', b, 'addr', 'add', `${BASE_SERVER}/24`, 'dev', 'v1']);
  for (const [n, i] of [
    [a, 'v0'],
    [b, 'v1'],
  ] as const) {
    await run('ip', ['-n', n, 'link', 'set', i, 'up']);
    await run('ip', ['-n', n, 'link', 'set', 'lo', 'up']);
  }
  return Promise.all([serve(up, SERVER), serve(b, BASE_SERVER)]);
}

function serve(netns: string, addr: string): Promise<ChildProcess> {
  const p = spawn('ip', ['netns', 'exec', netns, process.execPath, '-e', SERVER_JS, '--', addr], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  return new Promise((resolve, reject) => {
    p.stdout!.once('data', () => resolve(p));
    p.once('exit', (c) => reject(new Error(`the bench's server in ${netns} exited (${c})`)));
  });
}

const machineNs = (lab: Lab, box: SandboxApi): string =>
  machineEgressNetns(homeTag(lab.home), slotOf(box.egress!.address));

/** 1000 prefixes that do not hold the server (an allow list of that size, the server last). */
const thousand = (): string[] => [
  ...Array.from({ length: 999 }, (_, i) => `11.${i >> 8}.${i & 255}.0/24`),
  `${SERVER}/32`,
];

/**
 * The bench runs in a home of its own (under /tmp, removed at its end): a router the user's home
 * has already would be trusted as it is, and its uplink is the host's network, where no bench
 * packet may go.
 */
export async function egressBench(
  _userLab: Lab,
  opts: { rounds: number; raises: number; mib: number; connects: number },
  progress: Progress,
): Promise<EgressSummary> {
  const startedAt = new Date().toISOString();
  const tag = String(process.pid);
  const saved = process.env.SNAPLAB_UPLINK_NETNS;
  const o = await outside(tag);
  process.env.SNAPLAB_UPLINK_NETNS = o.up;
  const lab = await LabClass.open({ home: mkdtempSync(join(tmpdir(), 'snaplab-bench-egress-')) });
  const made: SandboxApi[] = [];
  try {
    const off: number[] = [];
    const on: number[] = [];
    const through: number[] = [];
    const plain: number[] = [];
    const one: number[] = [];
    const many: number[] = [];
    await (await lab.create({ egress: true })).destroy(); // the router, made once, untimed
    const single = await lab.create({ egress: { allow: [SERVER] } });
    const big = await lab.create({ egress: { allow: thousand() } });
    made.push(single, big);
    for (let r = 1; r <= opts.rounds; r++) {
      for (let i = 0; i < opts.raises; i++) {
        for (const [list, egress] of [
          [off, false],
          [on, true],
        ] as const) {
          const box = await lab.create(egress ? { egress: true } : {});
          list.push(box.lastTrace!.totalMs);
          await box.destroy();
        }
      }
      const bytes = String(opts.mib * 2 ** 20);
      through.push(Number((await client(machineNs(lab, single), ['get', SERVER, bytes])).stdout));
      plain.push(Number((await client(o.a, ['get', BASE_SERVER, bytes])).stdout));
      one.push(
        ...(JSON.parse(
          (await client(machineNs(lab, single), ['connect', SERVER, String(opts.connects)])).stdout,
        ) as number[]),
      );
      many.push(
        ...(JSON.parse(
          (await client(machineNs(lab, big), ['connect', SERVER, String(opts.connects)])).stdout,
        ) as number[]),
      );
      progress.note(
        `round ${r}/${opts.rounds}: raise p50 ${med(off).toFixed(1)} ms off, ${med(on).toFixed(1)} ms on; ${through.at(-1)!.toFixed(0)} MiB/s through egress, ${plain.at(-1)!.toFixed(0)} over a veth; connect p50 ${med(one).toFixed(3)} ms (1 rule), ${med(many).toFixed(3)} ms (1000)`,
      );
    }
    const ls = (xs: number[]): LatencySummary & { samples: number } => ({ ...latencySummary(xs), samples: xs.length });
    const ratio = (a: number, b: number): number => Math.round((a / b) * 100) / 100;
    return {
      workload: 'egress',
      startedAt,
      finishedAt: new Date().toISOString(),
      settings: opts,
      raise: [
        { name: 'create, egress off', baseline: true, ms: ls(off) },
        { name: 'create --egress', baseline: false, ms: ls(on) },
      ],
      throughput: [
        {
          name: 'download through egress (router, NAT)',
          baseline: false,
          mibPerS: through.map(Math.round),
          p50: med(through),
        },
        {
          name: 'the same between two namespaces over a veth',
          baseline: true,
          mibPerS: plain.map(Math.round),
          p50: med(plain),
        },
      ],
      connect: [
        { name: 'connect to first byte, allow list of 1', baseline: true, ms: ls(one) },
        { name: 'connect to first byte, allow list of 1000', baseline: false, ms: ls(many) },
      ],
      ratios: {
        raise: ratio(med(on), med(off)),
        throughput: ratio(med(through), med(plain)),
        connect1000vs1: ratio(med(many), med(one)),
      },
    };
  } finally {
    for (const b of made) await bestEffort(`remove ${b.name}`, () => b.destroy());
    for (const s of o.servers) s.kill('SIGKILL');
    for (const b of await lab.list()) await bestEffort(`remove ${b.name}`, () => b.destroy());
    await bestEffort('remove the bench image', () => lab.removeImage('busybox', { force: true }));
    await bestEffort('gc the bench home', () => lab.gc());
    lab.close();
    await bestEffort('remove the bench home', () => rm(lab.home, { recursive: true, force: true }));
    if (saved === undefined) delete process.env.SNAPLAB_UPLINK_NETNS;
    else process.env.SNAPLAB_UPLINK_NETNS = saved;
    for (const n of [o.up, o.a, o.b]) await bestEffort(`delete ${n}`, () => run('ip', ['netns', 'del', n]));
    progress.done();
  }
}

const med = (xs: number[]): number => (xs.length ? latencySummary(xs).p50 : 0);

export function renderEgressSummary(s: EgressSummary): string {
  const row = (c: { name: string; baseline: boolean; ms: LatencySummary & { samples: number } }): string[] => [
    `${c.name}${c.baseline ? ' (baseline)' : ''}`,
    c.ms.p50.toFixed(2),
    c.ms.p90.toFixed(2),
    c.ms.p99.toFixed(2),
    String(c.ms.samples),
  ];
  return [
    `workload egress: ${s.settings.rounds} rounds; ${s.settings.raises} creates each way, a ${s.settings.mib} MiB download, ${s.settings.connects} connects per list a round`,
    ...pad(['raise to usable', 'p50 ms', 'p90 ms', 'p99 ms', 'samples'], s.raise.map(row)),
    ...pad(
      ['throughput', 'p50 MiB/s', 'rounds'],
      s.throughput.map((c) => [`${c.name}${c.baseline ? ' (baseline)' : ''}`, c.p50.toFixed(0), c.mibPerS.join(', ')]),
    ),
    ...pad(['connection setup', 'p50 ms', 'p90 ms', 'p99 ms', 'samples'], s.connect.map(row)),
    `ratios (same run, p50): raise on/off = ${s.ratios.raise}; download egress/veth = ${s.ratios.throughput}; connect 1000/1 rules = ${s.ratios.connect1000vs1}`,
  ].join('\n');
}
