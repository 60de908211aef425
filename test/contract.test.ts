/**
 * One contract, two implementations: the same tests run on the embedded library (Lab.open) and
 * on the remote one (Lab.connect) against a real `snaplab serve` on 127.0.0.1 with an API key.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect } from 'vitest';
import { Lab } from '../src/sdk/lab.js';
import type { LabApi } from '../src/sdk/api.js';
import { cli, startDaemon, type TestDaemon } from './daemon-helpers.js';
import { contractSuite } from './contract-suite.js';

let home: string;
let daemon: TestDaemon;
let token: string;
const labs: Record<string, LabApi> = {};

beforeAll(async () => {
  home = mkdtempSync(join(tmpdir(), 'snaplab-test-contract-'));
  const k = cli(home, ['key', 'create', 'contract', '--scope', 'read,exec,admin']);
  expect(k.code, k.err).toBe(0);
  token = k.out.trim();
  daemon = await startDaemon(home);
  labs.embedded = await Lab.open({ home });
  labs.remote = await Lab.connect({ url: daemon.url, token });
}, 120_000);

afterAll(async () => {
  for (const lab of Object.values(labs)) lab.close();
  await daemon?.stop();
  cli(home, ['pool', 'rm', 'cpool-embedded']);
  cli(home, ['pool', 'rm', 'cpool-remote']);
  for (const k of ['embedded', 'remote']) cli(home, ['pool', 'rm', `tpool-${k}`]);
  cli(home, ['rm', '--all']);
  for (const s of ['csnap-embedded', 'csnap-remote']) cli(home, ['snapshot', 'rm', s]);
  cli(home, ['image', 'rm', '--force', 'busybox']);
  cli(home, ['gc']);
  rmSync(home, { recursive: true, force: true });
});

describe.each(['embedded', 'remote'])('the library, %s', (kind) => contractSuite(kind, () => labs[kind]!));
