import { describe, expect, it } from 'vitest';
import { DEFAULT_HOME, envHome } from './home.js';

describe('the home SNAPLAB_HOME names', () => {
  it('is the default when unset or set but empty (an empty one made `mkdir ""` fail as "a bug")', () => {
    expect(envHome({})).toBe(DEFAULT_HOME);
    expect(envHome({ SNAPLAB_HOME: '' })).toBe(DEFAULT_HOME);
    expect(envHome({ SNAPLAB_HOME: '/srv/lab' })).toBe('/srv/lab');
  });
});
