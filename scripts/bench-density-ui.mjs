#!/usr/bin/env node
/**
 * Density of the cluster node's publish and of the dashboard's machine list (docs/benchmarks.md,
 * Density: node entry and machine list). One home with N idle busybox sandboxes (default 300),
 * one etcd member, and in the same run:
 *   - a plain daemon, then a node of BEFORE's package, then a node of this one: the daemon's CPU
 *     and the etcd revisions (one a write) over an idle window and over E pause/resume events of
 *     one sandbox; publish CPU per event = (node's event CPU - its idle) - (plain's - its idle)
 *   - the write size of the node's entry and of one sandbox entry
 *   - the time Chromium takes from navigation to the list's rows, with BEFORE_WEB's bundle and
 *     with this one's (5 loads each, median; BEFORE_ROWS: the rows BEFORE_WEB draws, when it pages
 *     too), and the daemon's CPU with the list open beside none (its usage polls included)
 * usage: node scripts/bench-density-ui.mjs BEFORE_PACKAGE_DIR BEFORE_WEB_DIR [N]
 * (BEFORE_WEB_DIR: a dist/web built before; BEFORE_PACKAGE_DIR: a built checkout, e.g. main)
 */
import { spawn, spawnSync } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { createServer } from 'node:net';
import { loadavg, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { chromium } from 'playwright-core';
import { Lab } from '../dist/sdk/index.js';

const [beforePkg, beforeWeb, n = '300'] = process.argv.slice(2);
const N = Number(n);
const EVENTS = 20;
const here = resolve(import.meta.dirname, '..');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const freePort = () =>
  new Promise((ok) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });

// BENCH_HOME: a home of an earlier run of this script to fill up and reuse
const home = process.env.BENCH_HOME ?? mkdtempSync(join(tmpdir(), 'snaplab-dens-ui-bench-'));
const env = { ...process.env, SNAPLAB_HOME: home };
const cli = (pkg, args) => spawnSync('node', [join(pkg, 'dist/bin/snaplab.js'), ...args], { env, encoding: 'utf8' });

/** the process's CPU time so far (ms) */
function cpuMs(pid) {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return ((Number(f[11]) + Number(f[12])) * 1000) / 100;
}

/** daemons this script started and has not stopped: stopped before its cleanup, whatever failed */
const serving = new Set();

