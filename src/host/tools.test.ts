import { readdirSync, readFileSync } from 'node:fs';
import { basename, join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';
import { QEMU } from '../drivers/qemu/launch.js';
import { HOST_TOOLS, missingTools, toolsVerdict } from './tools.js';

const ROOT = join(import.meta.dirname, '..', '..');

function files(dir: string, ext: RegExp): string[] {
  return readdirSync(join(ROOT, dir), { withFileTypes: true, recursive: true })
    .filter((d) => d.isFile() && ext.test(d.name))
    .map((d) => relative(ROOT, join(d.parentPath, d.name)));
}

// Every way the code starts a host program by name: run()/which() (src/host/run.ts), node's
// child_process calls, and exec* in the C helpers. A call not preceded by `.` or a word character
// (so `lab.run(` and `stmt.run(` are not host programs).
const FN = 'run|which|spawn|spawnSync|execFile|execFileSync|execFileAsync|execSync|execvp|execlp|execl|execv|execve';
const AT = '(?:(?<![.\\w])|(?<=\\b(?:cp|child_process|childProcess)\\.))';
const CALL = new RegExp(`${AT}(${FN})\\(\\s*(['"])([^'"]+)\\2`, 'g');
const SPAWN_LOOP = /(?<![.\w])spawnLoop\([^,]+,[^,]+,\s*'([^']+)'/g;
// a browser that playwright starts (test/browser.ts)
const BROWSER = /executablePath:\s*'([^']+)'/g;
// any other first argument (a variable, a call, a template string) is reviewed by hand below
const CALL_NONLITERAL = new RegExp(`${AT}(${FN})\\(\\s*(?!['")\\s])([^,)]+)`, 'g');

/**
 * Calls whose program is not a string literal, reviewed one by one: each says where its program
 * comes from. A new one fails the test until it is added here (and its program to tools.json).
 */
const NONLITERAL: Record<string, string> = {
  'src/host/run.ts cmd': 'run() itself',
  'src/host/net/egress-router.ts argv[0]!': "inUplink's callers: ip, nft, sysctl, getent (listed)",
  'src/host/hostops.ts bin': 'snaplab-hostops, built by npm run build',
  'src/image/sources/busybox.ts binary': "which('busybox') (or /bin/busybox, or the caller's)",
  'src/bench/baselines.ts runc': "which('runc')",
  'src/bench/baselines.ts cmd': "spawnLoop's: its callers' programs are scanned (SPAWN_LOOP)",
  'src/agent/agent.test.ts cmd': "the agent binary, or 'bwrap' (listed)",
  'src/agent/agent.test.ts [f]': 'a file the test made executable',
  'src/agent/stream.test.ts agentBinaryPath(': 'the agent binary',
  "src/agent/stream.test.ts ['serve'": "the agent binary's arguments",
  'src/cli/doctor-checks.ts t.program': 'an entry of tools.json',
  'src/host/tools.ts t.program!': 'an entry of tools.json',
  'src/drivers/qemu/driver.ts QEMU': "'qemu-system-x86_64' (listed)",
  'src/bench/cli-bench.ts argv[0]!': "the cli bench's cases: snaplab, node, nsenter, curl (listed)",
  'src/bench/cli-bench.ts snaplab': 'the snaplab command (its serve, for the create-through-a-daemon cases)',
  'src/bench/density-fronts.ts snaplabCommand(':
    "the snaplab command of this build (the density bench's CLI and serve)",
  'test/stop-start.test.ts SNAPLAB': 'the snaplab command, built by npm run build (a start killed half-way)',
  'test/evidence.test.ts SNAPLAB':
    'the snaplab command, built by npm run build (a snapshot killed while it has its machine frozen, then ls)',
  'test/cli.test.ts SNAPLAB': 'the snaplab command, built by npm run build',
  'test/qemu.test.ts SNAPLAB': 'the snaplab command, built by npm run build',
  'test/images.test.ts SNAPLAB': 'the snaplab command, built by npm run build',
  'test/debian-image.test.ts SNAPLAB': 'the snaplab command, built by npm run build',
  'test/code-interpreter.test.ts SNAPLAB': 'the snaplab command, built by npm run build (image build)',
  'test/system.test.ts SNAPLAB': 'the snaplab command, built by npm run build',
  'test/userns.test.ts SNAPLAB': 'the snaplab command, built by npm run build (doctor)',
  'test/copy.test.ts SNAPLAB': 'the snaplab command, built by npm run build',
  'test/ports.test.ts SNAPLAB': 'the snaplab command, built by npm run build',
  'test/terminal.test.ts SNAPLAB': 'the snaplab command, built by npm run build',
  'test/standby.test.ts SNAPLAB': 'the snaplab command, built by npm run build (reset killed mid-way, gc)',
  'test/daemon-helpers.ts cmd!': 'the snaplab command, or the wrap its caller gives (prlimit, listed)',
  'test/kernel-accounting.test.ts argv[0]!': 'the filler the test builds, or nsenter (listed)',
  'test/egress.test.ts cmd': "sh()'s: ip (listed), with literal arguments",
  'test/ansible.test.ts cmd': "run()'s: its callers' programs are literals (scanned)",
  'test/ansible.test.ts SNAPLAB': 'the snaplab command, built by npm run build',
  'test/daemon-helpers.ts SNAPLAB': 'the snaplab command, built by npm run build',
  'test/daemon.test.ts SNAPLAB': 'the snaplab command, built by npm run build',
  'test/disk.test.ts SNAPLAB': 'the snaplab command, built by npm run build (a create killed mid-way)',
  'test/disk.test.ts process.execPath': 'node, running the built overlay backend in a loop beside creates',
  'test/dashboard.test.ts SNAPLAB': 'the snaplab command, built by npm run build',
  'test/soak.test.ts SNAPLAB': 'the snaplab command, built by npm run build (clean-up after a failed soak)',
  'test/escapes/escapes.test.ts join(scratch': 'the probe the test built (probe.c), on the host as a positive control',
  'src/lab/io/watch.ts [MACHINE_AGENT_PATH':
    "the machine's agent (snaplab-agent watch), run inside the machine by the sandbox's spawn",
  'src/lab/io/copy.ts hostAgentBinaryPath(': "the agent's host build (its tar and untar, on the host side of a copy)",
  'test/copy.test.ts binary(': 'each build of the agent (its untar, fed hostile archives)',
  'test/ports.test.ts agentBinaryPath(': 'the agent binary (its connect, against a host server)',
  'src/image/decompress.ts name': "'zstd' or 'xz' (listed, via decompress.ts)",
  'src/image/unpack.ts unpackBinaryPath(': 'snaplab-unpack, built by npm run build',
};
// commands that tests run to see them not found
const NOT_PROGRAMS = new Set(['no-such-command-snaplab', 'x']);
// files whose run() helper takes the agent binary's own arguments, not an argv
const AGENT_ARGS = new Set(['src/agent/stream.test.ts']);
// node itself, for the built CLI
const NODE = 'process.execPath';

