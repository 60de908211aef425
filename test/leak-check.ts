import { afterAll, beforeAll, expect } from 'vitest';
import { leaks } from './global-leaks.js';

/**
 * Per test file (vitest setupFiles): what the file left of snaplab's on the host that was not
 * there when it started fails that file, by name. The suite-wide check in global-leaks.ts only
 * said that something leaked. Registered first, this afterAll runs after the file's own.
 */
let before = new Set<string>();

beforeAll(() => {
  before = new Set(leaks());
});

afterAll(async () => {
  const file = expect.getState().testPath ?? 'this test file';
  let left: string[] = [];
  // a monitor orphaned to the host's init, or a loop device the kernel detaches lazily, may take a moment
  for (let i = 0; i < 50; i++) {
    left = leaks().filter((l) => !before.has(l));
    if (!left.length) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${file} left snaplab host objects behind:\n  ${left.join('\n  ')}`);
});
