/**
 * Debian packages kept between image builds (docs/images.md, "The package cache"): a build fetches
 * from the archive only what no earlier build fetched. mmdebstrap copies the cache into the tree
 * before apt runs and apt uses a cached .deb of the right name and size instead of downloading it;
 * after the build the packages it used are copied out to a directory of its own in the cache, and
 * each new one is renamed into place (whole, so a build reading the cache never sees half a file).
 */
import { randomBytes } from 'node:crypto';
import { mkdir, readdir, rename, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { pidAlive } from '../host/procs.js';
import { orElse } from '../cleanup.js';

/** what mmdebstrap's hooks can take in a path unquoted (they split their arguments at spaces) */
const PLAIN_PATH = /^\/[A-Za-z0-9_./+-]+$/;

/**
 * The cache a build in `home` uses: `SNAPLAB_PACKAGE_CACHE` (a directory, or `off`), else the home's
 * `cache/packages`. Undefined when off, or when the path is one mmdebstrap's hooks cannot take.
 */
export function packageCacheDir(home: string, env: NodeJS.ProcessEnv = process.env): string | undefined {
  const asked = env.SNAPLAB_PACKAGE_CACHE;
  if (asked === 'off') return undefined;
  const dir = asked || join(home, 'cache', 'packages');
  return PLAIN_PATH.test(dir) ? dir : undefined;
}

/** One build's use of the cache: mmdebstrap's extra arguments, then `keep` once it succeeded. */
export interface CacheUse {
  args: string[];
  /** move the packages the build used that the cache lacks into it, and remove the build's own directory */
  keep(): Promise<number>;
  /** remove the build's own directory (a failed or interrupted build keeps nothing) */
  drop(): Promise<void>;
}

const INCOMING = /^\.incoming-(\d+)-/;

/** Directories of builds that died before they moved their packages in: their process is gone. */
async function removeDeadIncoming(cache: string): Promise<void> {
  for (const name of await readdir(cache)) {
    const m = INCOMING.exec(name);
    if (m && !(await pidAlive(Number(m[1])))) await rm(join(cache, name), { recursive: true, force: true });
  }
}

/** The cache at `cache`: its packages in `debs/`, each build's own directory beside it (never copied in). */
export async function useCache(cache: string): Promise<CacheUse> {
  const debs = join(cache, 'debs');
  await mkdir(debs, { recursive: true, mode: 0o700 });
  await removeDeadIncoming(cache);
  const incoming = join(cache, `.incoming-${process.pid}-${randomBytes(4).toString('hex')}`);
  await mkdir(incoming, { mode: 0o700 });
  const drop = (): Promise<void> => rm(incoming, { recursive: true, force: true });
  return {
    args: [
      // the essential set's packages stay in the tree's archive until the customize hooks copied them
      '--skip=essential/unlink',
      '--setup-hook=mkdir -p "$1/var/cache/apt/archives"',
      `--setup-hook=sync-in ${debs} /var/cache/apt/archives/`,
      `--customize-hook=sync-out /var/cache/apt/archives ${incoming}`,
    ],
    async keep() {
      let added = 0;
      for (const name of await readdir(incoming)) {
        if (!name.endsWith('.deb')) continue;
        const have = await stat(join(debs, name)).then(
          () => true,
          orElse(false, `stat ${name} in the package cache`, 'ENOENT'),
        );
        if (have) continue;
        await rename(join(incoming, name), join(debs, name));
        added++;
      }
      await drop();
      return added;
    },
    drop,
  };
}
