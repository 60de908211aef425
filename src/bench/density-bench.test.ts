import { mkdirSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { disposeLab, testLab } from '../../test/helpers.js';
import { agentBinaryPath } from '../agent/binary.js';
import { densityBench, parseCounts, renderDensitySummary } from './density-bench.js';
import { Progress } from './progress.js';
import { FRONT_OPS } from './density-fronts.js';

// A bounded density ladder (0 and a few idle machines, two samples each): the output's shape and
// the cleanup, never the speed. The full ladder is `snaplab bench --workload density`.
const homes = (): string[] => readdirSync(tmpdir()).filter((d) => d.startsWith('snaplab-bench-density-'));

/** `snaplab serve` processes on a bench home's socket */
const daemons = (): string[] =>
  readdirSync('/proc')
    .filter((p) => /^\d+$/.test(p))
    .map((p) => {
      try {
        return readFileSync(`/proc/${p}/cmdline`, 'utf8').replaceAll('\0', ' ');
      } catch {
        return ''; // exited meanwhile
      }
    })
    .filter((c) => /serve --socket \S*snaplab-bench-density-\S*\/d\.sock/.test(c));

function sink(onLine: (line: string) => void = () => undefined): { progress: Progress; lines: string[] } {
  const lines: string[] = [];
  const out = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const l of chunk.toString().split('\n').filter(Boolean)) {
        lines.push(l);
        onLine(l);
      }
      done();
    },
  });
  return { progress: new Progress(out), lines };
}

describe('snaplab bench --workload density (bounded)', () => {
  it('times every operation at each count, reads memory per idle sandbox, and removes all it made', async () => {
    const before = homes();
    const { progress, lines } = sink();
    const s = await densityBench({ counts: [0, 6], samples: 2, concurrency: 3 }, progress);
    expect(s.points.map((p) => p.count)).toEqual([0, 6]);
    // the library's, and the fronts': a pool take, the CLI as processes, a daemon on the home and its API
    for (const p of s.points)
      for (const op of [...(['create', 'exec', 'snapshot', 'restore', 'list', 'rm', 'gc'] as const), ...FRONT_OPS]) {
        expect(p.ms[op].samples).toBe(2);
        expect(p.ms[op].p50).toBeGreaterThan(0);
        expect(p.ms[op].p95).toBeGreaterThanOrEqual(p.ms[op].p50!);
      }
    expect(s.points[0]!.memory).toBeNull();
    const at6 = s.points[1]!;
    expect(at6.bulk).toMatchObject({ made: 6, perSecond: expect.any(Number) });
    // the floor beside it, in the same run: util-linux's unshare of the same namespaces
    expect(at6.bulk!.unsharePerSecond).toBeGreaterThan(0);
    // what each idle sandbox's cgroup is charged: its agent's pages and kernel memory, not nothing
    expect(at6.memory!.cgroupKiB).toBeGreaterThan(16);
    expect(at6.memory!.counters).toHaveProperty('SUnreclaim');
    // the daemon's own memory, read from its process with every machine adopted: a node process's
    expect(at6.daemon!.rssKiB).toBeGreaterThan(20_000);
    expect(at6.daemon!.peakKiB).toBeGreaterThanOrEqual(at6.daemon!.rssKiB);
    expect(at6.loadavg).toHaveLength(3);
    expect(renderDensitySummary(s)).toMatch(/^workload density[\s\S]*\n6 +[\d.]+ \/ [\d.]+/m);
    expect(renderDensitySummary(s)).toMatch(/serve, adopted p50\/p95 ms[\s\S]*\n6 +[\d.]+ \/ [\d.]+/);
    // a daemon's start is at least a process's: it answered only once up
    expect(at6.ms.serve.p50).toBeGreaterThan(at6.ms.apiPage.p50!);
    expect(lines.join('\n')).toMatch(
      /at 6: p50 ms create [\d.]+, .*gc [\d.]+, .*serve [\d.]+.*; bulk [\d.]+\/s \(unshare [\d.]+\/s\)/,
    );
    expect(homes()).toEqual(before);
  }, 240_000); // 136 s at a load average of 12–20 before the ls --limit and --count samples (node's starts: the CLI's and the daemon's, at each count)

  it('an abort between steps removes the machines already made', async () => {
    const before = homes();
    const ac = new AbortController();
    // aborted once the fill toward the second count has made its machines
    const { progress } = sink((l) => {
      if (/^… at 4: timing/.test(l)) ac.abort();
    });
    await expect(
      densityBench({ counts: [4, 8], samples: 1, concurrency: 2 }, progress, ac.signal),
    ).rejects.toMatchObject({ code: 'ABORTED' });
    expect(homes()).toEqual(before);
  });

  it('an abort with the daemon up stops the daemon and removes everything', async () => {
    const before = homes();
    const running = daemons();
    const ac = new AbortController();
    const { progress } = sink((l) => {
      if (/a daemon on the bench home answers/.test(l)) ac.abort();
    });
    await expect(densityBench({ counts: [0], samples: 1, concurrency: 1 }, progress, ac.signal)).rejects.toMatchObject({
      code: 'ABORTED',
    });
    expect(homes()).toEqual(before);
    expect(daemons()).toEqual(running);
  });

  it('a sample that fails is recorded with what it said, and the run goes on', async () => {
    const before = homes();
    // the daemon's socket path taken by a directory: every start of a daemon on the home fails
    let home = '';
    const { progress, lines } = sink((l) => {
      home ||= /^… in (\S+) \(removed at the end\)/.exec(l)?.[1] ?? '';
      if (/^… at 0: timing/.test(l)) mkdirSync(join(home, 'd.sock'));
    });
    const s = await densityBench({ counts: [0], samples: 2, concurrency: 1 }, progress);
    const p = s.points[0]!;
    expect(p.failures).toHaveLength(2);
    expect(p.failures[0]).toMatchObject({
      what: 'serve',
      code: 'DAEMON_ERROR',
      message: expect.stringContaining('d.sock'),
    });
    expect(p.ms.serve).toEqual({ p50: null, p95: null, samples: 0 });
    expect(p.daemon).toBeNull();
    // what did not fail is measured as always
    for (const op of ['create', 'exec', 'gc', 'poolTake', 'cliCreate', 'cliLs'] as const)
      expect(p.ms[op].samples).toBe(2);
    expect(lines.join('\n')).toMatch(/a serve sample failed: \[DAEMON_ERROR\]/);
    expect(lines.join('\n')).toMatch(/at 0: p50 ms create [\d.]+, .*serve -, .*; 2 sample\(s\) failed/);
    expect(renderDensitySummary(s)).toMatch(/at 0: a serve sample failed: \[DAEMON_ERROR\]/);
    expect(homes()).toEqual(before);
  }, 120_000);

  it('--counts takes ascending whole numbers', () => {
    expect(parseCounts('0,1000,5000,10000')).toEqual([0, 1000, 5000, 10000]);
    for (const bad of ['1000,0', '0,0', '-1', 'x', '1.5'])
      expect(() => parseCounts(bad)).toThrow(expect.objectContaining({ code: 'BAD_INPUT' }));
  });
});

