import { expect, it } from 'vitest';
import { E2bState } from './state.js';

const KEY = 'e2b_0123456789abcdef0123456789abcdef01234567';
// the state's sessions alone: no call here opens a key's lab
const state = () => new E2bState(() => Promise.reject(new Error('no lab in this test')));

it('refuses a session to a sandbox told ended, so a connect that found it before its end leaves none behind', () => {
  const s = state();
  const token = s.session('live', KEY);
  expect(s.session('live', KEY)).toBe(token);
  expect(s.sessionCount).toBe(1);
  // its end, told by the daemon: its session goes
  s.endedElsewhere('live');
  expect(s.sessionCount).toBe(0);
  // a connect or create answering after the end (its lookup came before it) gets a not-found
  expect(() => s.session('live', KEY)).toThrow(expect.objectContaining({ code: 'SANDBOX_NOT_FOUND' }));
  // one the front never had, ended: the same
  s.endedElsewhere('never');
  expect(() => s.session('never', KEY)).toThrow(expect.objectContaining({ code: 'SANDBOX_NOT_FOUND' }));
  expect(s.sessionCount).toBe(0);
  // others are not touched
  expect(typeof s.session('other', KEY)).toBe('string');
  expect(s.sessionCount).toBe(1);
});

it('remembers ended sandboxes up to a bound, the oldest let go first', () => {
  const s = state();
  for (let i = 0; i <= 10_000; i++) s.endedElsewhere(`gone-${i}`);
  // the first is past the bound: a session may be made of it (its id will not come again)
  expect(typeof s.session('gone-0', KEY)).toBe('string');
  expect(() => s.session('gone-1', KEY)).toThrow(expect.objectContaining({ code: 'SANDBOX_NOT_FOUND' }));
  expect(() => s.session('gone-10000', KEY)).toThrow(expect.objectContaining({ code: 'SANDBOX_NOT_FOUND' }));
});
