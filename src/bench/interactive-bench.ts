import { spawn } from 'node:child_process';
import { createReadStream, createWriteStream, mkdtempSync, rmSync, statSync } from 'node:fs';
import { driverInfo } from '../drivers/registry.js';
import { createConnection } from 'node:net';
import { join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { packageRoot } from '../agent/binary.js';
import { run } from '../host/run.js';
import { copyIn } from '../lab/io/copy.js';
import { closeForwards, forwardPort } from '../lab/io/ports.js';
import type { Lab } from '../sdk/lab.js';
import type { SandboxRecord } from '../store/records.js';
import type { Progress } from './progress.js';
import { pad } from './report-text.js';
import { latencySummary, type LatencySummary } from './stats.js';
import { noted } from '../cleanup.js';

/**
 * `snaplab bench --workload interactive`: what a person at a machine feels and moves.
 * - keystroke: one key to its echo, through `snaplab shell` on a host pty, beside
 *   `nsenter -t PID -a sh` (the same shell of the same machine on the host's own pty);
 * - cp: a file into the machine with `snaplab cp`, beside `cat` of it into the same storage;
 * - port-forward: a download through `snaplab port-forward`, beside the same server software
 *   (busybox httpd) on the host's loopback.
 * Cases alternate within each round; medians and ratios from the same run.
 */
export interface InteractiveSummary {
  workload: 'interactive';
  startedAt: string;
  finishedAt: string;
  settings: { driver: string; rounds: number; keystrokes: number; fileBytes: number };
  keystroke: { name: string; baseline: boolean; ms: LatencySummary & { samples: number } }[];
  throughput: { name: string; baseline: boolean; mibPerS: number[]; p50: number }[];
  ratios: { keystroke: number | null; cp: number; portForward: number };
}

const now = (): number => Number(process.hrtime.bigint()) / 1e6;

// A pty, a prompt, then N keys each timed to its echo (the shell echoes in its line editor).
const KEYS_PY = `
import os, pty, select, sys, time, json
n = int(sys.argv[1]); argv = sys.argv[2:]
pid, fd = pty.fork()
if pid == 0:
    os.execvp(argv[0], argv)
buf = b''
def wait_for(pat, t=30):
    global buf
    end = time.time() + t
    while pat not in buf:
        r, _, _ = select.select([fd], [], [], max(0, end - time.time()))
        if not r: raise SystemExit('timed out waiting for %r in %r' % (pat, buf[-200:]))
        buf += os.read(fd, 65536)
wait_for(b'# ')
time.sleep(0.3)  # the shell's line editor asks for the cursor position first
buf = b''
out = []
for i in range(n):
    k = b'abcdefghij'[i % 10:i % 10 + 1]
    t0 = time.perf_counter()
    os.write(fd, k)
    wait_for(k)
    out.append((time.perf_counter() - t0) * 1000)
    buf = b''
    if i % 20 == 19:
        os.write(fd, b'\\x15')  # ^U: an empty line again
        time.sleep(0.02)
        try:
            while select.select([fd], [], [], 0.05)[0]: os.read(fd, 65536)
        except OSError: pass
        buf = b''
os.write(fd, b'\\x15exit\\r')
try:
    while os.read(fd, 65536): pass
except OSError: pass
os.waitpid(pid, 0)
print(json.dumps(out))
`;

async function keystrokes(argv: string[], n: number, env: NodeJS.ProcessEnv): Promise<number[]> {
  const r = await run('/usr/bin/python3', ['-c', KEYS_PY, String(n), ...argv], { env });
  return JSON.parse(r.stdout) as number[];
}

async function download(port: number, bytes: number): Promise<number> {
  const t0 = now();
  await new Promise<void>((resolve, reject) => {
    let got = 0;
    const c = createConnection({ host: '127.0.0.1', port }, () => c.write('GET /big HTTP/1.0\r\n\r\n'));
    c.on('data', (b: Buffer) => (got += b.length));
    c.on('end', () => (got >= bytes ? resolve() : reject(new Error(`short download: ${got} of ${bytes} bytes`))));
    c.on('error', reject);
  });
  return now() - t0;
}

const mibs = (bytes: number, ms: number): number => Math.round((bytes / 2 ** 20 / (ms / 1000)) * 10) / 10;
const med = (xs: number[]): number => latencySummary(xs).p50;

export async function interactiveBench(
  lab: Lab,
  opts: { driver: string; rounds: number; keystrokes: number; fileMiB: number },
  progress: Progress,
): Promise<InteractiveSummary> {
  const startedAt = new Date().toISOString();
  const name = `bench-tty-${process.pid}`;
  const box = await lab.create({ name, driver: opts.driver });
  const dir = mkdtempSync(join(lab.home, `.bench-interactive-${process.pid}-`));
  const snaplab = join(packageRoot(), 'native', 'build', 'snaplab');
  const env = { ...process.env, SNAPLAB_HOME: lab.home, TERM: 'xterm' };
  const rec = box.info as SandboxRecord;
  try {
    const file = join(dir, 'big');
    progress.note(`writing a ${opts.fileMiB} MiB file`);
    await run('dd', ['if=/dev/urandom', `of=${file}`, 'bs=1M', `count=${opts.fileMiB}`, 'status=none']);
    const bytes = statSync(file).size;
    const ours: number[] = [];
    const base: number[] = [];
    const cpOurs: number[] = [];
    const cpCat: number[] = [];
    const pfOurs: number[] = [];
    const pfDirect: number[] = [];
    // a namespace machine's recorded pid is its agent, the init of its namespaces
    const caps = driverInfo(opts.driver).capabilities;
    const pid = caps.pidIsMachineInit ? (rec.pid ?? undefined) : undefined;
    // the machine serves the file over HTTP; so does the host, for the direct baseline
    await box.copyIn(file, '/tmp/big');
    await box.exec(['httpd', '-p', '8099', '-h', '/tmp']);
    const hostPort = await freePort();
    const hostHttpd = spawn('busybox', ['httpd', '-f', '-p', `127.0.0.1:${hostPort}`, '-h', dir], { stdio: 'ignore' });
    await new Promise((r) => setTimeout(r, 200));
    const fwd = await forwardPort(lab.context, rec, { local: 0, remote: 8099 }, () => {});
    try {
      for (let r = 1; r <= opts.rounds; r++) {
        ours.push(...(await keystrokes([snaplab, 'shell', name], opts.keystrokes, env)));
        if (pid) base.push(...(await keystrokes(['nsenter', '-t', String(pid), '-a', 'sh'], opts.keystrokes, env)));
        let t0 = now();
        await copyIn(lab.context, rec, file, '/tmp/cp-bench');
        cpOurs.push(mibs(bytes, now() - t0));
        await box.exec(['rm', '-f', '/tmp/cp-bench']);
        // cat into the same storage: the machine's tree (namespaces) or the home's filesystem (a VM's disk lives there)
        const target =
          caps.rootIsVolumeTree && rec.volume ? join(rec.volume.path, 'tmp', 'cat-bench') : join(dir, 'cat-bench');
        t0 = now();
        await pipeline(createReadStream(file), createWriteStream(target));
        cpCat.push(mibs(bytes, now() - t0));
        rmSync(target, { force: true });
        pfOurs.push(mibs(bytes, await download(fwd.local, bytes)));
        pfDirect.push(mibs(bytes, await download(hostPort, bytes)));
        progress.note(
          `round ${r}/${opts.rounds}: key p50 ${med(ours).toFixed(2)} ms${pid ? ` (nsenter ${med(base).toFixed(2)})` : ''}; cp ${cpOurs.at(-1)} MiB/s (cat ${cpCat.at(-1)}); port-forward ${pfOurs.at(-1)} MiB/s (direct ${pfDirect.at(-1)})`,
        );
      }
    } finally {
      await closeForwards([fwd]);
      hostHttpd.kill();
    }
    const k = latencySummary(ours);
    const kb = base.length ? latencySummary(base) : undefined;
    const keystroke = [{ name: `snaplab shell (${opts.driver})`, baseline: false, ms: { ...k, samples: ours.length } }];
    if (kb) keystroke.push({ name: 'nsenter -t PID -a sh', baseline: true, ms: { ...kb, samples: base.length } });
    const ratio = (a: number, b: number): number => Math.round((a / b) * 100) / 100;
    return {
      workload: 'interactive',
      startedAt,
      finishedAt: new Date().toISOString(),
      settings: { driver: opts.driver, rounds: opts.rounds, keystrokes: opts.keystrokes, fileBytes: bytes },
      keystroke,
      throughput: [
        { name: 'snaplab cp (host file into the machine)', baseline: false, mibPerS: cpOurs, p50: med(cpOurs) },
        { name: 'cat into the same storage', baseline: true, mibPerS: cpCat, p50: med(cpCat) },
        { name: 'download through snaplab port-forward', baseline: false, mibPerS: pfOurs, p50: med(pfOurs) },
        { name: 'download from httpd on the host loopback', baseline: true, mibPerS: pfDirect, p50: med(pfDirect) },
      ],
      ratios: {
        keystroke: kb ? ratio(k.p50, kb.p50) : null,
        cp: ratio(med(cpOurs), med(cpCat)),
        portForward: ratio(med(pfOurs), med(pfDirect)),
      },
    };
  } finally {
    await box.destroy().catch(noted(`remove ${box.name}`));
    rmSync(dir, { recursive: true, force: true });
    progress.done();
  }
}

/** A port busybox httpd can take on 127.0.0.1 (it cannot say which it picked for :0). */
async function freePort(): Promise<number> {
  const { createServer } = await import('node:net');
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

export function renderInteractiveSummary(s: InteractiveSummary): string {
  return [
    `workload interactive (${s.settings.driver}): ${s.settings.rounds} rounds of ${s.settings.keystrokes} keys; a ${(s.settings.fileBytes / 2 ** 20).toFixed(0)} MiB file`,
    ...pad(
      ['keystroke to echo', 'p50 ms', 'p90 ms', 'p99 ms', 'samples'],
      s.keystroke.map((c) => [
        `${c.name}${c.baseline ? ' (baseline)' : ''}`,
        c.ms.p50.toFixed(2),
        c.ms.p90.toFixed(2),
        c.ms.p99.toFixed(2),
        String(c.ms.samples),
      ]),
    ),
    ...pad(
      ['throughput', 'p50 MiB/s', 'rounds'],
      s.throughput.map((c) => [`${c.name}${c.baseline ? ' (baseline)' : ''}`, c.p50.toFixed(1), c.mibPerS.join(', ')]),
    ),
    `ratios (same run, p50): keystroke snaplab/nsenter = ${s.ratios.keystroke ?? 'n/a (a VM has no nsenter baseline)'}; cp/cat = ${s.ratios.cp}; port-forward/direct = ${s.ratios.portForward}`,
  ].join('\n');
}
