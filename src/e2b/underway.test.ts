import { describe, expect, it } from 'vitest';
import { Underway } from './underway.js';

describe('Underway', () => {
  it("says a call's sandbox was forgotten while it ran, and only that sandbox's calls", async () => {
    const u = new Underway();
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const a = u.run('a', async () => {
      await gate;
      return 'made in a';
    });
    const b = u.run('b', async () => {
      await gate;
      return 'made in b';
    });
    u.forget('a');
    release();
    expect(await a).toEqual({ value: 'made in a', forgotten: true });
    expect(await b).toEqual({ value: 'made in b', forgotten: false });
    // a forget before a call does not mark it
    expect(await u.run('a', async () => 1)).toEqual({ value: 1, forgotten: false });
  });
});
