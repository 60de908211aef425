#!/usr/bin/env node
// Time to interactive as E2B's users measure it (docs/e2b.md, "Figures"): Sandbox.create() to the
// first command returned, through the real `e2b` SDK against `snaplab serve --e2b-listen`, beside
// snaplab's own API (Lab.connect) and the embedded Lab, all in one run, alternating arm by arm.
// From an image (busybox) and from a pool template; sequential and in bursts; then streamed stdout
// (envd's stream against the daemon's own), the time split in its parts (a create alone, a command
// on a kept sandbox, a unary call against the same request by fetch, the SDK's own floor against a
// server that answers at once), the CPU a call costs the daemon and the client, and, with --interpreter,
// runCode against commands.run.
// Usage: node scripts/bench-e2b.mjs [--n 100] [--bursts 10] [--burst 10] [--pool-size 12]
//          [--stream-mib 64] [--fresh] [--interpreter IMAGE_DIR [--interpreter-only]] [--json]
// --fresh: the pool does not recycle, so every take is a standby no one has used (as on a platform
// whose sandboxes run code that leaves something: a dirty one is never put back)
import { spawn, spawnSync } from 'node:child_process';
import { createServer } from 'node:http';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { Sandbox } from 'e2b';
import { Lab } from '../dist/sdk/index.js';

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const N = Number(arg('n', '100'));
const BURSTS = Number(arg('bursts', '10'));
const BURST = Number(arg('burst', '10'));
const POOL_SIZE = Number(arg('pool-size', '12'));
const STREAM_MIB = Number(arg('stream-mib', '64'));
const INTERPRETER = arg('interpreter', undefined);
// the code interpreter's arms alone (with --interpreter)
const INTERPRETER_ONLY = process.argv.includes('--interpreter-only');
const FRESH = process.argv.includes('--fresh');
const SNAPLAB = process.env.SNAPLAB_BIN ?? 'snaplab';

const home = mkdtempSync(join(tmpdir(), 'snaplab-bench-e2b-'));
const env = { ...process.env, SNAPLAB_HOME: home };
const cli = (args) => {
  const r = spawnSync(SNAPLAB, args, { env, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`snaplab ${args.join(' ')}: ${r.error?.message ?? r.stderr}`);
  return r.stdout.trim();
};
const q = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] : NaN;
};
const summary = (xs) => ({ n: xs.length, p50: q(xs, 50), p95: q(xs, 95), p99: q(xs, 99) });
const ms = (x) => `${x.toFixed(1)} ms`;

