#!/usr/bin/env node
// Time to interactive through the E2B front, two builds side by side in one run (docs/benchmarks.md,
// "The E2B front and the code interpreter"): one `snaplab serve --e2b-listen` of each build, each
// with a home and a pool of its own, the real `e2b` SDK pointed at each by apiUrl/sandboxUrl, and
// snaplab's own API (Lab.connect, this checkout's client) on each daemon; arms alternated round by
// round, so both builds see the same load. Prints p50 (p95) per arm and E2B / own per build, then
// streamed stdout per build (envd's stream and the own API's one-shot exec, MiB/s).
// Usage: node scripts/bench-e2b-ab.mjs --a 'node /path/a/dist/bin/snaplab.js' --b 'node dist/bin/snaplab.js'
//          [--n 30] [--pool-size 4] [--stream-mib 32] [--json]
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, openSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { Sandbox } from 'e2b';
import { Lab } from '../dist/sdk/index.js';

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const N = Number(arg('n', '30'));
const POOL_SIZE = Number(arg('pool-size', '4'));
const STREAM_MIB = Number(arg('stream-mib', '32'));
const BUILDS = { a: arg('a', undefined), b: arg('b', 'node dist/bin/snaplab.js') };
if (!BUILDS.a) throw new Error('give --a (the command of the build to compare with)');

const q = (xs, p) => {
  const s = [...xs].sort((x, y) => x - y);
  return s.length ? s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] : NaN;
};

/** One build: its home, its daemon (with the E2B front), its key, its pool. */
async function side(name, command) {
  const [bin, ...pre] = command.split(' ');
  const home = mkdtempSync(join(tmpdir(), `snaplab-bench-e2b-ab-${name}-`));
  const env = { ...process.env, SNAPLAB_HOME: home };
  const cli = (args) => {
    const r = spawnSync(bin, [...pre, ...args], { env, encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`${command} ${args.join(' ')}: ${r.error?.message ?? r.stderr}`);
    return r.stdout.trim();
  };
  const key = cli(['key', 'create', 'bench', '--e2b', '--scope', 'read,exec,admin', '--max-sandboxes', '200']);
  // its request lines (and anything it says before it dies) in a file of its own
  const log = openSync(join(tmpdir(), `snaplab-bench-e2b-ab-${name}.log`), 'w');
  const proc = spawn(bin, [...pre, 'serve', '--listen', '127.0.0.1:0', '--e2b-listen', '127.0.0.1:0'], {
    env,
    stdio: ['ignore', 'pipe', log],
  });
  proc.once('exit', (code, signal) => console.error(`${name}: snaplab serve exited (${code ?? signal})`));
  const line = await new Promise((resolve, reject) => {
    let out = '';
    proc.stdout.on('data', (b) => {
      out += b;
      if (out.includes('\n')) resolve(out.split('\n')[0]);
    });
    proc.once('exit', (c) => reject(new Error(`${name}: snaplab serve exited ${c}`)));
  });
  const { url, e2bUrl } = JSON.parse(line);
  const lab = await Lab.connect({ url, token: key });
  await lab.createPool({ name: 'bench', image: 'busybox', size: POOL_SIZE });
  const sdk = { apiKey: key, apiUrl: e2bUrl, sandboxUrl: e2bUrl };
  // (each step said when it fails, never thrown: the run's figures are printed before)
  const stop = async () => {
    await lab
      .pool('bench')
      .remove()
      .catch((e) => console.error(`${name}: pool: ${e.message}`));
    lab.close();
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGTERM');
      await new Promise((r) => proc.once('exit', r));
    }
  };
  const close = () => {
    spawnSync(bin, [...pre, 'pool', 'rm', 'bench'], { env });
    spawnSync(bin, [...pre, 'rm', '--all'], { env });
    spawnSync(bin, [...pre, 'image', 'rm', '--force', 'busybox'], { env });
    spawnSync(bin, [...pre, 'gc'], { env });
    try {
      rmSync(home, { recursive: true, force: true });
    } catch (e) {
      console.error(`${name}: ${home} left: ${e.message}`);
    }
  };
  return { name, lab, sdk, stop, close };
}

