import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { withLock } from './lock.js';

const dir = mkdtempSync(join(tmpdir(), 'snaplab-lock-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('withLock', () => {
  it('takes over a lock whose holder died; holders never overlap, even when many waiters saw it dead', async () => {
    const path = join(dir, 'x.lock');
    const dead = spawnSync('true').pid!; // a pid that has exited
    for (let round = 0; round < 5; round++) {
      writeFileSync(path, String(dead));
      let inside = 0;
      let most = 0;
      await Promise.all(
        Array.from({ length: 12 }, () =>
          withLock(path, async () => {
            most = Math.max(most, ++inside);
            await new Promise((r) => setTimeout(r, 3));
            inside--;
          }),
        ),
      );
      expect(most).toBe(1);
    }
    expect(existsSync(path)).toBe(false);
    expect(existsSync(`${path}.takeover`)).toBe(false);
  });
});
