/**
 * Debian images the tests boot but do not test the building of, built once into a cache home of
 * their own and imported from there into a test's home: `snaplab image build` in the cache home
 * (a cache hit when its inputs are the same: nothing fetched, nothing built), then `image import`
 * of its tree, which takes seconds where the build took most of a minute or more (mmdebstrap).
 *
 * The cache home is kept between runs and test files (`SNAPLAB_TEST_IMAGE_CACHE`, default
 * $TMPDIR/snaplab-test-image-cache). An image in it is built again once it is a week old (Debian's
 * point releases and security updates move on), and when its inputs changed. What an import does
 * not carry is what the build found (the image's provenance, e.g. its default init): a test that
 * asserts on that builds in its own home (test/system.test.ts's sysd, test/debian-image.test.ts).
 */
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { cli, cliAsync } from './daemon-helpers.js';

export const IMAGE_CACHE = process.env.SNAPLAB_TEST_IMAGE_CACHE ?? join(tmpdir(), 'snaplab-test-image-cache');
const MAX_AGE_MS = 7 * 24 * 3600 * 1000;

/** `snaplab image build ARGS` in the cache home: the tree's path (built, or the cached one). */
export async function buildInCache(args: string[], name: string): Promise<string> {
  const listed = cli(IMAGE_CACHE, ['image', 'ls', '--json']);
  const old = listed.code === 0 ? (JSON.parse(listed.out) as { name: string; createdAt: number }[]) : [];
  const aged = old.find((i) => i.name === name && Date.now() - i.createdAt > MAX_AGE_MS);
  // minutes the first time (cli's own timeout is two)
  const build = (): ReturnType<typeof cliAsync> =>
    cliAsync(IMAGE_CACHE, ['image', 'build', ...args, '--json', ...(aged ? ['--rebuild'] : [])], 900_000);
  let built = await build();
  // the cache holds one built from other inputs (an older recipe, another package list): replaced
  if (built.err.includes('IMAGE_EXISTS')) {
    cli(IMAGE_CACHE, ['image', 'rm', '--force', name]);
    built = await build();
  }
  if (built.code !== 0) throw new Error(`image build ${args.join(' ')} (in ${IMAGE_CACHE}): ${built.err}`);
  return (JSON.parse(built.out) as { path: string }).path;
}

/** The image built by `image build ARGS` (ARGS name it `name`), imported into `home` as `name`. */
export async function cachedImage(home: string, args: string[], name: string): Promise<void> {
  const path = await buildInCache(args, name);
  const imported = await cliAsync(home, ['image', 'import', path, '--name', name], 600_000);
  if (imported.code !== 0) throw new Error(`image import ${path} as ${name}: ${imported.err}`);
}

/** `image build debian` args for a Debian image named `name` (bookworm minbase unless `suite`). */
export const debianArgs = (name: string, packages: string[], suite = 'bookworm'): string[] => [
  'debian',
  '--suite',
  suite,
  '--packages',
  packages.join(','),
  '--name',
  name,
];