function arms(s) {
  const own = (opts) => async () => {
    const t0 = performance.now();
    const box = await s.lab.create(opts);
    await box.exec(['true']);
    const ms = performance.now() - t0;
    await box.destroy();
    return ms;
  };
  const e2b = (template, opts) => async () => {
    const t0 = performance.now();
    const sbx = await Sandbox.create(template, { ...s.sdk, ...opts });
    await sbx.commands.run('true');
    const ms = performance.now() - t0;
    await sbx.kill();
    return ms;
  };
  return {
    [`pool, E2B SDK, ${s.name}`]: e2b('bench'),
    [`pool, own API, ${s.name}`]: own({ pool: 'bench' }),
    [`image, E2B SDK, ${s.name}`]: e2b('busybox', { allowInternetAccess: false }),
    [`image, own API, ${s.name}`]: own({ image: 'busybox' }),
  };
}

async function poolFull(lab) {
  for (let i = 0; i < 600; i++) {
    if (((await lab.pool('bench').stats()).ready ?? 0) >= Math.min(POOL_SIZE, 2)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('the pool did not fill');
}

/** Streamed stdout, MiB/s (median of 5): envd's stream (commands.run with onStdout) and the own API's one-shot exec, per build. */
async function streams(sides) {
  const cmd = `head -c ${STREAM_MIB * 2 ** 20} /dev/zero | tr '\\0' a`;
  const rate = async (run) => {
    let n = 0;
    const t0 = performance.now();
    await run((x) => (n += x.length));
    return n / 2 ** 20 / ((performance.now() - t0) / 1000);
  };
  const made = await Promise.all(
    sides.map(async (s) => ({
      s,
      sbx: await Sandbox.create('busybox', { ...s.sdk, allowInternetAccess: false }),
      box: await s.lab.create({ image: 'busybox' }),
    })),
  );
  const out = {};
  try {
    for (let i = 0; i < 5; i++)
      for (const { s, sbx, box } of made) {
        (out[`envd, ${s.name}`] ??= []).push(await rate((on) => sbx.commands.run(cmd, { onStdout: on, timeoutMs: 0 })));
        // (an exec: this checkout's client spawns with an op the other build's daemon may not have)
        (out[`own exec, ${s.name}`] ??= []).push(
          await rate(async (on) => on((await box.exec(['sh', '-c', cmd], { encoding: 'buffer' })).stdout)),
        );
      }
  } finally {
    for (const { sbx, box } of made) {
      await sbx.kill();
      await box.destroy();
    }
  }
  return Object.fromEntries(Object.entries(out).map(([k, xs]) => [k, q(xs, 50)]));
}

async function main() {
  const sides = [await side('a', BUILDS.a), await side('b', BUILDS.b)];
  const report = { n: N, builds: BUILDS, load: { before: loadavg() }, arms: {} };
  try {
    const all = Object.assign({}, ...sides.map(arms));
    const labOf = (k) => sides.find((s) => k.endsWith(`, ${s.name}`)).lab;
    for (const a of Object.values(all)) await a(); // warm: each image's first clone, the SDK's first connection
    const times = Object.fromEntries(Object.keys(all).map((k) => [k, []]));
    for (let i = 0; i < N; i++)
      for (const [k, a] of Object.entries(all)) {
        if (k.startsWith('pool')) await poolFull(labOf(k));
        times[k].push(await a());
      }
    for (const [k, xs] of Object.entries(times)) report.arms[k] = { p50: q(xs, 50), p95: q(xs, 95), n: xs.length };
    report.stream = await streams(sides);
    report.load.after = loadavg();
    print(report);
  } finally {
    // both daemons stopped before either home is cleaned
    for (const s of sides) await s.stop();
    for (const s of sides) s.close();
  }
}

function print(report) {
  if (process.argv.includes('--json')) return console.log(JSON.stringify(report, null, 2));
  const f = (x) => x.toFixed(1);
  console.log(`load ${report.load.before.map(f).join(' ')} → ${report.load.after.map(f).join(' ')}`);
  for (const [k, v] of Object.entries(report.arms))
    console.log(`  ${k.padEnd(24)} p50 ${f(v.p50)} (p95 ${f(v.p95)}) ms`);
  for (const [k, v] of Object.entries(report.stream)) console.log(`  stream, ${k.padEnd(14)} ${f(v)} MiB/s`);
  for (const s of ['a', 'b'])
    for (const from of ['pool', 'image']) {
      const r = report.arms[`${from}, E2B SDK, ${s}`].p50 / report.arms[`${from}, own API, ${s}`].p50;
      console.log(`  ${s}: ${from}: E2B / own ${r.toFixed(2)}`);
    }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
