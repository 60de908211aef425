import { defineConfig } from 'vitest/config';

// Tests use the real kernel (namespaces, mounts, cgroups, loop devices) on a 2-core machine:
// files run one at a time so that timeouts mean bugs, not contention.
export default defineConfig({
  test: {
    include: ['src/**/*.test.ts', 'test/**/*.test.ts'],
    fileParallelism: false,
    testTimeout: 60_000,
    hookTimeout: 120_000,
    globalSetup: ['test/global-leaks.ts'],
    setupFiles: ['test/leak-check.ts'],
  },
});
