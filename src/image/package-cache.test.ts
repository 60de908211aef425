import { spawnSync } from 'node:child_process';
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { useCache, type CacheUse } from './package-cache.js';

const dirs: string[] = [];
const fresh = (): string => {
  const d = mkdtempSync(join(tmpdir(), 'snaplab-test-pkgcache-'));
  dirs.push(d);
  return d;
};
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

function used(u: CacheUse | { off: string }): CacheUse {
  if ('off' in u) throw new Error(`cache off: ${u.off}`);
  return u;
}

describe('the package cache', () => {
  it('is used only where root alone may write it, and at a path the hooks can take', async () => {
    const open = fresh();
    chmodSync(open, 0o777);
    expect(await useCache(open, 'bookworm')).toEqual({ off: `${open} is writable by others (chmod go-w)` });
    const root = fresh();
    mkdirSync(join(root, 'bookworm'), { mode: 0o775 });
    chmodSync(join(root, 'bookworm'), 0o775);
    expect(await useCache(root, 'bookworm')).toMatchObject({ off: expect.stringMatching(/writable by others/) });
    expect(await useCache(join(root, 'with space'), 'bookworm')).toMatchObject({ off: expect.stringMatching(/hooks/) });
  });

  it("gives a build its suite's packages as links of its own, keeps what it fetched without replacing any, and removes its directory", async () => {
    const cache = join(fresh(), 'made');
    const first = used(await useCache(cache, 'bookworm'));
    expect(statSync(cache).mode & 0o777).toBe(0o700);
    writeFileSync(join(cache, 'bookworm', 'a_1_all.deb'), 'a');
    writeFileSync(join(cache, 'trixie-only_1_all.deb'), 'not a suite dir');
    await first.drop();
    const u = used(await useCache(cache, 'bookworm'));
    const own = readdirSync(cache).filter((f) => f.startsWith('.build-'));
    expect(own).toHaveLength(1);
    const [inDir, outDir] = ['in', 'out'].map((d) => join(cache, own[0]!, d)) as [string, string];
    expect(readdirSync(inDir)).toEqual(['a_1_all.deb']);
    expect(statSync(join(inDir, 'a_1_all.deb')).ino).toBe(statSync(join(cache, 'bookworm', 'a_1_all.deb')).ino);
    expect(u.args).toContain(`--setup-hook=sync-in ${inDir} /var/cache/apt/archives/`);
    // the customize hook, as mmdebstrap runs it (sh -c HOOK exec ROOT): only what the cache lacked goes out
    const tree = fresh();
    mkdirSync(join(tree, 'var/cache/apt/archives'), { recursive: true });
    for (const f of ['a_1_all.deb', 'b_1_all.deb', 'c_1_all.deb'])
      writeFileSync(join(tree, 'var/cache/apt/archives', f), f);
    const hook = u.args.find((a) => a.startsWith('--customize-hook='))!.slice('--customize-hook='.length);
    expect(spawnSync('sh', ['-c', hook, 'exec', tree]).status).toBe(0);
    expect(readdirSync(outDir).sort()).toEqual(['b_1_all.deb', 'c_1_all.deb']);
    // another build kept c meanwhile: its copy stays
    writeFileSync(join(cache, 'bookworm', 'c_1_all.deb'), 'the other build');
    expect(await u.keep()).toBe(1);
    expect(readdirSync(join(cache, 'bookworm')).sort()).toEqual(['a_1_all.deb', 'b_1_all.deb', 'c_1_all.deb']);
    expect(readFileSync(join(cache, 'bookworm', 'c_1_all.deb'), 'utf8')).toBe('the other build');
    expect(readdirSync(cache).filter((f) => f.startsWith('.build-'))).toEqual([]);
  });

  it("an empty archive is no failure of the hook; a dead build's directory is removed, a live one's kept", async () => {
    const cache = fresh();
    const u = used(await useCache(cache, 'sid'));
    const tree = fresh();
    mkdirSync(join(tree, 'var/cache/apt/archives'), { recursive: true });
    const hook = u.args.find((a) => a.startsWith('--customize-hook='))!.slice('--customize-hook='.length);
    expect(spawnSync('sh', ['-c', hook, 'exec', tree]).status).toBe(0);
    const gone = spawnSync('true');
    mkdirSync(join(cache, `.build-${gone.pid}-1-dead`));
    used(await useCache(cache, 'sid'));
    expect(existsSync(join(cache, `.build-${gone.pid}-1-dead`))).toBe(false);
    expect(readdirSync(cache).filter((f) => f.startsWith('.build-'))).toHaveLength(2); // this process's two
    await u.drop();
  });
});
