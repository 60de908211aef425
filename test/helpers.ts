import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Lab } from '../src/sdk/lab.js';

/** A lab in its own fresh home, so tests never touch /var/lib/snaplab or each other. */
export async function testLab(): Promise<Lab> {
  const home = mkdtempSync(join(tmpdir(), 'snaplab-test-'));
  return Lab.open({ home });
}

/** Destroy every sandbox, snapshot and image, gc (which unmounts the btrfs pool), remove the home. */
export async function disposeLab(lab: Lab): Promise<void> {
  for (const b of await lab.list()) await b.destroy().catch(() => undefined);
  for (const s of await lab.snapshots()) await lab.removeSnapshot(s.name).catch(() => undefined);
  for (const i of await lab.images()) await lab.removeImage(i.name).catch(() => undefined);
  await lab.gc();
  const home = lab.home;
  lab.close();
  rmSync(home, { recursive: true, force: true });
}
