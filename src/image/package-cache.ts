/**
 * Debian packages kept between image builds (docs/images.md, "The package cache"): a build fetches
 * from the archive only what no earlier build of its suite fetched.
 *
 * The cache is `CACHE/SUITE/*.deb`. A build first hard-links its suite's packages into a directory
 * of its own (`CACHE/.build-PID-START-X/in`), and mmdebstrap copies that in before apt runs: apt
 * uses a cached file of the right name and size instead of downloading it. Nothing another build
 * does to the cache meanwhile is seen by this one's copy (tar fails on a directory that changes
 * while it reads it). Once the packages are in, those that were not in the cache are copied out to
 * the build's `out`, and after a build that succeeded each is linked into the cache (link, never
 * rename: a name already there is kept, never replaced while someone reads it).
 */
import { randomBytes } from 'node:crypto';
import type { Stats } from 'node:fs';
import { link, lstat, mkdir, readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { ownStartTime, sameProcess } from '../host/procs.js';
import { noted, orElse } from '../cleanup.js';

/** what mmdebstrap's hooks can take in a path unquoted (they split their arguments at spaces) */
const PLAIN_PATH = /^\/[A-Za-z0-9_./+-]+$/;

/** The cache a build in `home` uses: `SNAPLAB_PACKAGE_CACHE` (a directory, or `off`), else the home's. */
export function packageCacheDir(home: string, env: NodeJS.ProcessEnv = process.env): string | undefined {
  const asked = env.SNAPLAB_PACKAGE_CACHE;
  if (asked === 'off') return undefined;
  return asked || join(home, 'cache', 'packages');
}

/** One build's use of the cache: mmdebstrap's extra arguments, then `keep` once it succeeded. */
export interface CacheUse {
  args: string[];
  /** link the packages the build fetched into the cache (how many were new); its own directory goes */
  keep(): Promise<number>;
  /** remove the build's own directory (a failed or interrupted build adds nothing) */
  drop(): Promise<void>;
}

const BUILD = /^\.build-(\d+)-(\d+)-/;

/**
 * A directory of the cache is used only if it is root's alone (apt trusts a cached package by its
 * name and size, and its scripts run as root in every image built after): made so when missing;
 * otherwise why not.
 */
async function trusted(dir: string): Promise<string | undefined> {
  let st: Stats;
  try {
    st = await lstat(dir);
  } catch (e) {
    // (any other failure is no evidence of anything: the cache is not used)
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
    await mkdir(dir, { recursive: true, mode: 0o700 });
    return undefined;
  }
  if (!st.isDirectory()) return `${dir} is not a directory`;
  if (st.uid !== process.geteuid?.()) return `${dir} is not owned by this user`;
  if (st.mode & 0o022) return `${dir} is writable by others (chmod go-w)`;
  return undefined;
}

/** Build directories whose process is gone (the same pid and start time: a reused pid is not it). */
async function removeDeadBuilds(cache: string): Promise<void> {
  for (const name of await readdir(cache)) {
    const m = BUILD.exec(name);
    if (m && !(await sameProcess(Number(m[1]), Number(m[2]))))
      await rm(join(cache, name), { recursive: true, force: true });
  }
}

/** Link each regular `.deb` of `from` into `to` where `to` lacks it; how many were linked. */
async function linkDebs(from: string, to: string): Promise<number> {
  let n = 0;
  for (const e of await readdir(from, { withFileTypes: true })) {
    if (!e.isFile() || !e.name.endsWith('.deb')) continue;
    const done = await link(join(from, e.name), join(to, e.name)).then(
      () => true,
      // there already (another build's, or the same one); gone meanwhile (removed by hand)
      orElse(false, `link ${e.name} into ${to}`, 'EEXIST', 'ENOENT'),
    );
    if (done) n++;
  }
  return n;
}

/**
 * The cache at `cache` for a build of `suite`, or why it is not used (a path mmdebstrap's hooks
 * cannot take, a directory others may write). Never throws for the cache's sake: a build without
 * it fetches everything, as before.
 */
export async function useCache(cache: string, suite: string): Promise<CacheUse | { off: string }> {
  if (!PLAIN_PATH.test(cache)) return { off: `its path has characters mmdebstrap's hooks cannot take: ${cache}` };
  try {
    const debs = join(cache, suite);
    const why = (await trusted(cache)) ?? (await trusted(debs));
    if (why) return { off: why };
    await removeDeadBuilds(cache);
    const own = join(cache, `.build-${process.pid}-${ownStartTime()}-${randomBytes(4).toString('hex')}`);
    const [inDir, outDir] = [join(own, 'in'), join(own, 'out')];
    await mkdir(inDir, { recursive: true, mode: 0o700 });
    await mkdir(outDir, { mode: 0o700 });
    const drop = (): Promise<void> => rm(own, { recursive: true, force: true });
    try {
      await linkDebs(debs, inDir);
    } catch (e) {
      await drop().catch(noted(`remove ${own}`));
      throw e;
    }
    const archives = '"$1/var/cache/apt/archives"';
    return {
      args: [
        // the essential set's packages stay in the tree's archive until the customize hooks ran
        '--skip=essential/unlink',
        `--setup-hook=mkdir -p ${archives}`,
        `--setup-hook=sync-in ${inDir} /var/cache/apt/archives/`,
        // only what the cache lacked goes out (the tree's archive holds the cache's copy too)
        `--customize-hook=for f in ${archives}/*.deb; do [ -f "$f" ] || continue; [ -e "${inDir}/\${f##*/}" ] || cp "$f" "${outDir}/"; done`,
      ],
      async keep() {
        try {
          return await linkDebs(outDir, debs);
        } finally {
          await drop();
        }
      },
      drop,
    };
  } catch (e) {
    return { off: `cannot use it: ${(e as Error).message}` };
  }
}
