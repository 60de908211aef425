#!/usr/bin/env node
// The daemon under load, as the API issue asks (docs/api.md, "Measured"): CLIENTS independent
// clients (each its own connection) run a fresh execution per request from a pool for SECONDS,
// every answer checked against what its request asked for; the daemon's RSS at the start and end;
// and streamed exec output through the daemon beside the same stream in-process.
//   node scripts/daemon-soak.mjs [--clients 64] [--seconds 60] [--pool-size 16] [--stream-mib 256]
// Needs root and a built tree (npm run build). Uses a home of its own under /tmp, removed after.
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { Lab } from '../dist/sdk/index.js';

const args = process.argv.slice(2);
const opt = (name, def) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? Number(args[i + 1]) : def;
};
const CLIENTS = opt('clients', 64);
const SECONDS = opt('seconds', 60);
const POOL = opt('pool-size', 16);
const STREAM_MIB = opt('stream-mib', 256);
const SNAPLAB = join(import.meta.dirname, '..', 'native', 'build', 'snaplab');

const home = mkdtempSync(join(tmpdir(), 'snaplab-soak-'));
const env = { ...process.env, SNAPLAB_HOME: home };
const cli = (a) => spawnSync(SNAPLAB, a, { env, encoding: 'utf8' });
const token = cli(['key', 'create', 'soak', '--scope', 'read,exec,admin']).stdout.trim();
const daemon = spawn(SNAPLAB, ['serve', '--listen', '127.0.0.1:0', '--default-timeout', '0'], {
  env,
  stdio: ['ignore', 'pipe', 'ignore'],
});
const { url } = await new Promise((resolve) =>
  daemon.stdout.once('data', (b) => resolve(JSON.parse(String(b).split('\n')[0]))),
);
const rss = () => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${daemon.pid}/status`, 'utf8'))[1]) * 1024;
const pct = (xs, p) => xs.sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))];
const mib = (n) => `${(n / 2 ** 20).toFixed(1)} MiB`;

try {
  const admin = await Lab.connect({ url, token });
  await admin.createPool({ name: 'soak', image: 'busybox', size: POOL, limits: {} });
  const clients = await Promise.all(Array.from({ length: CLIENTS }, () => Lab.connect({ url, token })));
  // warm up, then the start figure
  await Promise.all(clients.map((c) => c.pool('soak').run(['true'])));
  const rssStart = rss();
  const lat = [];
  let ok = 0,
    wrong = 0,
    failed = 0;
  const errors = new Map();
  const end = Date.now() + SECONDS * 1000;
  const t0 = performance.now();
  const samples = [];
  const sampler = setInterval(() => samples.push(rss()), 10_000);
  await Promise.all(
    clients.map(async (c) => {
      const pool = c.pool('soak');
      while (Date.now() < end) {
        const want = randomBytes(12).toString('hex');
        const s = performance.now();
        try {
          const r = await pool.run(['sh', '-c', 'echo "$WANT"; test -e /tmp/left && echo DIRTY; touch /tmp/left'], {
            env: { WANT: want },
          });
          lat.push(performance.now() - s);
          if (r.exitCode === 0 && r.stdout.toString() === `${want}\n`) ok++;
          else wrong++;
        } catch (e) {
          failed++;
          errors.set(e.code ?? e.message, (errors.get(e.code ?? e.message) ?? 0) + 1);
        }
      }
    }),
  );
  const secs = (performance.now() - t0) / 1000;
  clearInterval(sampler);
  const rssEnd = rss();
  console.log(`soak: ${CLIENTS} clients, ${SECONDS} s, a fresh sandbox per request (pool of ${POOL})`);
  console.log(
    `  requests ${ok + wrong + failed}: correct ${ok}, wrong or mixed-up ${wrong}, failed ${failed}${errors.size ? ` ${JSON.stringify(Object.fromEntries(errors))}` : ''}`,
  );
  console.log(
    `  throughput ${(ok / secs).toFixed(1)}/s; latency p50 ${pct(lat, 50).toFixed(1)} ms, p99 ${pct(lat, 99).toFixed(1)} ms`,
  );
  console.log(`  daemon RSS: start ${mib(rssStart)}, every 10 s ${samples.map(mib).join(', ')}, end ${mib(rssEnd)}`);
  for (const c of clients) c.close();

  // streamed output: in-process (the embedded library) beside through the daemon, same sandbox, alternately
  const local = await Lab.open({ home });
  const remoteBox = await admin.create({ name: 'stream', timeoutS: 0 });
  const localBox = await local.get('stream');
  const bytes = STREAM_MIB * 2 ** 20;
  const rate = async (box) => {
    let n = 0;
    const s = performance.now();
    const r = await box.exec(['head', '-c', String(bytes), '/dev/zero'], { onStdout: (b) => (n += b.length) });
    if (r.exitCode !== 0 || n !== bytes) throw new Error(`stream got ${n} of ${bytes}`);
    return bytes / 2 ** 20 / ((performance.now() - s) / 1000);
  };
  const a = [],
    b = [];
  for (let i = 0; i < 3; i++) {
    a.push(await rate(localBox));
    b.push(await rate(remoteBox));
  }
  const med = (xs) => xs.sort((x, y) => x - y)[1];
  console.log(
    `stream ${STREAM_MIB} MiB of stdout, median of 3: in-process ${med(a).toFixed(0)} MiB/s, through the daemon ${med(b).toFixed(0)} MiB/s (${(med(b) / med(a)).toFixed(2)}x)`,
  );
  localBox.close();
  local.close();
  await remoteBox.destroy();
  await admin.pool('soak').remove();
  admin.close();
  process.exitCode = wrong || failed ? 1 : 0;
} catch (e) {
  console.error(`daemon-soak: ${e.code ? `error[${e.code}]: ` : ''}${e.stack ?? e}`);
  process.exitCode = 2;
} finally {
  daemon.kill('SIGTERM');
  await new Promise((r) => daemon.once('exit', r));
  cli(['pool', 'rm', 'soak']);
  cli(['rm', '--all']);
  cli(['image', 'rm', '--force', 'busybox']);
  cli(['gc']);
  rmSync(home, { recursive: true, force: true });
}
