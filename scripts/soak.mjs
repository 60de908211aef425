#!/usr/bin/env node
/**
 * The soak (#17, item 5): many clients of one `snaplab serve` run fresh executions from a pool for
 * a while, with random commands (ordinary ones, exit codes, signals, timeouts, fork bombs, memory
 * and disk filled to their limits, processes left behind), while the daemon itself is SIGKILLed
 * and started again at random. At the end every execution must have its right result (or have
 * been cut by a kill of the daemon, inside a kill's window, and said so), the pool's counters must
 * add up, and once the pool and its machines are removed nothing of this home may be left on the
 * host: mounts, cgroups, processes, loop devices, user-namespace id claims, /dev/shm files.
 *
 *   node scripts/soak.mjs [--clients 64] [--duration 600] [--kill-every 20] [--pool-size 8] [--json] [--host-wide]
 *                         [--hostile [--flood 600] [--slow 50]]
 *
 * --host-wide also fails on any snaplab cgroup that appeared on the host during the soak and is
 * still there, from whatever home (the test suite, which runs nothing else meanwhile, uses it).
 *
 * --hostile (issue 30): the daemon listens on TCP too; a quarter of the clients run over TCP with
 * a key, and hostile clients beside them (scripts/soak-hostile.mjs: a flood of held half-requests,
 * slowloris, requests cut at random, all without a valid key) try to stall it. The honest ones'
 * answers must stay right; compare their p99 with a run without --hostile (at most 2×).
 *
 * It makes a home of its own under /tmp (or --home DIR), run as root. Exit status 0 when every
 * check holds, 1 otherwise; the report (--json: one JSON object) says what was counted.
 */
import { spawn } from 'node:child_process';
import { createHash, randomBytes, randomInt } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { parseArgs } from 'node:util';

const root = join(import.meta.dirname, '..');
const SNAPLAB = join(root, 'native', 'build', 'snaplab');
const { values: o } = parseArgs({
  options: {
    clients: { type: 'string', default: '64' },
    duration: { type: 'string', default: '600' },
    'kill-every': { type: 'string', default: '20' },
    'pool-size': { type: 'string', default: '8' },
    home: { type: 'string' },
    json: { type: 'boolean', default: false },
    'host-wide': { type: 'boolean', default: false },
    hostile: { type: 'boolean', default: false },
    flood: { type: 'string', default: '600' },
    slow: { type: 'string', default: '50' },
  },
});
const clients = Number(o.clients);
const durationMs = Number(o.duration) * 1000;
const killEveryMs = Number(o['kill-every']) * 1000;
const poolSize = Number(o['pool-size']);
for (const [k, v] of [
  ['clients', clients],
  ['duration', durationMs],
  ['kill-every', killEveryMs],
  ['pool-size', poolSize],
]) {
  if (!Number.isFinite(v) || v < 0) {
    console.error(
      `error[BAD_INPUT]: --${k} must be a number ≥ 0\nhint: e.g. --clients 64 --duration 600 --kill-every 20 --pool-size 8`,
    );
    process.exit(2);
  }
}
const home = o.home ?? mkdtempSync('/tmp/snaplab-soak-');
const env = { ...process.env, SNAPLAB_HOME: home };
const log = (m) => process.stderr.write(`soak: ${m}\n`);

const MIB = 2 ** 20;
const LIMITS = { memoryBytes: 64 * MIB, pids: 128, diskBytes: 32 * MIB };

