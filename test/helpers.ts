import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Lab } from '../src/sdk/lab.js';

/** A lab in its own fresh home, so tests never touch /var/lib/snaplab or each other. */
export async function testLab(): Promise<Lab> {
  const home = mkdtempSync(join(tmpdir(), 'snaplab-test-'));
  return Lab.open({ home });
}

/**
 * Destroy every sandbox, snapshot and image, gc (which unmounts the btrfs pool), remove the home.
 * Takes undefined (a beforeAll that failed before the lab was made), and goes on past a step
 * that fails, so that a failed setup still leaves nothing; the first failure is thrown at the end.
 */
export async function disposeLab(lab: Lab | undefined): Promise<void> {
  if (!lab) return;
  const failures: unknown[] = [];
  const step = async (f: () => Promise<unknown>): Promise<void> => {
    try {
      await f();
    } catch (e) {
      failures.push(e);
    }
  };
  await step(async () => {
    for (const b of await lab.list()) await b.destroy().catch((e: unknown) => failures.push(e));
  });
  await step(async () => {
    for (const s of await lab.snapshots()) await lab.removeSnapshot(s.name).catch((e: unknown) => failures.push(e));
  });
  await step(async () => {
    for (const i of await lab.images()) await lab.removeImage(i.name).catch((e: unknown) => failures.push(e));
  });
  await step(() => lab.gc());
  const home = lab.home;
  lab.close();
  try {
    rmSync(home, { recursive: true, force: true });
  } catch (e) {
    failures.push(e);
  }
  if (failures.length) throw failures[0];
}
