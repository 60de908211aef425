#!/usr/bin/env node
// How the dashboard's machine list holds up under a fleet: N real machines (default 500) made
// through a daemon in a scratch home, the list opened in Debian's headless Chromium, then
// pause/resume events at a steady rate (default 100/s) for a while. Prints JSON:
//   renderMs      navigation → every row in the DOM
//   eventToDomMs  p50/p99/max from the API's answer to a pause or resume → that row's new state in the DOM
//   frames        the longest gap between animation frames during the storm, and long tasks (> 50 ms)
// Usage: node scripts/dashboard-load.mjs [--machines 500] [--rate 100] [--seconds 10]
// Everything it made is removed at the end (rm --all, gc), also after a failure.
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { chromium } from 'playwright-core';

/** A `.catch` for a promise rejected only to stop the run: its rejection is awaited where it is raced. */
const handledElsewhere = () => {};

const { values } = parseArgs({
  options: {
    machines: { type: 'string', default: '500' },
    rate: { type: 'string', default: '100' },
    seconds: { type: 'string', default: '10' },
  },
});
const N = Number(values.machines);
const RATE = Number(values.rate);
const SECONDS = Number(values.seconds);
const SNAPLAB = join(import.meta.dirname, '..', 'native', 'build', 'snaplab');
const home = mkdtempSync(join(tmpdir(), 'snaplab-dashboard-load-'));
const env = { ...process.env, SNAPLAB_HOME: home };
const cli = (...args) => spawnSync(SNAPLAB, args, { env, encoding: 'utf8' });
const log = (m) => process.stderr.write(`${m}\n`);
// a closed stderr (piped into head) or an interrupt must not skip the clean-up below
process.stderr.on('error', () => {});
process.stdout.on('error', () => {});
let interrupted = false;
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'])
  process.once(sig, () => {
    interrupted = true;
    stop?.();
  });
let stop;
const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? Math.round(s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] * 10) / 10 : null;
};

