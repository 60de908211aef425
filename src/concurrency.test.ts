import { describe, expect, it } from 'vitest';
import { mapLimit } from './concurrency.js';

const tick = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe('mapLimit', () => {
  it('keeps the order of its input and never has more than n in flight', async () => {
    let inFlight = 0;
    let most = 0;
    const out = await mapLimit([5, 1, 4, 2, 3, 0, 6], 3, async (x) => {
      most = Math.max(most, ++inFlight);
      await tick(x * 3);
      inFlight--;
      return x * 10;
    });
    expect(out).toEqual([50, 10, 40, 20, 30, 0, 60]);
    expect(most).toBe(3);
    expect(await mapLimit([], 4, async () => 1)).toEqual([]);
  });

  it('throws the first failure once those begun have ended, and begins no more', async () => {
    const begun: number[] = [];
    let ended = 0;
    const run = mapLimit([1, 2, 3, 4, 5, 6], 2, async (x) => {
      begun.push(x);
      await tick(x === 2 ? 1 : 20);
      ended++;
      if (x === 2) throw new Error('two');
      return x;
    });
    await expect(run).rejects.toThrow('two');
    expect(begun).toEqual([1, 2]);
    expect(ended).toBe(2);
  });
});
