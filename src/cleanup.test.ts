import { mkdtempSync, rmSync } from 'node:fs';
import { rmdir, unlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it, vi } from 'vitest';
import { bestEffort, failureMeans, noted, orElse } from './cleanup.js';
import { SnaplabError } from './errors.js';
import { openDb } from './store/db.js';
import { Store } from './store/store.js';
import { Trace } from './timing/trace.js';
import { renderWaterfall } from './timing/waterfall.js';

const dir = mkdtempSync(join(tmpdir(), 'snaplab-cleanup-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
afterEach(() => vi.restoreAllMocks());

/** What the helpers wrote to stderr while `fn` ran. */
async function stderrOf(fn: () => Promise<unknown>): Promise<string> {
  let out = '';
  vi.spyOn(process.stderr, 'write').mockImplementation((chunk: string | Uint8Array) => {
    out += String(chunk);
    return true;
  });
  await fn();
  vi.restoreAllMocks();
  return out;
}

describe('best-effort cleanup', () => {
  it('records a failed cleanup in the running trace, nested where it ran, and the stored operation shows it', async () => {
    const t = new Trace('rm', 'box');
    const busy = join(dir, 'busy');
    rmSync(busy, { recursive: true, force: true });
    await import('node:fs/promises').then((fs) => fs.mkdir(join(busy, 'child'), { recursive: true }));
    const said = await stderrOf(() =>
      t.phase('remove', async () => {
        await rmdir(busy).catch(noted(`remove ${busy}`, 'ENOENT')); // ENOTEMPTY: not expected
      }),
    );
    expect(said).toBe('');
    const summary = t.finish();
    const mark = summary.phases.find((p) => p.name === `cleanup: remove ${busy}`);
    expect(mark?.failed).toMatch(/^ENOTEMPTY/);
    expect(mark?.parent).toBe(summary.phases.findIndex((p) => p.name === 'remove'));
    expect(mark?.endMs).toBe(mark?.startMs);

    expect(renderWaterfall(summary)).toMatch(new RegExp(`\\n  cleanup: remove ${busy} +[0-9.]+ +failed  ENOTEMPTY`));

    const store = new Store(openDb(join(dir, 'home')));
    store.putOperation(summary);
    const stored = store.getOperation(summary.id)!;
    expect(stored.phases.find((p) => p.name === `cleanup: remove ${busy}`)?.failed).toMatch(/^ENOTEMPTY/);
    store.db.close();
  });

  it('records nothing for the expected code (ENOENT: already gone)', async () => {
    const t = new Trace('rm', 'box');
    const said = await stderrOf(() =>
      t.within(async () => {
        await unlink(join(dir, 'never-there')).catch(noted('remove never-there', 'ENOENT'));
        await bestEffort('remove never-there', () => unlink(join(dir, 'never-there')), 'ENOENT');
      }),
    );
    expect(said).toBe('');
    expect(t.finish().phases).toEqual([]);
  });

  it('outside any trace, or once it has finished, writes one stderr line; never throws', async () => {
    const said = await stderrOf(async () => {
      await bestEffort('stop the thing', () => {
        throw new SnaplabError('CGROUP_FAILED', 'cannot thaw box');
      });
      const t = new Trace('rm', 'box');
      const late = t.within(async () => noted('late step'));
      t.finish();
      (await late)(new Error('too late'));
    });
    expect(said).toBe(
      'snaplab: cleanup: stop the thing: CGROUP_FAILED: cannot thaw box\nsnaplab: cleanup: late step: too late\n',
    );
  });

  it('an expected code counts on an error made from it (a cgroup error whose cause is ENOENT)', async () => {
    const gone = Object.assign(new Error('ENOENT: no such file'), { code: 'ENOENT' });
    const said = await stderrOf(() =>
      bestEffort(
        'thaw box',
        () => Promise.reject(new SnaplabError('CGROUP_FAILED', 'cannot thaw', undefined, { cause: gone })),
        'ENOENT',
      ),
    );
    expect(said).toBe('');
  });

  it('orElse answers its value for any failure and records only the unexpected; failureMeans answers it', async () => {
    let said = await stderrOf(async () => {
      expect(await unlink(join(dir, 'nope')).then(() => 'there', orElse('absent', 'unlink', 'ENOENT'))).toBe('absent');
    });
    expect(said).toBe('');
    said = await stderrOf(async () => {
      expect(await rmdir(join(dir, 'nope')).catch(orElse('kept', 'rmdir', 'EBUSY'))).toBe('kept');
    });
    expect(said).toMatch(/^snaplab: cleanup: rmdir: ENOENT: no such file or directory, rmdir '.*nope'\n$/);
    expect(await Promise.reject(new Error('x')).catch(failureMeans(false))).toBe(false);
  });
});