async function serve(pkg, extra) {
  const p = spawn('node', [join(pkg, 'dist/bin/snaplab.js'), 'serve', '--listen', '127.0.0.1:0', ...extra], {
    env,
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const line = await new Promise((ok, no) => {
    let out = '';
    p.stdout.on('data', (b) => {
      out += b;
      if (out.includes('\n')) ok(out.split('\n')[0]);
    });
    p.once('exit', (c) => no(new Error(`serve exited ${c}`)));
  });
  const exited = new Promise((r) => p.once('exit', r)).finally(() => serving.delete(stop));
  const stop = () => {
    p.kill('SIGTERM');
    return exited;
  };
  serving.add(stop);
  return {
    pid: p.pid,
    url: JSON.parse(line).url,
    stop,
  };
}

const sock = (path, method = 'GET') =>
  spawnSync('curl', ['-s', '-X', method, '--unix-socket', join(home, 'daemon.sock'), `http://x${path}`], {
    encoding: 'utf8',
  }).stdout;

/** etcd's JSON gateway: every key and value (base64) */
async function etcdAll(url) {
  const r = await fetch(`${url}/v3/kv/range`, {
    method: 'POST',
    body: JSON.stringify({ key: 'AA==', range_end: 'AA==' }),
  });
  const j = await r.json();
  return { rev: Number(j.header.revision), kvs: j.kvs ?? [] };
}

/** CPU and etcd revisions over an idle window, then over EVENTS pause/resume events */
async function windows(d, etcdUrl, box) {
  await sleep(6000); // joined, first heartbeats written
  const t0 = Date.now();
  const [c0, r0] = [cpuMs(d.pid), (await etcdAll(etcdUrl)).rev];
  await sleep(10_000);
  const idleMs = Date.now() - t0;
  const [c1, r1] = [cpuMs(d.pid), (await etcdAll(etcdUrl)).rev];
  for (let i = 0; i < EVENTS; i++) {
    sock(`/sandboxes/${box}/${i % 2 ? 'resume' : 'pause'}`, 'POST');
    await sleep(300);
  }
  await sleep(1000);
  const evMs = Date.now() - t0 - idleMs;
  const [c2, r2] = [cpuMs(d.pid), (await etcdAll(etcdUrl)).rev];
  const idleCpu = (c1 - c0) / idleMs;
  const idleRev = (r1 - r0) / idleMs;
  return {
    cpuPerEvent: (c2 - c1 - idleCpu * evMs) / EVENTS,
    writesPerEvent: (r2 - r1 - idleRev * evMs) / EVENTS,
    idleCpuPerS: idleCpu * 1000,
  };
}

async function renderMs(url, key, rows) {
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox'],
  });
  const ms = [];
  for (let i = 0; i < 5; i++) {
    const ctx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    const page = await ctx.newPage();
    await page.addInitScript(`sessionStorage.setItem('snaplab.key', ${JSON.stringify(key)})`);
    const t = Date.now();
    await page.goto(`${url}/#/machines`);
    await page.waitForFunction((n) => document.querySelectorAll('tbody tr[data-machine]').length >= n, Number(rows), {
      timeout: 120_000,
    });
    ms.push(Date.now() - t);
    await ctx.close();
  }
  await browser.close();
  return median(ms);
}

/**
 * The daemon's CPU (ms a second) over 10 s with no page open, then over 10 s with the machine
 * list open in Chromium (after its rows are drawn and 2 s more): what the open list costs it, its
 * polls of GET /usage included.
 */
async function openCpu(d, url, key, rows) {
  const window = async () => {
    const [c0, t0] = [cpuMs(d.pid), Date.now()];
    await sleep(10_000);
    return ((cpuMs(d.pid) - c0) / (Date.now() - t0)) * 1000;
  };
  const idle = await window();
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox'],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
    await page.addInitScript(`sessionStorage.setItem('snaplab.key', ${JSON.stringify(key)})`);
    await page.goto(`${url}/#/machines`);
    await page.waitForFunction((n) => document.querySelectorAll('tbody tr[data-machine]').length >= n, Number(rows), {
      timeout: 120_000,
    });
    await sleep(2000);
    const open = await window();
    return {
      idleCpuMsPerS: Math.round(idle),
      openCpuMsPerS: Math.round(open),
      listCostMsPerS: Math.round(open - idle),
    };
  } finally {
    await browser.close();
  }
}

