import { describe, expect, it } from 'vitest';
import { SnaplabError } from './errors.js';

describe('SnaplabError', () => {
  it('keeps the (code, message, hint) signature and says no cause when it has none', () => {
    const e = new SnaplabError('BAD_INPUT', 'bad', 'do this');
    expect(e.toJSON()).toEqual({ code: 'BAD_INPUT', message: 'bad', hint: 'do this' });
    expect(new SnaplabError('INTERNAL', 'x').toJSON()).toEqual({ code: 'INTERNAL', message: 'x' });
  });

  it('keeps its cause (ES2022 option) and toJSON says it: a SnaplabError by code and message, any other by message', () => {
    const errno = Object.assign(new Error('EACCES: permission denied, open /x'), { code: 'EACCES' });
    const e = new SnaplabError('FILE_ERROR', 'cannot read /x', undefined, { cause: errno });
    expect(e.cause).toBe(errno);
    expect(e.toJSON()).toEqual({
      code: 'FILE_ERROR',
      message: 'cannot read /x',
      cause: { message: 'EACCES: permission denied, open /x' },
    });
    const outer = new SnaplabError('LAUNCH_FAILED', 'no identity', 'see the trace', {
      cause: new SnaplabError('TIMEOUT', 'agent slow'),
    });
    expect(outer.toJSON()).toEqual({
      code: 'LAUNCH_FAILED',
      message: 'no identity',
      hint: 'see the trace',
      cause: { code: 'TIMEOUT', message: 'agent slow' },
    });
    expect(new SnaplabError('INTERNAL', 'x', undefined, { cause: 'a string' }).toJSON().cause).toEqual({
      message: 'a string',
    });
    expect(JSON.parse(JSON.stringify(outer)).cause.code).toBe('TIMEOUT');
  });
});
