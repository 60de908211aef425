import { mkdtemp, rm, truncate, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { attachLoop, detachLoop, loopDevicesBackedUnder } from './loops.js';

let base = '';

beforeAll(async () => {
  base = await mkdtemp(join(tmpdir(), 'snaplab-test-loops-'));
});

afterAll(async () => {
  for (const d of await loopDevicesBackedUnder(base)) await detachLoop(d.device);
  expect(await loopDevicesBackedUnder(base)).toEqual([]);
  await rm(base, { recursive: true, force: true });
});

it('finds a loop device by the directory of its backing file, and detaches it', async () => {
  const file = join(base, 'disk.img');
  await writeFile(file, '');
  await truncate(file, 8 * 1024 * 1024);
  const device = await attachLoop(file);
  expect(device).toMatch(/^\/dev\/loop\d+$/);

  expect(await loopDevicesBackedUnder(base)).toEqual([{ device, backingFile: file, deleted: false }]);
  expect(await loopDevicesBackedUnder(`${base}-other`)).toEqual([]);

  await detachLoop(device);
  expect(await loopDevicesBackedUnder(base)).toEqual([]);
  await detachLoop(device); // idempotent
});

it('reports a deleted backing file by its original path', async () => {
  const file = join(base, 'gone.img');
  await writeFile(file, '');
  await truncate(file, 1024 * 1024);
  const device = await attachLoop(file);
  try {
    await rm(file);
    expect(await loopDevicesBackedUnder(base)).toEqual([{ device, backingFile: file, deleted: true }]);
  } finally {
    await detachLoop(device);
  }
});

it('refuses what is not a loop device', async () => {
  await expect(detachLoop('/dev/sda')).rejects.toMatchObject({ code: 'BAD_INPUT' });
});
