import { describe, expect, it } from 'vitest';
import { fit, floorMs, overlap, peak, slopeMsPerSlot, verdict } from './fit.js';

const rung = (concurrency: number, throughput: number, p50: number) => ({
  concurrency,
  throughput,
  latencyMs: { p50 },
});

describe('ladder fit', () => {
  it('the floor is p50 at the lowest rung, whatever the order', () => {
    expect(floorMs([rung(8, 900, 9), rung(1, 300, 3.5), rung(4, 800, 5)])).toBe(3.5);
    expect(floorMs([])).toBeNaN();
  });

  it('the slope is the least-squares line of p50 over concurrency', () => {
    // exactly p50 = 2 + 0.5·c
    expect(slopeMsPerSlot([1, 2, 4, 8, 16].map((c) => rung(c, 100, 2 + 0.5 * c)))).toBe(0.5);
    // noisy points: the fit uses all of them (the end points alone would give 5/3)
    expect(slopeMsPerSlot([rung(1, 1, 3.5), rung(2, 1, 4.5), rung(3, 1, 7.5), rung(4, 1, 8.5)])).toBe(1.8);
    expect(slopeMsPerSlot([rung(1, 1, 3), rung(2, 1, 3)])).toBe(0);
    expect(slopeMsPerSlot([rung(4, 1, 3)])).toBeNull();
  });

  it('the peak is the rung with the most throughput, the lower rung on a tie', () => {
    expect(peak([rung(1, 300, 1), rung(2, 700, 1), rung(4, 700, 2), rung(8, 650, 4)])).toEqual({
      concurrency: 2,
      throughput: 700,
    });
    expect(fit([rung(1, 300, 1), rung(2, 500, 3)])).toEqual({
      floorMs: 1,
      slopeMsPerSlot: 2,
      peak: { concurrency: 2, throughput: 500 },
    });
  });

  it('overlap compares the reps ranges', () => {
    expect(overlap([10, 12, 14], [13, 15, 16])).toBe(true);
    expect(overlap([10, 12], [12, 13])).toBe(true);
    expect(overlap([10, 11, 12], [13, 14, 15])).toBe(false);
  });

  it('a win needs non-overlapping reps; inside the overlap, or with one rep, it is noise', () => {
    expect(verdict([20, 21, 22], [10, 11, 12])).toBe('A faster');
    expect(verdict([10, 11, 12], [20, 21, 22])).toBe('B faster');
    expect(verdict([10, 15, 22], [12, 13, 14])).toBe('noise');
    expect(verdict([30], [10])).toBe('noise');
  });
});