/** The snaplab CLI, for set-up and clean-up (not timed). */
function cli(args) {
  return new Promise((resolve) => {
    const p = spawn(SNAPLAB, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    p.stdout.on('data', (b) => (out += b));
    p.stderr.on('data', (b) => (out += b));
    p.on('exit', (code) => resolve({ code, out }));
  });
}

// ---- the daemon, killed and started again (on the same TCP port, with --hostile) ----
const tcpPort = o.hostile
  ? await new Promise((resolve) => {
      const probe = createServer().listen(0, '127.0.0.1', () => {
        const { port } = probe.address();
        probe.close(() => resolve(port));
      });
    })
  : 0;
let daemon;
const kills = []; // [from, to]: the daemon was killed at `from` and answered again at `to`
async function startDaemon() {
  const listen = tcpPort ? ['--listen', `127.0.0.1:${tcpPort}`] : [];
  const proc = spawn(SNAPLAB, ['serve', ...listen], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let err = '';
  proc.stderr.on('data', (b) => (err = (err + b).slice(-4000)));
  await new Promise((resolve, reject) => {
    let out = '';
    proc.stdout.on('data', (b) => {
      out += b;
      if (out.includes('\n')) resolve();
    });
    proc.once('exit', (c) => reject(new Error(`snaplab serve exited ${c}: ${err}`)));
  });
  proc.stdout.resume();
  daemon = { proc, exited: new Promise((r) => proc.once('exit', r)) };
}

const { Lab } = await import(join(root, 'dist', 'sdk', 'index.js'));
log(
  `home ${home}; ${clients} clients, ${durationMs / 1000} s, a kill every ~${killEveryMs / 1000} s, pool of ${poolSize}`,
);
await startDaemon();
const lab = await Lab.connect({ url: `unix:${join(home, 'daemon.sock')}` });
const pool = await lab.createPool({ name: 'soak', image: 'busybox', size: poolSize, limits: LIMITS, recycle: true });
// --hostile: honest clients over TCP with a key beside those on the socket, and the hostile ones
const tcpLab = tcpPort
  ? await Lab.connect({
      url: `http://127.0.0.1:${tcpPort}`,
      // (cli gives stdout and stderr together: the key is the line that is one)
      token: /^snaplab_\S+$/m.exec((await cli(['key', 'create', 'soak-honest', '--scope', 'read,exec'])).out)?.[0],
    })
  : undefined;
const hostile = tcpPort
  ? spawn(
      process.execPath,
      [join(root, 'scripts', 'soak-hostile.mjs'), String(tcpPort), '--flood', o.flood, '--slow', o.slow],
      {
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    )
  : undefined;
let hostileOut = '';
hostile?.stdout.on('data', (b) => (hostileOut += b));
// watched from the start: one that ended early is reported, not waited for
const hostileEnded = hostile && new Promise((r) => hostile.once('exit', (code, sig) => r(`${code ?? sig}`)));

// ---- the executions ----
// Each begins by looking for what an earlier execution may have left in its machine: the file that
// "leave a file" writes, or the process that "leave a process" leaves. Seeing one is a wrong
// result: dirt that reached the next execution.
const PRELUDE = '[ -e /tmp/soak-mark ] && echo DIRTY-FILE; ps -o comm | grep -qx sleep && echo DIRTY-PROC; ';
const SIGNALS = { TERM: 15, KILL: 9, USR1: 10 };
const KINDS = [
  ['ok', 30],
  ['exit', 15],
  ['signal', 10],
  ['timeout', 8],
  ['fork bomb', 4],
  ['memory', 6],
  ['disk', 6],
  ['leave a process', 6],
  ['leave a file', 6],
  ['stdin', 9],
];
const total = KINDS.reduce((n, [, w]) => n + w, 0);
function pick() {
  let r = randomInt(total);
  for (const [k, w] of KINDS) if ((r -= w) < 0) return k;
  return 'ok';
}

/** The command for a kind, and what its result must be. */
function plan(kind) {
  const token = randomBytes(6).toString('hex');
  const sh = (body, opts = {}) => ({ argv: ['sh', '-c', PRELUDE + body], opts: { timeoutMs: 60_000, ...opts } });
  switch (kind) {
    case 'ok':
      return {
        ...sh(`echo out-${token}; echo err-${token} >&2`),
        check: (r) => r.exitCode === 0 && r.stdout === `out-${token}\n` && r.stderr === `err-${token}\n`,
      };
    case 'exit': {
      const n = randomInt(1, 120);
      return { ...sh(`echo ${token}; exit ${n}`), check: (r) => r.exitCode === n && r.stdout === `${token}\n` };
    }
    case 'signal': {
      const [name, num] = Object.entries(SIGNALS)[randomInt(3)];
      return {
        ...sh(`echo ${token}; kill -${name} $$; sleep 5`),
        check: (r) => r.signal === num && r.stdout === `${token}\n` && !r.timedOut,
      };
    }
    case 'timeout':
      // (the deadline may fall before the shell has printed anything, on a loaded host)
      return {
        ...sh(`echo ${token}; sleep 30`, { timeoutMs: 300 }),
        check: (r) => r.timedOut === true && (r.stdout === `${token}\n` || r.stdout === ''),
      };
    case 'fork bomb':
      // bounded by the pids limit, ended by its deadline: the agent kills its process group
      // (stopped by its deadline, or its shell could not fork its sleep and said so)
      return {
        ...sh('b() { b | b & }; b; sleep 30', { timeoutMs: 1500 }),
        check: (r) => r.timedOut === true || (r.exitCode !== 0 && /fork|resource/i.test(r.stderr)),
      };
    case 'memory':
      // at once, past the limit (a command that creeps up to the limit instead can thrash in
      // reclaim for a minute under cgroup v1 before the OOM killer acts: docs/security.md)
      return { ...sh('dd if=/dev/zero of=/dev/null bs=200M count=1'), check: (r) => r.oomKilled === true };
    case 'disk':
      return {
        ...sh('dd if=/dev/zero of=/tmp/fill bs=1M count=128 2>&1; echo rc=$?'),
        check: (r) => /quota|space/i.test(r.stdout) && /rc=[1-9]/.test(r.stdout) && !/DIRTY/.test(r.stdout),
      };
    case 'leave a process':
      return {
        ...sh(`sleep 1000 >/dev/null 2>&1 & echo ${token}`),
        check: (r) => r.exitCode === 0 && r.stdout === `${token}\n`,
      };
    case 'leave a file':
      return {
        ...sh(`echo ${token} > /tmp/soak-mark; cat /tmp/soak-mark`),
        check: (r) => r.exitCode === 0 && r.stdout === `${token}\n`,
      };
    case 'stdin':
      return {
        ...sh('cat'),
        opts: { timeoutMs: 60_000, stdin: `in-${token}` },
        check: (r) => r.exitCode === 0 && r.stdout === `in-${token}`,
      };
    default:
      throw new Error(kind);
  }
}

const results = []; // {kind, via, outcome: 'right' | 'wrong' | 'cut', ms, detail?}
const HANG_MS = 90_000;
let refusedWhileDown = 0;
const deadline = Date.now() + durationMs;
// only the daemon's transport: a machine that died (AGENT_UNREACHABLE, SANDBOX_DEAD) is a wrong result
const daemonGone = (e) => e?.code === 'DAEMON_UNREACHABLE';
const text = (b) => (typeof b === 'string' ? b : Buffer.from(b ?? '').toString('utf8'));

async function client(via) {
  const runner = via === 'tcp' ? tcpLab.pool('soak') : pool;
  while (Date.now() < deadline) {
    const kind = pick();
    const p = plan(kind);
    const t0 = Date.now();
    try {
      // a call that is never answered is a wrong result (a hang), not a soak that never ends
      let hung;
      const r = await Promise.race([
        runner.run(p.argv, p.opts),
        new Promise((_, reject) => {
          hung = setTimeout(
            () => reject(Object.assign(new Error(`no answer in ${HANG_MS / 1000} s`), { code: 'HUNG' })),
            HANG_MS,
          );
        }),
      ]).finally(() => clearTimeout(hung));
      const res = {
        exitCode: r.exitCode,
        signal: r.signal,
        timedOut: r.timedOut,
        oomKilled: r.oomKilled,
        stdout: text(r.stdout),
        stderr: text(r.stderr),
      };
      const dirty = /DIRTY/.test(res.stdout);
      const right = !dirty && p.check(res);
      results.push({
        kind,
        via,
        outcome: right ? 'right' : 'wrong',
        at: t0,
        ms: Date.now() - t0,
        sandbox: r.sandbox,
        ...(right ? {} : { detail: JSON.stringify({ ...res, sandbox: r.sandbox, hit: r.hit }).slice(0, 600) }),
      });
    } catch (e) {
      const t1 = Date.now();
      // cut by a kill of the daemon: only while it was down, or across a kill
      if (e?.code === 'DAEMON_UNREACHABLE' && /^cannot reach the daemon/.test(e.message)) {
        // the daemon is down: nothing was started; try again in a moment (not an execution)
        refusedWhileDown++;
        await new Promise((r) => setTimeout(r, 200 + randomInt(300)));
      } else if (daemonGone(e)) {
        results.push({
          kind,
          via,
          outcome: 'cut',
          at: t0,
          ms: t1 - t0,
          end: t1,
          detail: `${e.code ?? ''} ${e.message}`.slice(0, 200),
        });
        await new Promise((r) => setTimeout(r, 200 + randomInt(300)));
      } else {
        results.push({
          kind,
          via,
          outcome: 'wrong',
          at: t0,
          ms: t1 - t0,
          detail: `${e.code ?? ''} ${e.message}`.slice(0, 600),
        });
      }
    }
  }
}

async function killer() {
  if (!killEveryMs) return;
  for (;;) {
    const wait = killEveryMs * (0.5 + Math.random());
    if (Date.now() + wait > deadline - 3000) return;
    await new Promise((r) => setTimeout(r, wait));
    const from = Date.now();
    daemon.proc.kill('SIGKILL');
    await daemon.exited;
    await new Promise((r) => setTimeout(r, randomInt(100, 1000)));
    await startDaemon();
    kills.push([from, Date.now()]);
    log(`killed the daemon (${kills.length}); back after ${Date.now() - from} ms`);
  }
}

// Every sandbox id this home holds, sampled while the soak runs (from the store and the run and
// volume directories), for the look at what is left on the host at the end.
const sandboxIds = new Set();
const { default: Database } = await import('better-sqlite3');
function sampleIds() {
  try {
    const db = new Database(join(home, 'state.db'), { readonly: true, fileMustExist: true });
    for (const row of db.prepare('SELECT id FROM sandboxes').all()) sandboxIds.add(row.id);
    db.close();
  } catch {
    /* busy: the next sample */
  }
  for (const dir of [join(home, 'run'), join(home, 'btrfs', 'volumes'), join(home, 'storage')]) {
    for (const n of existsSync(dir) ? readdirSync(dir) : []) if (/^[0-9a-f]{12}$/.test(n)) sandboxIds.add(n);
  }
}
const sampler = setInterval(sampleIds, 100);
const cgroupsOnHost = () =>
  new Set(
    ['/sys/fs/cgroup', ...readdirSync('/sys/fs/cgroup').map((d) => `/sys/fs/cgroup/${d}`)].flatMap((b) =>
      existsSync(`${b}/snaplab`)
        ? readdirSync(`${b}/snaplab`, { withFileTypes: true })
            .filter((e) => e.isDirectory())
            .map((e) => `${b}/snaplab/${e.name}`)
        : [],
    ),
  );
const cgroupsBefore = cgroupsOnHost();

const t0 = Date.now();
// with --hostile a quarter of the clients (at least one) go over TCP with the key
const tcpClients = tcpLab ? Math.max(1, Math.floor(clients / 4)) : 0;
await Promise.all([killer(), ...Array.from({ length: clients }, (_, i) => client(i < tcpClients ? 'tcp' : 'socket'))]);
const wallMs = Date.now() - t0;
let hostileCounts = null;
if (hostile) {
  hostile.kill('SIGTERM');
  const status = await hostileEnded;
  try {
    hostileCounts = JSON.parse(hostileOut);
  } catch {
    hostileCounts = { error: `the hostile clients ended early (${status}): ${hostileOut.slice(0, 200)}` };
  }
}

// a cut execution must overlap a kill; any other is a wrong one
for (const r of results) {
  if (r.outcome !== 'cut') continue;
  const overlaps = kills.some(([from, to]) => r.at <= to + 1000 && r.end >= from);
  if (!overlaps) r.outcome = 'wrong';
}

// ---- the pool's counters, once the daemon has settled ----
const settle = Date.now() + 30_000;
let stats = await pool.stats();
while (stats.inUse > 0 && Date.now() < settle) {
  await new Promise((r) => setTimeout(r, 500));
  stats = await pool.stats();
}
const count = (f) => results.filter(f).length;
const done = count((r) => r.outcome !== 'cut');
const cut = count((r) => r.outcome === 'cut');
const left = count((r) => r.kind.startsWith('leave a') && r.outcome === 'right');
const takes = stats.hits + stats.misses;
const counters = {
  hits: stats.hits,
  misses: stats.misses,
  recycled: stats.recycled,
  refusedDirty: stats.refusedDirty,
  leaks: stats.leaks,
  ready: stats.ready,
  inUse: stats.inUse,
};
const counterChecks = [
  [`every execution answered took a machine: hits + misses (${takes}) ≥ answered (${done})`, takes >= done],
  [`no take without an execution: hits + misses (${takes}) ≤ answered + cut (${done + cut})`, takes <= done + cut],
  [
    `a machine goes back at most once per take: recycled + refused dirty (${stats.recycled + stats.refusedDirty}) ≤ takes (${takes})`,
    stats.recycled + stats.refusedDirty <= takes,
  ],
  [
    `every machine left dirty was refused: refused dirty (${stats.refusedDirty}) ≥ answered "leave a process" and "leave a file" (${left})`,
    stats.refusedDirty >= left,
  ],
  [`nothing in use once the clients stopped (${stats.inUse})`, stats.inUse === 0],
  // a leak is a standby found dead or orphaned: only a kill of the daemon makes them (the machines
  // it held for executions then cut, and those it was raising: at most 2 refills at a time)
  [
    `leaks (${stats.leaks}) only from kills: ≤ executions cut (${cut}) + 2 refills per kill (${2 * kills.length})`,
    stats.leaks <= cut + 2 * kills.length,
  ],
  // not vacuous: machines did go back, and dirty ones were met and refused
  [
    `recycling happened: recycled (${stats.recycled}) > 0 and refused dirty (${stats.refusedDirty}) > 0`,
    stats.recycled > 0 && stats.refusedDirty > 0,
  ],
];

// ---- clean-up, then what is left of this home on the host ----
sampleIds();
clearInterval(sampler);
lab.close();
tcpLab?.close();
daemon.proc.kill('SIGTERM');
const stopped = await Promise.race([
  daemon.exited.then(() => true),
  new Promise((r) => setTimeout(() => r(false), 30_000)),
]);
if (!stopped) {
  log('the daemon did not stop within 30 s of SIGTERM: killed');
  daemon.proc.kill('SIGKILL');
  await daemon.exited;
}
const rmPool = await cli(['pool', 'rm', 'soak']);
const rmAll = await cli(['rm', '--all']);
const gc = await cli(['gc', '--json']);
let gcRemoved = [];
try {
  gcRemoved = JSON.parse(gc.out).removed ?? [];
} catch {
  gcRemoved = [gc.out.trim()];
}
await cli(['image', 'rm', '--force', 'busybox']);
await cli(['gc']);

function leftOnHost() {
  const found = [];
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n'))
    if (line.includes(home)) found.push(`mount ${line.split(' ')[4]}`);
  const ids = sandboxIds;
  for (const base of readdirSync('/sys/fs/cgroup')
    .map((d) => `/sys/fs/cgroup/${d}`)
    .concat('/sys/fs/cgroup')) {
    for (const id of ids) if (existsSync(`${base}/snaplab/${id}`)) found.push(`cgroup ${base}/snaplab/${id}`);
  }
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      const cg = readFileSync(`/proc/${pid}/cgroup`, 'utf8');
      for (const id of ids) if (cg.includes(`/snaplab/${id}`)) found.push(`process ${pid} in ${id}`);
    } catch {
      /* gone */
    }
  }
  for (const dev of readdirSync('/sys/block').filter((d) => d.startsWith('loop'))) {
    try {
      const f = readFileSync(`/sys/block/${dev}/loop/backing_file`, 'utf8').trim();
      if (f.startsWith(home)) found.push(`loop /dev/${dev} → ${f}`);
    } catch {
      /* not attached */
    }
  }
  const reg = '/run/snaplab/userns';
  for (const n of existsSync(reg) ? readdirSync(reg) : []) {
    try {
      if (JSON.parse(readFileSync(join(reg, n), 'utf8')).home === home) found.push(`user-namespace claim ${n}`);
    } catch {
      /* being written or gone */
    }
  }
  // processes that name this home (a relay, a helper or a daemon a kill left behind)
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p) && Number(p) !== process.pid)) {
    try {
      const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
      const envn = readFileSync(`/proc/${pid}/environ`, 'utf8');
      if (cmd.includes(home) || envn.split('\0').includes(`SNAPLAB_HOME=${home}`))
        found.push(`process ${pid} (${cmd.replace(/\0/g, ' ').trim().slice(0, 80)})`);
    } catch {
      /* gone */
    }
  }
  if (o['host-wide'])
    for (const cg of cgroupsOnHost())
      if (!cgroupsBefore.has(cg)) found.push(`cgroup ${cg} (new on the host since the soak began)`);
  const shm = `snaplab-${createHash('sha256').update(home).digest('hex').slice(0, 8)}-`;
  for (const n of readdirSync('/dev/shm')) if (n.startsWith(shm)) found.push(`/dev/shm/${n}`);
  return found;
}
const leftover = leftOnHost();

