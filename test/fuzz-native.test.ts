/**
 * libFuzzer harnesses of the C parsers that take untrusted bytes (native/fuzz/): the agent's frame
 * decoder and request handlers (frame), the relay's routing between its clients and a VM's agent
 * (relay), the host helper's request reader and launch parser (hostops), the command's reader of a
 * daemon's answers (daemon: HTTP, JSON, ls's table), and the one tar reader of image layers and of
 * cp's receiving side (tar: native/tar.c). `make -C native fuzz`
 * builds them with clang, ASan and UBSan; each then runs for SNAPLAB_FUZZ_SECONDS (default 5) on
 * a copy of its checked-in seeds in a temp dir (`make fuzz-run-NAME`, which copies them there). A
 * crash, a leak, undefined behaviour, an input over 10 s or a failed check of the harness stops
 * the run with a non-zero exit and the input written next to the copy; the test then fails with
 * libFuzzer's report, and keeps the input in native/build/fuzz/failed/ (the temp dirs go). The
 * long run is described in docs/security.md ("Fuzzing the C parsers").
 */
import { spawn } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const SECONDS = Number(process.env.SNAPLAB_FUZZ_SECONDS ?? 5) || 5;
const ROOT = join(import.meta.dirname, '..');
const NATIVE = join(ROOT, 'native');
// a run that makes fewer inputs than this per second has stopped fuzzing (the slowest, the
// agent's, makes 2300 to 3400 a second here)
const MIN_PER_SECOND = 100;

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

interface Made {
  code: number | null;
  signal: NodeJS.Signals | null;
  out: string;
}

/** `make -s -C native ARGS`, its output (libFuzzer reports on stderr) joined; killed with its group after `timeoutMs`. */
function make(args: string[], timeoutMs: number): Promise<Made> {
  return new Promise((resolve, reject) => {
    const child = spawn('make', ['-s', '-C', NATIVE, ...args], { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
    const chunks: Buffer[] = [];
    child.stdout.on('data', (d: Buffer) => chunks.push(d));
    child.stderr.on('data', (d: Buffer) => chunks.push(d));
    const timer = setTimeout(() => {
      try {
        process.kill(-child.pid!, 'SIGKILL'); // make and the harness it runs
      } catch {
        /* gone */
      }
    }, timeoutMs);
    child.on('error', reject);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, out: Buffer.concat(chunks).toString('utf8') });
    });
  });
}

/** The figures of libFuzzer's final report (-print_final_stats=1). */
function stats(out: string): { runs: number; cov: number; ft: number; corpus: number } {
  const num = (re: RegExp) => Number(re.exec(out)?.[1] ?? NaN);
  const done = /#\d+\s+DONE\s+cov: (\d+) ft: (\d+) corp: (\d+)/.exec(out);
  return {
    runs: num(/stat::number_of_executed_units:\s+(\d+)/),
    cov: Number(done?.[1] ?? NaN),
    ft: Number(done?.[2] ?? NaN),
    corpus: Number(done?.[3] ?? NaN),
  };
}

/** A sanitizer's or libFuzzer's report from its first line (what went wrong, and where), else the last lines. */
function report(out: string): string {
  const lines = out.trimEnd().split('\n');
  const at = lines.findIndex((l) =>
    /ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|==ABORTING/.test(l),
  );
  return (at >= 0 ? lines.slice(Math.max(0, at - 2), at + 30) : lines.slice(-40)).join('\n');
}

const seeds = (name: string) => readdirSync(join(NATIVE, 'fuzz', 'corpus', name)).sort();

// as many harnesses at once as the host has cores: each is one process on one core, so each
// still fuzzes its SECONDS on a core of its own, and the file takes a third of the time on two
const AT_ONCE = Math.max(1, availableParallelism());
let running = 0;
const waiting: (() => void)[] = [];
async function onACore<T>(fn: () => Promise<T>): Promise<T> {
  while (running >= AT_ONCE) await new Promise<void>((r) => waiting.push(r));
  running++;
  try {
    return await fn();
  } finally {
    running--;
    waiting.shift()?.();
  }
}