async function startDaemon() {
  const p = spawn(SNAPLAB, ['serve', '--listen', '127.0.0.1:0', '--e2b-listen', '127.0.0.1:0'], {
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let err = '';
  p.stderr.on('data', (b) => (err = (err + b).slice(-4000)));
  const line = await new Promise((resolve, reject) => {
    let out = '';
    p.stdout.on('data', (b) => {
      out += b;
      if (out.includes('\n')) resolve(out.split('\n')[0]);
    });
    p.once('exit', (c) => reject(new Error(`snaplab serve exited ${c}: ${err}`)));
  });
  return { proc: p, ...JSON.parse(line) };
}

// the command as the front runs E2B's `commands.run('true')` in a machine without bash (busybox)
const LOGIN = ['/bin/sh', '-l', '-c', 'true'];

/** Each arm: make a machine and run its first command; returns the time and a remover. */
function arms(remote, embedded, image, pool) {
  const own =
    (lab, opts, argv = ['true']) =>
    async () => {
      const t0 = performance.now();
      const box = await lab.create(opts);
      await box.exec(argv);
      return { ms: performance.now() - t0, done: () => box.destroy() };
    };
  const e2b = (template, opts) => async () => {
    const t0 = performance.now();
    const sbx = await Sandbox.create(template, opts);
    await sbx.commands.run('true');
    return { ms: performance.now() - t0, done: () => sbx.kill() };
  };
  return {
    // like with like: the own API's create has no egress, E2B's default has (its link: reported apart)
    'image, E2B SDK': e2b(image, { allowInternetAccess: false }),
    'image, own API': own(remote, { image }),
    'image, E2B egress': e2b(image),
    'image, embedded': own(embedded, { image }),
    'pool, E2B SDK': e2b(pool),
    'pool, own API': own(remote, { pool }),
    'pool, own, login': own(remote, { pool }, LOGIN),
    'pool, embedded': own(embedded, { pool }),
  };
}

/** Wait until the pool has `size` standbys ready (a run must not measure an empty pool). */
async function poolFull(lab, pool, size) {
  for (let i = 0; i < 600; i++) {
    const s = await lab.pool(pool).stats();
    if ((s.ready ?? 0) >= size) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`pool ${pool} did not fill`);
}

async function sequential(all, remote) {
  const times = Object.fromEntries(Object.keys(all).map((k) => [k, []]));
  for (let i = 0; i < N; i++) {
    for (const [name, arm] of Object.entries(all)) {
      if (name.startsWith('pool')) await poolFull(remote, 'bench', Math.min(POOL_SIZE, 2));
      const r = await arm();
      times[name].push(r.ms);
      await r.done();
    }
  }
  return times;
}

async function bursts(all, remote) {
  const times = Object.fromEntries(Object.keys(all).map((k) => [k, []]));
  for (let b = 0; b < BURSTS; b++) {
    for (const [name, arm] of Object.entries(all)) {
      if (name.startsWith('pool')) await poolFull(remote, 'bench', Math.min(POOL_SIZE, BURST));
      const rs = await Promise.all(Array.from({ length: BURST }, () => arm()));
      times[name].push(...rs.map((r) => r.ms));
      await Promise.all(rs.map((r) => r.done()));
    }
  }
  return times;
}

/** Streamed stdout, MiB/s: envd's stream (commands.run with onStdout) against the daemon's own. */
async function stream(remote) {
  const cmd = `head -c ${STREAM_MIB * 2 ** 20} /dev/zero | tr '\\0' a`;
  const sbx = await Sandbox.create('busybox');
  const box = await remote.create({ image: 'busybox' });
  const out = { envd: [], own: [] };
  try {
    for (let i = 0; i < 5; i++) {
      let n = 0;
      let t0 = performance.now();
      await sbx.commands.run(cmd, { onStdout: (s) => (n += s.length), timeoutMs: 0 });
      out.envd.push(n / 2 ** 20 / ((performance.now() - t0) / 1000));
      t0 = performance.now();
      const r = await box.exec(['sh', '-c', cmd]);
      out.own.push(r.stdout.length / 2 ** 20 / ((performance.now() - t0) / 1000));
    }
  } finally {
    await sbx.kill();
    await box.destroy();
  }
  return out;
}

/**
 * The time to interactive split in two, and a command on a kept sandbox: an SDK create against the
 * own API's take, E2B's `commands.run('true')` against the own API's exec of the same login shell,
 * and a unary envd call (`commands.list()`) against the same request sent by `fetch` (the SDK's
 * own share). N rounds, alternated.
 */
async function split(remote, pool, e2bUrl) {
  const out = { sdkCreate: [], ownCreate: [], sdkRun: [], ownLoginExec: [], sdkList: [], fetchList: [] };
  const sbx = await Sandbox.create(pool);
  const box = await remote.create({ pool });
  const time = async (xs, f) => {
    const t0 = performance.now();
    const r = await f();
    xs.push(performance.now() - t0);
    return r;
  };
  const listed = () =>
    fetch(`${e2bUrl}/process.Process/List`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'connect-protocol-version': '1',
        'e2b-sandbox-id': sbx.sandboxId,
        'e2b-sandbox-port': '49983',
        'x-access-token': sbx.envdAccessToken ?? '',
      },
      body: '{}',
    }).then((r) => r.text());
  try {
    for (let i = 0; i < N; i++) {
      await poolFull(remote, pool, 2);
      await (await time(out.sdkCreate, () => Sandbox.create(pool))).kill();
      await poolFull(remote, pool, 2);
      await (await time(out.ownCreate, () => remote.create({ pool }))).destroy();
      await time(out.sdkRun, () => sbx.commands.run('true'));
      await time(out.ownLoginExec, () => box.exec(LOGIN));
      await time(out.sdkList, () => sbx.commands.list());
      await time(out.fetchList, listed);
    }
  } finally {
    await sbx.kill();
    await box.destroy();
  }
  return out;
}