const byKind = Object.fromEntries(
  KINDS.map(([k]) => [
    k,
    {
      right: count((r) => r.kind === k && r.outcome === 'right'),
      wrong: count((r) => r.kind === k && r.outcome === 'wrong'),
      cut: count((r) => r.kind === k && r.outcome === 'cut'),
    },
  ]),
);
const wrong = results.filter((r) => r.outcome === 'wrong');
const lat = results
  .filter((r) => r.outcome === 'right')
  .map((r) => r.ms)
  .sort((a, b) => a - b);
const q = (p, l = lat) => (l.length ? l[Math.min(l.length - 1, Math.floor(p * l.length))] : null);
const latOf = (via) =>
  results
    .filter((r) => r.outcome === 'right' && r.via === via)
    .map((r) => r.ms)
    .sort((a, b) => a - b);
const report = {
  clients,
  durationS: durationMs / 1000,
  wallS: Math.round(wallMs / 100) / 10,
  poolSize,
  executions: results.length,
  right: count((r) => r.outcome === 'right'),
  wrong: wrong.length,
  cut,
  refusedWhileDown,
  perSecond: Math.round((done / (wallMs / 1000)) * 10) / 10,
  latencyMs: { p50: q(0.5), p99: q(0.99) },
  ...(hostile
    ? {
        hostile: hostileCounts,
        tcpClients,
        latencyByVia: Object.fromEntries(
          ['socket', 'tcp'].map((v) => [v, { n: latOf(v).length, p50: q(0.5, latOf(v)), p99: q(0.99, latOf(v)) }]),
        ),
      }
    : {}),
  kills: kills.length,
  byKind,
  counters,
  counterChecks: counterChecks.map(([what, ok]) => ({ what, ok })),
  cleanup: { poolRm: rmPool.code, rmAll: rmAll.code, gcRemoved },
  sandboxesSeen: sandboxIds.size,
  leftOnHost: leftover,
  wrongExamples: wrong.slice(0, 10),
  slowest: [...results]
    .sort((a, b) => b.ms - a.ms)
    .slice(0, 5)
    .map((r) => ({ kind: r.kind, outcome: r.outcome, ms: r.ms, atS: Math.round((r.at - t0) / 100) / 10 })),
};
// without kills nothing can be half-made: the clean-up's gc must find nothing then
const gcOk = kills.length > 0 || gcRemoved.length === 0;
report.gcCheck = { what: `with no kill, gc after the clean-up removes nothing (${gcRemoved.length})`, ok: gcOk };
// the hostile clients must have run all along (an early end would leave the daemon unattacked)
const hostileOk = !hostile || (hostileCounts !== null && !hostileCounts.error);
report.hostileCheck = hostile ? { what: 'the hostile clients ran to the end', ok: hostileOk } : undefined;
const ok =
  hostileOk &&
  wrong.length === 0 &&
  counterChecks.every(([, c]) => c) &&
  gcOk &&
  leftover.length === 0 &&
  rmPool.code === 0 &&
  rmAll.code === 0;