/** the plain daemon, then a node of BEFORE's package, then one of this */
async function nodes(out, etcdUrl, client, beforePkg) {
  const plain = await serve(here, []);
  out.plain = await windows(plain, etcdUrl, 'd0');
  await plain.stop();
  // BENCH_SKIP_BEFORE_NODE=1: a home this package's store has migrated past what BEFORE reads
  // (STATE_TOO_NEW) runs this package's node only
  const arms = [
    ['before', beforePkg],
    ['after', here],
  ].filter(([name]) => name !== 'before' || !process.env.BENCH_SKIP_BEFORE_NODE);
  for (const [name, pkg] of arms) {
    const d = await serve(pkg, ['--node', '--cluster', `etcd://127.0.0.1:${client}`, '--node-name', `n-${name}`]);
    out[name] = await windows(d, etcdUrl, 'd0');
    out[name].publishCpuPerEvent = out[name].cpuPerEvent - out.plain.cpuPerEvent;
    const { kvs } = await etcdAll(etcdUrl);
    const size = (re) =>
      Buffer.from(kvs.find((k) => re.test(Buffer.from(k.key, 'base64').toString())).value, 'base64').length;
    out[name].nodeEntryBytes = size(new RegExp(`nodes/n-${name}$`));
    out[name].sandboxEntryBytes = size(/sandboxes\//);
    await d.stop();
  }
}

async function main() {
  const key = cli(here, ['key', 'create', `bench-${Date.now()}`, '--scope', 'read,exec,admin']).stdout.trim();
  const made = Date.now();
  // through the library, four at a time (a CLI process per create is most of a create's CPU)
  const lab = await Lab.open({ home });
  const have = new Set((await lab.list({ check: false })).map((b) => b.name));
  const todo = Array.from({ length: N }, (_, i) => `d${i}`).filter((name) => !have.has(name));
  const worker = async () => {
    for (let name = todo.shift(); name; name = todo.shift()) (await lab.create({ image: 'busybox', name })).close();
  };
  await Promise.all([worker(), worker(), worker(), worker()]);
  const count = (await lab.list({ check: false })).length;
  lab.close();
  console.log(JSON.stringify({ sandboxes: count, createS: (Date.now() - made) / 1000, load: loadavg() }));
  const [client, peer] = [await freePort(), await freePort()];
  const etcdUrl = `http://127.0.0.1:${client}`;
  const etcd = spawn(
    'etcd',
    [
      '--data-dir',
      join(home, 'etcd'),
      '--listen-client-urls',
      etcdUrl,
      '--advertise-client-urls',
      etcdUrl,
      '--listen-peer-urls',
      `http://127.0.0.1:${peer}`,
    ],
    { stdio: 'ignore' },
  );
  await sleep(3000);
  const out = { sandboxes: count, events: EVENTS };
  try {
    // BENCH_ONLY=render: the dashboard's part alone
    if (process.env.BENCH_ONLY !== 'render') await nodes(out, etcdUrl, client, beforePkg);
    // the dashboard: this package's daemon, with the web bundle before (a copy of this package
    // with BEFORE_WEB as its dist/web) and after
    const pkg = mkdtempSync(join(tmpdir(), 'snaplab-dens-ui-pkg-'));
    try {
      cpSync(join(here, 'package.json'), join(pkg, 'package.json'));
      symlinkSync(join(here, 'node_modules'), join(pkg, 'node_modules'));
      cpSync(join(here, 'dist'), join(pkg, 'dist'), {
        recursive: true,
        filter: (f) => !f.startsWith(join(here, 'dist', 'web')),
      });
      cpSync(beforeWeb, join(pkg, 'dist', 'web'), { recursive: true });
      const old = await serve(pkg, []);
      const rows = Number(process.env.BEFORE_ROWS ?? count);
      // a BEFORE that fails under the count (it did: every machine's cgroup read at once, EMFILE)
      // is recorded as such, and the run goes on to this one's
      try {
        out.renderBefore = {
          rows,
          ms: await renderMs(old.url, key, rows),
          ...(await openCpu(old, old.url, key, rows)),
        };
      } catch (e) {
        out.renderBefore = { rows, error: String(e.message ?? e).split('\n')[0] };
      }
      await old.stop();
    } finally {
      rmSync(pkg, { recursive: true, force: true });
    }
    const d = await serve(here, []);
    const rows = Math.min(100, count);
    out.renderAfter = { rows, ms: await renderMs(d.url, key, rows), ...(await openCpu(d, d.url, key, rows)) };
    await d.stop();
  } finally {
    await Promise.all([...serving].map((stop) => stop()));
    etcd.kill();
    out.load = loadavg();
    console.log(JSON.stringify(out, null, 1));
    if (!process.env.BENCH_HOME) {
      // as the tests clean a home of theirs: its sandboxes, its image, then gc (its btrfs unmounted)
      cli(here, ['rm', '--all']);
      cli(here, ['image', 'rm', '--force', 'busybox']);
      cli(here, ['gc']);
      rmSync(home, { recursive: true, force: true });
    }
  }
}

await main();
