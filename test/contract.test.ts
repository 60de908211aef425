/**
 * One contract, two implementations: the same tests run on the embedded library (Lab.open) and
 * on the remote one (Lab.connect) against a real `snaplab serve` on 127.0.0.1 with an API key.
 */
import { rmSync } from 'node:fs';
import { afterAll, beforeAll, describe } from 'vitest';
import type { LabApi } from '../src/sdk/api.js';
import { bothLabs, cli, type TestDaemon } from './daemon-helpers.js';
import { contractSuite } from './contract-suite.js';

let home: string;
let daemon: TestDaemon;
const labs: Record<string, LabApi> = {};

beforeAll(async () => {
  ({ home, daemon } = await bothLabs('contract', 'read,exec,admin', labs));
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