report.ok = ok;
if (o.json) console.log(JSON.stringify(report, null, 2));
else {
  console.log(
    `${report.executions} executions in ${report.wallS} s by ${clients} clients (${report.perSecond}/s answered; p50 ${report.latencyMs.p50} ms, p99 ${report.latencyMs.p99} ms), ${kills.length} kills of the daemon`,
  );
  console.log(
    `right ${report.right}, wrong ${report.wrong}, cut by a kill ${cut} (and ${refusedWhileDown} calls refused while the daemon was down, not counted)`,
  );
  for (const [k, v] of Object.entries(byKind))
    console.log(`  ${k.padEnd(16)} right ${v.right}  wrong ${v.wrong}  cut ${v.cut}`);
  if (hostile)
    console.log(
      `hostile clients: ${JSON.stringify(hostileCounts)}; honest by way: ${JSON.stringify(report.latencyByVia)}`,
    );
  console.log(`pool: ${JSON.stringify(counters)}`);
  for (const [what, c] of counterChecks) console.log(`  ${c ? 'ok  ' : 'FAIL'} ${what}`);
  console.log(
    `gc after the clean-up removed: ${gcRemoved.length ? gcRemoved.join('; ') : 'nothing'}${gcOk ? '' : ' FAIL (no kill made anything half)'}`,
  );
  console.log(`left on the host: ${leftover.length ? leftover.join('; ') : 'nothing'}`);
  for (const w of wrong.slice(0, 10)) console.log(`  wrong: ${w.kind}: ${w.detail}`);
  console.log(`slowest: ${report.slowest.map((r) => `${r.kind} (${r.outcome}) ${r.ms} ms at ${r.atS} s`).join('; ')}`);
  console.log(ok ? 'soak: ok' : 'soak: FAILED');
}
if (!o.home && leftover.length === 0) rmSync(home, { recursive: true, force: true });
process.exit(ok ? 0 : 1);