/**
 * The SDK's own floor: the same create and `commands.run('true')` against a server on loopback that
 * answers each at once with what the front would (a sandbox's JSON; a Connect stream of start and
 * end), so what is left is E2B's SDK and HTTP/1.1 themselves, beside the front's figures above.
 */
async function sdkFloor() {
  const frame = (flags, obj) => {
    const body = Buffer.from(JSON.stringify(obj));
    const head = Buffer.alloc(5);
    head[0] = flags;
    head.writeUInt32BE(body.length, 1);
    return Buffer.concat([head, body]);
  };
  let n = 0;
  const stub = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.method === 'POST' && /\/sandboxes$/.test(req.url)) {
        const body = JSON.stringify({
          sandboxID: `floor${++n}`,
          templateID: 'base',
          clientID: 'floor',
          envdVersion: '0.6.4',
          envdAccessToken: 'floor',
        });
        res.writeHead(201, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
        return res.end(body);
      }
      if (req.url.startsWith('/process.Process/Start')) {
        res.writeHead(200, { 'content-type': 'application/connect+json' });
        res.write(frame(0, { event: { start: { pid: 1 } } }));
        res.write(frame(0, { event: { end: { exitCode: 0, exited: true, status: 'exit status 0' } } }));
        return res.end(frame(2, {}));
      }
      res.writeHead(404).end();
    });
  });
  await new Promise((r) => stub.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${stub.address().port}`;
  const out = { sdkFloorCreate: [], sdkFloorRun: [] };
  try {
    for (let i = 0; i < N + 10; i++) {
      const t0 = performance.now();
      const sbx = await Sandbox.create({ apiUrl: url, sandboxUrl: url, allowInternetAccess: false });
      const t1 = performance.now();
      await sbx.commands.run('true');
      if (i < 10) continue; // the first calls warm the SDK's modules
      out.sdkFloorCreate.push(t1 - t0);
      out.sdkFloorRun.push(performance.now() - t1);
    }
  } finally {
    stub.close();
  }
  return out;
}

/**
 * The CPU each call costs, on a kept sandbox: the daemon's (user and system time from
 * /proc/PID/stat, its whole process) and this process's (the client's: E2B's SDK, fetch or the
 * own API's client) per call, beside the wall time, for E2B's `commands.run('true')` through the
 * SDK, the same Start sent by `fetch`, a `/health` probe through the front, and the own API's
 * exec of the same login shell. Arms alternate in blocks after a warm-up (the daemon's JIT).
 */
async function cpuSplit(remote, pool, e2bUrl, daemonPid) {
  const sbx = await Sandbox.create(pool);
  const box = await remote.create({ pool });
  const hz = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim()) || 100;
  const daemonMs = () => {
    const f = readFileSync(`/proc/${daemonPid}/stat`, 'utf8').split(') ')[1].split(' ');
    return ((Number(f[11]) + Number(f[12])) * 1000) / hz;
  };
  const clientMs = () => {
    const u = process.cpuUsage();
    return (u.user + u.system) / 1000;
  };
  const headers = {
    'connect-protocol-version': '1',
    'e2b-sandbox-id': sbx.sandboxId,
    'e2b-sandbox-port': '49983',
    'x-access-token': sbx.envdAccessToken ?? '',
  };
  const message = Buffer.from(JSON.stringify({ process: { cmd: '/bin/bash', args: ['-l', '-c', 'true'], envs: {} } }));
  const head = Buffer.alloc(5);
  head.writeUInt32BE(message.length, 1);
  const startBody = Buffer.concat([head, message]);
  const arms = {
    sdkRun: () => sbx.commands.run('true'),
    fetchStart: () =>
      fetch(`${e2bUrl}/process.Process/Start`, {
        method: 'POST',
        headers: { ...headers, 'content-type': 'application/connect+json' },
        body: startBody,
      }).then((r) => r.arrayBuffer()),
    fetchHealth: () => fetch(`${e2bUrl}/health`, { headers }).then((r) => r.text()),
    ownLoginExec: () => box.exec(LOGIN),
  };
  const out = Object.fromEntries(Object.keys(arms).map((k) => [k, { daemonMs: 0, clientMs: 0, n: 0, wall: [] }]));
  const block = Math.max(10, Math.round(N / 2));
  try {
    for (const f of Object.values(arms)) for (let i = 0; i < 50; i++) await f(); // warm: the daemon's JIT
    for (let round = 0; round < 2; round++)
      for (const [k, f] of Object.entries(arms)) {
        const o = out[k];
        const d0 = daemonMs();
        const c0 = clientMs();
        for (let i = 0; i < block; i++) {
          const t0 = performance.now();
          await f();
          o.wall.push(performance.now() - t0);
        }
        o.daemonMs += daemonMs() - d0;
        o.clientMs += clientMs() - c0;
        o.n += block;
      }
  } finally {
    await sbx.kill();
    await box.destroy();
  }
  return Object.fromEntries(
    Object.entries(out).map(([k, o]) => [
      k,
      { daemonMs: o.daemonMs / o.n, clientMs: o.clientMs / o.n, wall: summary(o.wall) },
    ]),
  );
}

/** The memory its cgroup counts (page cache included) of each ready standby of the pool, MiB. */
async function standbyMemory(remote, pool) {
  const ready = (await remote.list()).filter((b) => b.pool === pool && b.state === 'paused');
  return Promise.all(ready.map(async (b) => Math.round((await b.usage()).memoryBytes / 2 ** 20)));
}

/** Create to the first runCode result (cold: from the image; then from a pool), and round trips. */
async function interpreter(remote) {
  cli(['image', 'import', INTERPRETER, '--name', 'code-interpreter-v1']);
  const { Sandbox: CI } = await import('@e2b/code-interpreter');
  const first = async () => {
    const t0 = performance.now();
    const sbx = await CI.create();
    await sbx.runCode('1');
    const ms = performance.now() - t0;
    await sbx.kill();
    return ms;
  };
  const out = { cold: [], pool: [], warm: [], warmRefilling: [], runCode: [], commandsRun: [], standbyMiB: {} };
  for (let i = 0; i < 5; i++) out.cold.push(await first());
  await remote.createPool({ name: 'code-interpreter-v1', image: 'code-interpreter-v1', size: 2 });
  try {
    for (let i = 0; i < 5; i++) {
      await poolFull(remote, 'code-interpreter-v1', 1);
      out.pool.push(await first());
    }
    await poolFull(remote, 'code-interpreter-v1', 2);
    out.standbyMiB.plain = await standbyMemory(remote, 'code-interpreter-v1');
  } finally {
    await remote.pool('code-interpreter-v1').remove();
  }
  // standbys with the server and its kernel started ahead (pool create --warm interpreter)
  await remote.createPool({ name: 'code-interpreter-v1', image: 'code-interpreter-v1', size: 2, warm: 'interpreter' });
  try {
    // with the pool full (no standby warming beside the take), then with one standby ready while
    // the other warms (a kernel's start takes most of a core for seconds)
    await poolFull(remote, 'code-interpreter-v1', 2);
    out.standbyMiB.warm = await standbyMemory(remote, 'code-interpreter-v1');
    for (let i = 0; i < 10; i++) {
      await poolFull(remote, 'code-interpreter-v1', 2);
      out.warm.push(await first());
    }
    for (let i = 0; i < 10; i++) {
      await poolFull(remote, 'code-interpreter-v1', 1);
      out.warmRefilling.push(await first());
    }
  } finally {
    await remote.pool('code-interpreter-v1').remove();
  }
  const sbx = await CI.create();
  try {
    await sbx.runCode('x = 0');
    for (let i = 0; i < 200; i++) {
      let t = performance.now();
      await sbx.runCode('x = 1');
      out.runCode.push(performance.now() - t);
      t = performance.now();
      await sbx.commands.run('true');
      out.commandsRun.push(performance.now() - t);
    }
  } finally {
    await sbx.kill();
  }
  return out;
}

/** The busybox arms: in a row, in bursts, the stream and the split. */
async function busyboxArms(report, remote, embedded, d) {
  await remote.createPool({ name: 'bench', image: 'busybox', size: POOL_SIZE, ...(FRESH ? { recycle: false } : {}) });
  const all = arms(remote, embedded, 'busybox', 'bench');
  for (const a of Object.values(all)) await (await a()).done(); // warm: the image's first clone, the SDK's first connection
  console.error(`== sequential, n=${N} per arm`);
  report.sequential = Object.fromEntries(
    Object.entries(await sequential(all, remote)).map(([k, v]) => [k, summary(v)]),
  );
  console.error(`== bursts of ${BURST}, ${BURSTS} per arm`);
  report.bursts = Object.fromEntries(Object.entries(await bursts(all, remote)).map(([k, v]) => [k, summary(v)]));
  console.error(`== stream, ${STREAM_MIB} MiB, 5 each`);
  const s = await stream(remote);
  report.stream = { envdMiBs: q(s.envd, 50), ownMiBs: q(s.own, 50), ratio: q(s.envd, 50) / q(s.own, 50) };
  console.error(`== split, n=${N}`);
  report.split = Object.fromEntries(
    Object.entries({
      ...(await split(remote, 'bench', d.e2bUrl)),
      // with the pool full, so that no refill runs beside the floor
      ...(await poolFull(remote, 'bench', POOL_SIZE).then(sdkFloor)),
    }).map(([k, v]) => [k, summary(v)]),
  );
  console.error(`== cpu per call, ${Math.max(10, Math.round(N / 2)) * 2} a call`);
  report.cpu = await poolFull(remote, 'bench', POOL_SIZE).then(() => cpuSplit(remote, 'bench', d.e2bUrl, d.pid));
}

async function main() {
  const key = cli(['key', 'create', 'bench', '--e2b', '--scope', 'read,exec,admin', '--max-sandboxes', '200']);
  const d = await startDaemon();
  process.env.E2B_API_URL = d.e2bUrl;
  process.env.E2B_SANDBOX_URL = d.e2bUrl;
  process.env.E2B_API_KEY = key;
  const remote = await Lab.connect({ url: d.url, token: key });
  const embedded = await Lab.open({ home });
  const report = { n: N, bursts: BURSTS, burst: BURST, when: new Date().toISOString() };
  try {
    if (!INTERPRETER_ONLY) await busyboxArms(report, remote, embedded, d);
    if (INTERPRETER) {
      console.error('== code interpreter');
      const c = await interpreter(remote);
      report.interpreter = {
        firstResultCold: summary(c.cold),
        firstResultPool: summary(c.pool),
        firstResultWarm: summary(c.warm),
        firstResultWarmRefilling: summary(c.warmRefilling),
        standbyMiB: c.standbyMiB,
        runCode: summary(c.runCode),
        commandsRun: summary(c.commandsRun),
      };
    }
  } finally {
    // everything made here goes, whatever failed (said, not thrown: the first error is the one to see)
    const tidy = async (what, f) => {
      try {
        await f();
      } catch (e) {
        console.error(`cleanup: ${what}: ${e.message}`);
      }
    };
    if (!INTERPRETER_ONLY) await tidy('pool', () => remote.pool('bench').remove());
    d.proc.kill('SIGTERM');
    await new Promise((r) => d.proc.once('exit', r));
    await tidy('sandboxes', () => cli(['rm', '--all']));
    for (const image of ['busybox', ...(INTERPRETER ? ['code-interpreter-v1'] : [])])
      spawnSync(SNAPLAB, ['image', 'rm', '--force', image], { env });
    await tidy('gc', () => cli(['gc']));
    rmSync(home, { recursive: true, force: true });
  }
  if (process.argv.includes('--json')) console.log(JSON.stringify(report, null, 2));
  else print(report);
}

function print(r) {
  if (r.sequential) printBusybox(r);
  if (r.interpreter) {
    const i = r.interpreter;
    console.log(
      `\ncode interpreter: create to first result p50 ${ms(i.firstResultCold.p50)} cold, ${ms(i.firstResultPool.p50)} from a pool, ${ms(i.firstResultWarm.p50)} (p95 ${ms(i.firstResultWarm.p95)}) from a full warm pool, ${ms(i.firstResultWarmRefilling.p50)} (p95 ${ms(i.firstResultWarmRefilling.p95)}) from one warming a standby beside; runCode p50 ${ms(i.runCode.p50)} p99 ${ms(i.runCode.p99)}; commands.run p50 ${ms(i.commandsRun.p50)} p99 ${ms(i.commandsRun.p99)}; a standby's memory (its cgroup's, MiB) ${i.standbyMiB.plain.join(', ')} plain, ${i.standbyMiB.warm.join(', ')} warm`,
    );
  }
}

function printBusybox(r) {
  for (const part of ['sequential', 'bursts']) {
    console.log(`\n${part} (time to interactive: create to first command returned)`);
    for (const [k, v] of Object.entries(r[part]))
      console.log(`  ${k.padEnd(18)} p50 ${ms(v.p50)}  p95 ${ms(v.p95)}  p99 ${ms(v.p99)}  (n=${v.n})`);
    for (const from of ['image', 'pool']) {
      const e = r[part][`${from}, E2B SDK`].p50;
      const o = r[part][`${from}, own API`].p50;
      console.log(`  ${from}: E2B front / own API, p50: ${(e / o).toFixed(2)}`);
    }
    const login = r[part]['pool, own, login'].p50;
    console.log(
      `  pool: E2B front / own API running the same login shell, p50: ${(r[part]['pool, E2B SDK'].p50 / login).toFixed(2)}`,
    );
  }
  console.log(
    `\nstream: envd ${r.stream.envdMiBs.toFixed(0)} MiB/s, own ${r.stream.ownMiBs.toFixed(0)} MiB/s, ratio ${r.stream.ratio.toFixed(2)}`,
  );
  console.log(
    "\nsplit (a create alone; a command on a kept sandbox; a unary envd call; the SDK's floor: the same against a server that answers at once)",
  );
  for (const [k, v] of Object.entries(r.split))
    console.log(`  ${k.padEnd(18)} p50 ${ms(v.p50)}  p95 ${ms(v.p95)}  (n=${v.n})`);
  console.log('\ncpu per call on a kept sandbox (the daemon process and this client, ms of CPU a call; wall p50)');
  for (const [k, v] of Object.entries(r.cpu))
    console.log(
      `  ${k.padEnd(18)} daemon ${v.daemonMs.toFixed(2)}  client ${v.clientMs.toFixed(2)}  wall p50 ${ms(v.wall.p50)}  (n=${v.wall.n})`,
    );
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
