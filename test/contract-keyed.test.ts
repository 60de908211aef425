/**
 * The contract (contract-suite.ts) on the daemon's keyed lab in this process (src/server/keyed-lab.ts),
 * what the E2B front stands on: a Daemon opened here on a home of its own, and the lab of one key.
 * Its sandbox calls must do what the embedded and remote libraries' do, held to the key.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LabApi } from '../src/sdk/api.js';
import { isSnaplabError } from '../src/errors.js';
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

describe('the keyed lab holds its calls as the routes do', () => {
  it("refuses what the route's schema refuses (BAD_INPUT), before the sandbox is looked at", async () => {
    const box = await d.keyed(token).create({ name: 'schema' });
    try {
      const bad = { X: {} } as unknown as Record<string, string>;
      await expect(box.spawn(['true'], { env: bad })).rejects.toMatchObject({ code: 'BAD_INPUT' });
      await expect(box.exec(['true'], { timeoutMs: 1.5 })).rejects.toMatchObject({ code: 'BAD_INPUT' });
      await expect(box.exec([])).rejects.toMatchObject({ code: 'BAD_INPUT' });
      await expect(box.setTimeout(-1)).rejects.toMatchObject({ code: 'BAD_INPUT' });
      expect((await box.exec(['echo', 'ok'])).stdout).toBe('ok\n');
    } finally {
      await box.destroy();
    }
  });

  it("snapshots and restores as its key: another key's restore of it is SNAPSHOT_NOT_FOUND", async () => {
    const lab = d.keyed(token);
    const box = await lab.create({ name: 'snapped' });
    const other = cli(home, ['key', 'create', 'other', '--scope', 'read,exec']);
    expect(other.code, other.err).toBe(0);
    try {
      await box.files.write('/etc/mark', 'kept');
      expect((await box.snapshot('keyed-snap')).name).toBe('keyed-snap');
      const copy = await lab.restore('keyed-snap', { name: 'restored' });
      expect((await copy.files.read('/etc/mark')).toString()).toBe('kept');
      expect(copy.owner).toBe('keyed');
      await copy.destroy();
      await expect(d.keyed(other.out.trim()).restore('keyed-snap')).rejects.toMatchObject({
        code: 'SNAPSHOT_NOT_FOUND',
      });
    } finally {
      await box.destroy();
      await d.lab.removeSnapshot('keyed-snap');
      cli(home, ['key', 'rm', 'other']);
    }
  });

  it('a key removed: its calls are UNAUTHORIZED, and its running exec and spawn are killed at the check', async () => {
    const k = cli(home, ['key', 'create', 'going', '--scope', 'read,exec']);
    expect(k.code, k.err).toBe(0);
    const lab = d.keyed(k.out.trim());
    const box = await lab.create({ name: 'going' });
    try {
      const exec = box.exec(['sleep', '600']).catch((e: unknown) => e);
      const spawned = await box.spawn(['sleep', '600']);
      // both running: the agent lists them
      const sleeping = async (): Promise<string> =>
        (await (await d.sandbox(box.id)).exec(['sh', '-c', 'ps -o args | grep -c "^sleep 600"'])).stdout.trim();
      await expect.poll(sleeping).toBe('2');
      expect(cli(home, ['key', 'rm', 'going']).code).toBe(0);
      await expect(lab.get(box.id)).rejects.toSatisfy((e: unknown) => isSnaplabError(e, 'UNAUTHORIZED'));
      await d.check();
      expect(await exec).toMatchObject({ signal: 9 });
      expect(await spawned.result).toMatchObject({ signal: 9 });
    } finally {
      await (await d.sandbox(box.id)).destroy();
    }
  });
});
