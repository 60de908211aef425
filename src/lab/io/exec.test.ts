import { describe, expect, it } from 'vitest';
import { keyValues, mergeEnv } from './exec.js';

describe('keyValues', () => {
  it('keeps every key as its own, __proto__ too (it was dropped: a filter of it was no filter)', () => {
    const got = keyValues(['__proto__=x', 'a=1'], 'label filter', { unique: true });
    expect(Object.keys(got)).toEqual(['__proto__', 'a']);
    expect(Object.entries(got)).toEqual([
      ['__proto__', 'x'],
      ['a', '1'],
    ]);
    expect(Object.getPrototypeOf(got)).toBe(Object.prototype);
  });

  it('refuses a key given twice where each names one (labels, filters); an environment keeps the later', () => {
    expect(() => keyValues(['env=a', 'env=b'], 'label', { unique: true })).toThrow(/label "env" given twice/);
    expect(keyValues(['K=1', 'K=2'])).toEqual({ K: '2' });
    expect(mergeEnv(['HOME=/x', 'HOME=/y'])).toContain('HOME=/y');
  });

  it('refuses an entry without KEY=', () => {
    expect(() => keyValues(['=v'], 'label')).toThrow(/invalid label "=v"/);
    expect(() => keyValues(['novalue'])).toThrow(/invalid environment entry "novalue"/);
  });
});
