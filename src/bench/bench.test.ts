import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Lab } from '../sdk/lab.js';
import { disposeLab, testLab } from '../../test/helpers.js';
import { toPlan, type BenchCli } from './options.js';
import { Progress } from './progress.js';
import { prepareResultsDir, writeResults } from './results.js';
import { runBench } from './run-bench.js';

// One rung, one short rep: checks the output's shape, never the speed.
let lab: Lab;
let out: string;
const cli = (o: Partial<BenchCli>): BenchCli => ({
  workload: 'exec',
  ladder: '1',
  reps: '1',
  duration: '0.5',
  baselines: 'all',
  ...o,
});

beforeAll(async () => {
  lab = await testLab();
  out = mkdtempSync(join(tmpdir(), 'snaplab-test-bench-results-'));
});
afterAll(async () => {
  await disposeLab(lab);
  rmSync(out, { recursive: true, force: true });
});

function progressSink(): { progress: Progress; text: () => string } {
  const s = new PassThrough();
  let text = '';
  s.on('data', (b: Buffer) => (text += b.toString()));
  return { progress: new Progress(s), text: () => text };
}

describe('snaplab bench (one rung, one rep)', () => {
  it('writes summary.json of the documented shape, rung-1.json, summary.md and chart.svg', async () => {
    const plan = toPlan(cli({}), []);
    const dir = prepareResultsDir(join(out, 'exec'));
    const { progress, text } = progressSink();
    const s = await runBench(lab, plan, progress);
    writeResults(dir, s);
    expect(readdirSync(dir).sort()).toEqual(['chart.svg', 'rung-1.json', 'summary.json', 'summary.md']);
    const j = JSON.parse(readFileSync(join(dir, 'summary.json'), 'utf8'));
    expect(j).toMatchObject({
      workload: 'exec',
      argv: ['/bin/true'],
      storage: expect.stringMatching(/btrfs|overlay|dir/),
      startedAt: expect.any(String),
      ratios: expect.any(Object),
    });
    expect(j.rungs).toHaveLength(1);
    const r = j.rungs[0];
    expect(r).toMatchObject({
      concurrency: 1,
      throughput: expect.any(Number),
      latencyMs: { p50: expect.any(Number), p90: expect.any(Number), p99: expect.any(Number) },
      phasesMs: expect.any(Object),
    });
    expect(r.reps).toHaveLength(1);
    expect(r.reps[0]).toMatchObject({
      rep: 1,
      throughput: expect.any(Number),
      ops: expect.any(Number),
      latencyMs: expect.any(Object),
    });
    expect(j.floorMs).toBe(r.latencyMs.p50);
    expect(j).toHaveProperty('slopeMsPerSlot', null);
    expect(j.peak).toEqual({ concurrency: 1, throughput: r.throughput });
    const names = j.baselines.map((b: { name: string }) => b.name);
    expect(names).toEqual(expect.arrayContaining(['bare-spawn', 'raw-namespace', 'runc', 'lxc']));
    for (const name of ['bare-spawn', 'raw-namespace']) {
      const b = j.baselines.find((x: { name: string }) => x.name === name);
      expect(b).toMatchObject({
        throughput: expect.any(Number),
        latencyMs: { p50: expect.any(Number) },
        rungs: [{ concurrency: 1 }],
      });
    }
    expect(j.ratios['exec/bare-spawn throughput']).toBeGreaterThan(0);
    const rung1 = JSON.parse(readFileSync(join(dir, 'rung-1.json'), 'utf8'));
    expect(rung1).toMatchObject({ workload: 'exec', concurrency: 1, rung: { concurrency: 1, reps: [{ rep: 1 }] } });
    expect(rung1.baselines.map((b: { name: string }) => b.name)).toEqual(
      expect.arrayContaining(['bare-spawn', 'raw-namespace']),
    );
    expect(readFileSync(join(dir, 'summary.md'), 'utf8')).toMatch(/\| concurrency \| throughput \/s/);
    expect(readFileSync(join(dir, 'chart.svg'), 'utf8')).toMatch(/^<svg[\s\S]*<\/svg>\n$/);
    expect(text()).toMatch(/rung 1 \(1\/1\) rep 1\/1 exec: \d+\/s/);
    expect(() => prepareResultsDir(dir)).toThrow(/not empty/);
  });

  it('restore: snapshot once, restore in a loop, phases from the trace; --compare shape', async () => {
    const plan = toPlan(
      cli({ workload: 'restore', baselines: 'none', compare: ['--storage btrfs', '--storage overlay'] }),
      [],
    );
    const s = await runBench(lab, plan, new Progress(new PassThrough(), false));
    expect(s.rungs[0]!.ops).toBeGreaterThan(0);
    expect(Object.keys(s.rungs[0]!.phasesMs).length).toBeGreaterThan(0);
    expect(s.compare).toMatchObject({ a: { options: '--storage btrfs' }, b: { options: '--storage overlay' } });
    expect(s.compare!.rungs[0]).toMatchObject({
      concurrency: 1,
      a: { throughputReps: [expect.any(Number)] },
      b: { throughputReps: [expect.any(Number)] },
      verdict: 'noise',
    });
    expect(typeof s.compare!.rungs[0]!.overlap).toBe('boolean');
    expect(s.notes?.join()).toMatch(/one rep/);
    expect(await lab.snapshots()).toEqual([]);
    expect(existsSync(out)).toBe(true);
  });
});
