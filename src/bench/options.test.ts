import { describe, expect, it } from 'vitest';
import { SnaplabError } from '../errors.js';
import { parseCompare, splitWords, spreadCompare, toPlan, type BenchCli } from './options.js';

const cli = (o: Partial<BenchCli>): BenchCli => ({
  workload: 'exec',
  reps: '3',
  duration: '2',
  baselines: 'all',
  ...o,
});

function badInput(f: () => unknown): SnaplabError {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(SnaplabError);
    expect((e as SnaplabError).code).toBe('BAD_INPUT');
    expect((e as SnaplabError).hint).toBeTruthy();
    return e as SnaplabError;
  }
  throw new Error('expected a BAD_INPUT error');
}

describe('bench options', () => {
  it('splits option strings as a shell would', () => {
    expect(splitWords(` --storage  btrfs --fill "1 M" 'a b'\\ c `)).toEqual([
      '--storage',
      'btrfs',
      '--fill',
      '1 M',
      'a b c',
    ]);
  });

  it('spreads --compare A B into two --compare options, never after --', () => {
    expect(
      spreadCompare(['--compare', '--recycle on', '--recycle off', '--reps', '2', '--', '--compare', 'x', 'y']),
    ).toEqual(['--compare', '--recycle on', '--compare', '--recycle off', '--reps', '2', '--', '--compare', 'x', 'y']);
  });

  it('parses --compare strings with the command options', () => {
    expect(parseCompare('--recycle off --pool-size 4')).toEqual({ recycle: 'off', poolSize: '4' });
    expect(parseCompare('--storage=overlay')).toEqual({ storage: 'overlay' });
  });

  it('an unknown option inside --compare is an error', () => {
    expect(badInput(() => parseCompare('--no-such-option 1')).message).toMatch(/no-such-option/);
    expect(badInput(() => toPlan(cli({ compare: ['--storage btrfs', '--bogus'] }), [])).message).toMatch(/--bogus/);
    expect(badInput(() => parseCompare('stray')).message).toMatch(/stray|argument/);
    expect(badInput(() => parseCompare('--reps 2')).message).toMatch(/cannot differ/);
  });

  it('a bad value is an error, never ignored', () => {
    badInput(() => toPlan(cli({ workload: 'nope' }), []));
    badInput(() => toPlan(cli({ ladder: '1,x' }), []));
    badInput(() => toPlan(cli({ ladder: '1,2', concurrency: '4' }), []));
    badInput(() => toPlan(cli({ baselines: 'bare-spawn,nope' }), []));
    badInput(() => toPlan(cli({ workload: 'fresh-exec', recycle: 'maybe' }), []));
    badInput(() => toPlan(cli({ recycle: 'on' }), []));
    badInput(() => toPlan(cli({ workload: 'fresh-exec', compare: ['--recycle on', '--recycle sometimes'] }), []));
    badInput(() => toPlan(cli({ compare: ['--storage btrfs'] }), []));
    badInput(() => toPlan(cli({ compare: ['--storage zfs', '--storage btrfs'] }), []));
  });

  it("measures a system machine's raise against systemd-nspawn, and only that", () => {
    expect(toPlan(cli({ workload: 'raise', init: 'systemd', image: 'sysd' }), []).baselines).toEqual(['nspawn']);
    expect(toPlan(cli({ workload: 'raise' }), []).baselines).not.toContain('nspawn');
    badInput(() => toPlan(cli({ workload: 'raise', init: 'systemd', baselines: 'runc' }), []));
    badInput(() => toPlan(cli({ workload: 'raise', baselines: 'nspawn' }), []));
  });

  it('builds the plan: ladder sorted, one-rung shorthand, compare variants', () => {
    expect(toPlan(cli({ ladder: '4,1,2' }), []).ladder).toEqual([1, 2, 4]);
    expect(toPlan(cli({ concurrency: '8' }), ['/bin/echo', 'x'])).toMatchObject({
      ladder: [8],
      argv: ['/bin/echo', 'x'],
      reps: 3,
      durationMs: 2000,
    });
    const p = toPlan(cli({ workload: 'fresh-exec', compare: ['--recycle on', '--recycle off --pool-size 2'] }), []);
    expect(p.variants.map((v) => [v.label, v.recycle, v.poolSize])).toEqual([
      ['A', true, undefined],
      ['B', false, 2],
    ]);
    expect(p.argv).toEqual(['/bin/true']);
  });

  it('defaults each workload to a ladder it can run here, and refuses one it cannot before measuring', () => {
    const scn = { workload: 'scenario-reset', scenario: 'x.yaml', baselines: 'none' };
    expect(toPlan(cli(scn), []).ladder).toEqual([1]);
    expect(toPlan(cli({ ...scn, workload: 'scenario-up' }), []).ladder).toEqual([1]);
    expect(badInput(() => toPlan(cli({ ...scn, ladder: '1,2' }), [])).message).toMatch(
      /rung 2 .*one scenario at a time/,
    );
    const host = { vms: { max: 2, why: 'VMs are emulated here (TCG)' } };
    const vm = (o: Partial<BenchCli>) => toPlan(cli({ driver: 'qemu', baselines: 'none', ...o }), [], undefined, host);
    expect(vm({ workload: 'restore' }).ladder).toEqual([1, 2]);
    expect(vm({ workload: 'raise' }).ladder).toEqual([1, 2]);
    expect(vm({ workload: 'exec' }).ladder).toEqual([1, 2, 4, 8, 16, 32, 64]); // one VM, many commands
    expect(toPlan(cli({ workload: 'restore', baselines: 'none' }), [], undefined, host).ladder).toHaveLength(7); // namespaces
    const e = badInput(() => vm({ workload: 'restore', ladder: '1,4,8' }));
    expect(e.message).toMatch(/rung 4, 8 .*emulated/);
    expect(e.hint).toMatch(/SNAPLAB_VM_BOOT_TIMEOUT_MS/);
  });
});
