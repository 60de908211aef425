import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { Lab } from '../src/sdk/lab.js';
import { disposeLab, testLab } from './helpers.js';

// The examples run as a user runs them: `node examples/x.mjs`, importing the built package by name.
let lab: Lab;
beforeAll(async () => {
  lab = await testLab();
});
afterAll(async () => {
  await disposeLab(lab);
});

it('examples/library.mjs runs as it is', () => {
  const r = spawnSync(process.execPath, [join(import.meta.dirname, '..', 'examples', 'library.mjs')], {
    env: { ...process.env, SNAPLAB_HOME: lab.home },
    encoding: 'utf8',
    timeout: 60_000,
  });
  expect(r.stderr).toBe('');
  expect(r.status).toBe(0);
  expect(r.stdout).toMatch(/exit 0: hello/);
  expect(r.stdout).toMatch(/tick 1\ntick 2\ntick 3/);
  expect(r.stdout).toMatch(/\/root\/greeting reads "hello"/);
});
