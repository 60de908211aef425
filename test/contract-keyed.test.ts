/**
 * The contract (contract-suite.ts) on the daemon's keyed lab in this process (src/server/keyed-lab.ts),
 * what the E2B front stands on: a Daemon opened here on a home of its own, and the lab of one key.
 * Its sandbox calls must do what the embedded and remote libraries' do, held to the key.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect } from 'vitest';
import type { LabApi } from '../src/sdk/api.js';
import { Daemon } from '../src/server/daemon.js';
import { cli } from './daemon-helpers.js';
import { contractSuite } from './contract-suite.js';

let home: string;
let d: Daemon;
let token: string;

beforeAll(async () => {
  home = mkdtempSync(join(tmpdir(), 'snaplab-test-keyedlab-'));
  const k = cli(home, ['key', 'create', 'keyed', '--scope', 'read,exec,admin']);
  expect(k.code, k.err).toBe(0);
  token = k.out.trim();
  d = await Daemon.open({ home });
  await d.start();
}, 120_000);

afterAll(() => {
  d?.close();
  cli(home, ['rm', '--all']);
  cli(home, ['image', 'rm', '--force', 'busybox']);
  cli(home, ['gc']);
  rmSync(home, { recursive: true, force: true });
});

// the keyed lab serves KeyedLabApi, not all of LabApi: the suite runs only the cases of what it serves
describe('the keyed lab, in-process', () => contractSuite('keyed', () => d.keyed(token) as unknown as LabApi));