/**
 * The host's live processes in a sandbox's cgroup, by name. A killed monitor stays a zombie until
 * the host's init reaps it (seconds, on these hosts' process_api), and the pids controller counts
 * it until then: zombies are not the sandbox's.
 */
function liveProcesses(id: string): string[] {
  const names: string[] = [];
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      if (!readFileSync(`/proc/${pid}/cgroup`, 'utf8').includes(`/snaplab/${id}`)) continue;
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      if (stat.replace(/^.*\) /s, '')[0] !== 'Z') names.push(stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')')));
    } catch {
      /* gone meanwhile */
    }
  }
  return names;
}

describe('an idle sandbox on the host (docs/architecture.md "Density")', () => {
  it("holds its agent alone: bwrap's monitor is let go once the agent serves, and the sandbox lives on", async () => {
    const lab = await testLab();
    const agent = readFileSync(agentBinaryPath());
    try {
      const box = await lab.create();
      expect(liveProcesses(box.id)).toEqual(['agent']);
      const r = await box.exec(['sh', '-c', 'echo $$; cat /proc/1/cmdline | tr "\\0" " "']);
      expect(r.stdout.toString()).toMatch(/^\d+\n\/run\/snaplab\/agent serve /);
      // every sandbox maps the host's one agent binary: root inside can neither write it nor remount it writable
      for (const argv of [
        ['sh', '-c', 'echo x > /run/snaplab/agent'],
        ['mount', '-o', 'remount,bind,rw', '/run/snaplab/agent'],
        ['chmod', '777', '/run/snaplab/agent'],
      ])
        expect((await box.exec(argv)).exitCode).not.toBe(0);
      expect(readFileSync(agentBinaryPath()).equals(agent)).toBe(true);
      // a snapshot freezes and thaws the cgroup; a restore launches again
      await box.snapshot('idle');
      const back = await lab.restore('idle');
      expect((await back.exec(['/bin/true'])).exitCode).toBe(0);
      expect(liveProcesses(back.id)).toEqual(['agent']);
    } finally {
      await disposeLab(lab);
    }
  });
});