describe('fuzzing the C parsers (libFuzzer)', () => {
  beforeAll(async () => {
    const built = await make(['fuzz'], 170_000);
    expect(
      built.code,
      `make -C native fuzz failed (clang and libclang-rt-14-dev are in src/host/tools.json):\n${report(built.out)}`,
    ).toBe(0);
  }, 180_000);

  const harnesses = {
    frame: "the agent's frame decoder and request handlers",
    relay: "the relay's routing between clients and a VM's agent",
    hostops: "the host helper's request reader and launch parser",
    daemon: "the command's reader of a daemon's answers (HTTP, JSON, ls's table)",
    tar: "the tar reader of image layers and of cp's receiving side (native/tar.c)",
  };
  for (const [name, what] of Object.entries(harnesses)) {
    it.concurrent(
      `${name}: ${what}, ${SECONDS} s without a crash, a leak or undefined behaviour`,
      async ({ expect }) => {
        const dir = mkdtempSync(join(tmpdir(), `snaplab-test-fuzz-${name}-`));
        dirs.push(dir);
        const before = seeds(name);
        let t0 = 0;
        const run = await onACore(() => {
          t0 = performance.now();
          return make([`fuzz-run-${name}`, `FUZZ_SECONDS=${SECONDS}`, `FUZZ_DIR=${dir}`], SECONDS * 1000 + 60_000);
        });
        const took = (performance.now() - t0) / 1000;
        const s = stats(run.out);
        const found = readdirSync(dir).filter((f) => f.startsWith(`${name}-`));
        const kept = join(NATIVE, 'build', 'fuzz', 'failed');
        if (found.length) mkdirSync(kept, { recursive: true });
        for (const f of found) copyFileSync(join(dir, f), join(kept, f));
        console.log(
          `${name}: ${s.runs} inputs in ${took.toFixed(1)} s (${Math.round(s.runs / took)}/s), coverage ${s.cov} edges, ${s.ft} features, corpus ${before.length} seeds -> ${s.corpus}`,
        );
        expect(
          run.code,
          `the fuzzer stopped (input kept: ${found.map((f) => join(kept, f)).join(', ') || 'none written'}):\n${report(run.out)}`,
        ).toBe(0);
        expect(found).toEqual([]);
        expect(s.runs).toBeGreaterThan(SECONDS * MIN_PER_SECOND);
        expect(s.corpus).toBeGreaterThanOrEqual(before.length / 2); // the seeds were read (libFuzzer keeps those that add coverage)
        expect(seeds(name)).toEqual(before); // the run grew its copy, never the checked-in corpus
      },
      // its turn on a core counted too: the harnesses before it, SECONDS and their start each
      Math.ceil(Object.keys(harnesses).length / AT_ONCE) * (SECONDS * 1000 + 60_000) + 30_000,
    );
  }
});

/** A request to the host helper: u32 length, u32 id, NUL-terminated strings (native/hostops.c). */
function request(id: number, ...args: string[]): Buffer {
  const payload = Buffer.from(args.map((a) => `${a}\0`).join(''));
  const head = Buffer.alloc(8);
  head.writeUInt32LE(payload.length, 0);
  head.writeUInt32LE(id, 4);
  return Buffer.concat([head, payload]);
}

describe('regressions of the C parsers, on the real binaries', () => {
  it('the host helper answers a launch whose counts overflow an int with EINVAL and serves on (it crashed)', async () => {
    // launch_parse added a request's count to an index (at + 2 + n + 3 >= argc): near INT_MAX
    // the sum wrapped, the check passed and argv[8 + n] was read 16 GiB away (SIGSEGV). Seen
    // reading it for the hostops harness, which shows it (UBSan: signed overflow). Inputs as
    // native/fuzz/corpus/hostops/regress-launch-*; paths in a temp dir in case it regresses.
    const dir = mkdtempSync(join(tmpdir(), 'snaplab-test-fuzz-hostops-'));
    dirs.push(dir);
    const helper = spawn('native/build/snaplab-hostops', [], { cwd: ROOT, stdio: ['pipe', 'pipe', 'inherit'] });
    const replies: { id: number; fields: string[] }[] = [];
    let got = Buffer.alloc(0);
    helper.stdout.on('data', (d: Buffer) => {
      got = Buffer.concat([got, d]);
      while (got.length >= 8 && got.length >= 8 + got.readUInt32LE(0)) {
        const n = got.readUInt32LE(0);
        replies.push({
          id: got.readUInt32LE(4),
          fields: got
            .subarray(8, 8 + n)
            .toString()
            .split('\0')
            .slice(0, -1),
        });
        got = got.subarray(8 + n);
      }
    });
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
      helper.on('close', (code, signal) => resolve({ code, signal })),
    );
    helper.stdin.write(
      request(
        1,
        'launch',
        join(dir, 'log'),
        '1000',
        join(dir, 's'),
        '-',
        '1:1',
        'overlay',
        '2147483647',
        'a',
        'b',
        'c',
        'd',
        'e',
      ),
    );
    helper.stdin.write(
      request(
        2,
        'launch',
        join(dir, 'log'),
        '1000',
        join(dir, 's'),
        '-',
        '-',
        '2147483647',
        join(dir, 'cgroup.procs'),
        'true',
      ),
    );
    helper.stdin.write(request(3, 'ping'));
    const deadline = Date.now() + 10_000;
    while (replies.length < 3 && helper.exitCode === null && helper.signalCode === null && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 20));
    helper.stdin.end();
    expect(await exited).toEqual({ code: 0, signal: null });
    const byId = new Map(replies.map((r) => [r.id, r.fields]));
    expect(byId.get(1)?.slice(0, 2)).toEqual(['err', '22']);
    expect(byId.get(2)).toEqual(['err', '22', 'launch: bad cgroup count: Invalid argument']);
    expect(byId.get(3)).toEqual(['ok']);
    expect(readdirSync(dir)).toEqual([]); // nothing was launched
  });
});