function scan(): { programs: Map<string, string[]>; nonliteral: string[] } {
  const programs = new Map<string, string[]>();
  const nonliteral: string[] = [];
  for (const f of [...files('src', /\.ts$/), ...files('test', /\.ts$/), ...files('native', /\.c$/)]) {
    if (f === 'src/host/tools.test.ts') continue;
    const text = readFileSync(join(ROOT, f), 'utf8');
    for (const m of text.matchAll(CALL)) {
      const prog = basename(m[3]!.trim().split(/\s+/)[0]!);
      programs.set(prog, [...(programs.get(prog) ?? []), f]);
    }
    for (const m of text.matchAll(SPAWN_LOOP)) programs.set(m[1]!, [...(programs.get(m[1]!) ?? []), f]);
    for (const m of text.matchAll(BROWSER))
      programs.set(basename(m[1]!), [...(programs.get(basename(m[1]!)) ?? []), f]);
    if (!f.endsWith('.ts')) continue;
    for (const m of text.matchAll(CALL_NONLITERAL)) {
      const arg = m[2]!.trim();
      // an argv array (the agent's tests run it on the host: what they send are host programs)
      const argv0 = /^\[\s*'([^']+)'/.exec(arg)?.[1];
      if (argv0 !== undefined && !AGENT_ARGS.has(f))
        programs.set(basename(argv0), [...(programs.get(basename(argv0)) ?? []), f]);
      else if (arg !== NODE && !/^\w+\??: /.test(arg)) nonliteral.push(`${f} ${arg}`); // not a definition's parameter
    }
  }
  return { programs, nonliteral };
}

const listed = new Set(HOST_TOOLS.flatMap((t) => (t.program ? [t.program] : [])));
// snaplab's own binaries, started by path
const OWN = new Set([
  'snaplab-agent',
  'snaplab-hostops',
  'snaplab-unpack',
  'snaplab',
  'main.js',
  'node',
  ...NOT_PROGRAMS,
]);

describe('the list of host tools (tools.json)', () => {
  it('names every program the source runs', () => {
    const { programs } = scan();
    expect(programs.size).toBeGreaterThan(20); // the scan finds the calls at all
    const unlisted = [...programs]
      .filter(([p]) => !listed.has(p) && !OWN.has(p))
      .map(([p, where]) => `${p} (run in ${[...new Set(where)].join(', ')})`);
    expect(unlisted, 'add these to src/host/tools.json with their Debian package').toEqual([]);
    expect(listed.has(QEMU)).toBe(true); // started through a shell, by constant
  });

  it('reviews every call whose program is not a literal', () => {
    const unknown = scan().nonliteral.filter((k) => !(k in NONLITERAL));
    expect(unknown, 'say where the program comes from in NONLITERAL, and list it in tools.json').toEqual([]);
  });

  it('names no program that nothing runs', () => {
    const { programs } = scan();
    const stale = HOST_TOOLS.filter((t) => t.program && !t.via && !programs.has(t.program) && t.program !== QEMU).map(
      (t) => t.program,
    );
    expect(stale).toEqual([]);
  });

  it('gives every entry a Debian package and a reason', () => {
    for (const t of HOST_TOOLS) {
      expect(t.package).toMatch(/^[a-z0-9][a-z0-9.+-]+$/);
      expect(t.why.length).toBeGreaterThan(5);
      expect(t.for.length).toBeGreaterThan(0);
    }
  });

  it('reports a missing program with its package as the fix', async () => {
    const path = process.env.PATH;
    process.env.PATH = '/nonexistent';
    try {
      const missing = await missingTools('qemu');
      expect(missing.map((t) => t.program)).toEqual(
        expect.arrayContaining(['qemu-system-x86_64', 'depmod', 'qemu-img']),
      );
      expect(missing.map((t) => t.program)).not.toContain('lz4'); // optional: a fallback exists
      const v = await toolsVerdict('qemu', 'the VM driver');
      expect(v?.ok).toBe(false);
      expect(v?.reason).toContain('depmod (kmod');
      expect(v?.fix).toMatch(/^apt-get install .*\bkmod\b/);
    } finally {
      process.env.PATH = path;
    }
    expect(await toolsVerdict('namespaces', 'x')).toBeUndefined();
  });
});