let daemon;
let browser;
try {
  const key = cli('key', 'create', 'load', '--scope', 'read,exec,admin').stdout.trim();
  daemon = spawn(SNAPLAB, ['serve', '--listen', '127.0.0.1:0', '--default-timeout', '0'], {
    env,
    stdio: ['ignore', 'pipe', 'ignore'],
  });
  const url = await new Promise((resolve, reject) => {
    let out = '';
    daemon.stdout.on('data', (c) => {
      out += c;
      if (out.includes('\n')) resolve(JSON.parse(out.split('\n')[0]).url);
    });
    daemon.once('exit', (c) => reject(new Error(`snaplab serve exited ${c}`)));
  });
  const call = async (method, path, body) => {
    const res = await fetch(`${url}${path}`, {
      method,
      headers: { authorization: `Bearer ${key}`, ...(body ? { 'content-type': 'application/json' } : {}) },
      body: body && JSON.stringify(body),
    });
    if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${await res.text()}`);
    return res.status === 204 ? undefined : res.json();
  };

  const aborted = new Promise((_, reject) => {
    stop = () => reject(new Error('interrupted'));
  });
  aborted.catch(handledElsewhere);
  log(`making ${N} machines…`);
  const t0 = Date.now();
  const ids = [];
  let next = 0;
  let made = 0;
  await Promise.race([
    aborted,
    Promise.all(
      Array.from({ length: 8 }, async () => {
        while (next < N && !interrupted) {
          const i = next++;
          ids[i] = (await call('POST', '/sandboxes', { image: 'busybox', name: `m${i}`, timeoutS: 0 })).id; // m${i}'s id, whatever order they end in
          if (++made % 100 === 0) log(`  ${made}/${N}`);
        }
      }),
    ),
  ]);
  log(`  made in ${((Date.now() - t0) / 1000).toFixed(1)} s`);

  browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    // playwright would exit on these itself, before the clean-up: they are this script's to handle
    handleSIGINT: false,
    handleSIGTERM: false,
    handleSIGHUP: false,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1',
    ],
  });
  const page = await (await browser.newContext({ viewport: { width: 1280, height: 800 } })).newPage();
  await page.addInitScript((k) => sessionStorage.setItem('snaplab.key', k), key);
  const navStart = Date.now();
  // the whole fleet on one page (?per: 100 a page by default), so that every event has its row in view
  await page.goto(`${url}/?per=${Math.min(N, 1000)}#/machines`);
  await page.waitForFunction((n) => document.querySelectorAll('tr[data-machine]').length >= n, N, {
    timeout: 120_000,
    polling: 'raf',
  });
  const renderMs = Date.now() - navStart;
  log(`list of ${N} rendered in ${renderMs} ms`);

  // record, in the page, when each row's state changes, every frame gap and every long task
  await page.evaluate(() => {
    const w = window;
    w.__changes = [];
    w.__gaps = [];
    w.__long = [];
    // what the event stream said, beside what the rows show (to tell a lost event from a lost render)
    w.__events = [];
    const es = new EventSource(`/events?token=${encodeURIComponent(sessionStorage.getItem('snaplab.key'))}`);
    for (const t of ['paused', 'resumed'])
      es.addEventListener(t, (m) => {
        const e = JSON.parse(m.data);
        w.__events.push([e.name, t, Date.now()]);
      });
    new MutationObserver((ms) => {
      const at = Date.now();
      for (const m of ms)
        if (m.attributeName === 'data-state')
          w.__changes.push([m.target.getAttribute('data-machine'), m.target.getAttribute('data-state'), at]);
    }).observe(document.querySelector('tbody'), {
      attributes: true,
      subtree: true,
      attributeFilter: ['data-state'],
      childList: true,
    });
    let last = performance.now();
    const tick = (t) => {
      w.__gaps.push(t - last);
      last = t;
      if (!w.__stop) requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
    new PerformanceObserver((l) => {
      for (const e of l.getEntries()) w.__long.push(e.duration);
    }).observe({ type: 'longtask', buffered: false });
  });

  // a quiet spell first: what the page costs with no events (usage polls, the clock)
  await new Promise((r) => setTimeout(r, 5000));
  const idle = await page.evaluate(() => {
    const w = window;
    const o = { gaps: w.__gaps.splice(0), long: w.__long.splice(0) };
    return o;
  });

  // pause/resume at RATE events per second: each machine paused, then resumed, round robin
  log(`events at ${RATE}/s for ${SECONDS} s…`);
  const sent = []; // [name, state, answeredAt]
  const paused = new Set();
  const stormStart = Date.now();
  let k = 0;
  const inflight = [];
  while (Date.now() - stormStart < SECONDS * 1000 && !interrupted) {
    const due = stormStart + (k * 1000) / RATE;
    const wait = due - Date.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    const i = k % N;
    const name = `m${i}`;
    const to = paused.has(name) ? 'resume' : 'pause';
    if (to === 'pause') paused.add(name);
    else paused.delete(name);
    inflight.push(
      call('POST', `/sandboxes/${ids[i]}/${to}`).then(() =>
        sent.push([name, to === 'pause' ? 'paused' : 'running', Date.now()]),
      ),
    );
    k++;
  }
  await Promise.all(inflight);
  const achieved = k / ((Date.now() - stormStart) / 1000);
  await new Promise((r) => setTimeout(r, 3000)); // the last events reach the page
  const { changes, gaps, long, events } = await page.evaluate(() => {
    window.__stop = true;
    return { changes: window.__changes, gaps: window.__gaps, long: window.__long, events: window.__events };
  });
  // each answered call → the first change of that row to that state after it was sent
  const lat = [];
  const missing = [];
  const byRow = new Map();
  for (const c of changes) byRow.set(c[0], [...(byRow.get(c[0]) ?? []), c]);
  for (const [name, state, at] of sent) {
    const seen = (byRow.get(name) ?? []).find((c) => c[1] === state && c[2] >= at - 1000);
    if (seen) {
      lat.push(Math.max(0, seen[2] - at));
      byRow.set(
        name,
        byRow.get(name).filter((c) => c !== seen),
      );
    } else
      missing.push({
        name,
        state,
        at,
        seen: (byRow.get(name) ?? []).map((c) => [c[1], c[2] - at]),
        events: events.filter((e) => e[0] === name).map((e) => [e[1], e[2] - at]),
      });
  }
  const out = {
    machines: N,
    renderMs,
    idle: {
      seconds: 5,
      maxGapMs: pct(idle.gaps, 100),
      longTasks: idle.long.length,
      longestTaskMs: pct(idle.long, 100),
    },
    events: {
      asked: RATE,
      achievedPerS: Math.round(achieved * 10) / 10,
      sent: sent.length,
      shown: lat.length,
      missing: missing.length,
      ...(missing.length ? { missed: missing.slice(0, 5) } : {}),
    },
    eventToDomMs: { p50: pct(lat, 50), p99: pct(lat, 99), max: pct(lat, 100) },
    frames: {
      count: gaps.length,
      p50GapMs: pct(gaps, 50),
      p99GapMs: pct(gaps, 99),
      maxGapMs: pct(gaps, 100),
      longTasks: long.length,
      longestTaskMs: pct(long, 100),
    },
  };
  process.stdout.write(`${JSON.stringify(out, null, 2)}\n`);
} catch (e) {
  log(`error: ${e.message}`);
  process.exitCode = 1;
} finally {
  await browser?.close().catch((e) => log(`cleanup: close the browser: ${e.message}`));
  if (daemon) {
    daemon.kill('SIGTERM');
    await new Promise((r) => daemon.once('exit', r));
  }
  log('cleaning up…');
  cli('rm', '--all');
  cli('image', 'rm', '--force', 'busybox');
  cli('gc');
  rmSync(home, { recursive: true, force: true });
}
