import { join } from 'node:path';
import { SnaplabError } from '../errors.js';
import { run } from '../host/run.js';
import {
  buildKey,
  checkSpec,
  defaultName,
  fixUp,
  hostSources,
  runMmdebstrap,
  sourcesFor,
  type DebianSpec,
} from '../image/debian.js';
import type { Provenance } from '../image/import.js';
import type { ImageRecord } from '../store/records.js';
import type { Trace } from '../timing/trace.js';
import type { LabContext } from './context.js';
import { skeleton } from './images.js';
import { checkName } from './names.js';
import { imageBlockers, imageUsers, removeImage } from './removals.js';

export interface BuildOptions {
  name?: string;
  /** build again even when an image of the same inputs exists */
  rebuild?: boolean;
  onProgress?: (s: string) => void;
}

export interface Built {
  image: ImageRecord;
  /** an image of the same inputs existed: nothing was downloaded or built */
  cached: boolean;
  log?: string;
}

/**
 * A Debian image from Debian's archive (mmdebstrap), cached by its inputs: the same suite,
 * variant, package set and sources are built once. Another name for a cached build is a copy of
 * its tree (no download). `rebuild` replaces an image of the same name once the new one is built,
 * refused while a sandbox or snapshot uses the old one.
 */
export async function buildDebian(
  ctx: LabContext,
  input: DebianSpec,
  opts: BuildOptions,
  trace: Trace,
): Promise<Built> {
  const spec = checkSpec(input);
  const sources = sourcesFor(spec, spec.mirror ? [] : await hostSources());
  const key = buildKey(spec, sources);
  const name = opts.name ?? defaultName(spec, key);
  checkName('image', name);
  const same = ctx.store.getImage(name);
  if (same && !opts.rebuild) {
    if (same.buildKey === key) return { image: same, cached: true };
    throw new SnaplabError(
      'IMAGE_EXISTS',
      `an image named ${name} already exists, built from other inputs`,
      'pass --rebuild to replace it, or pick another --name',
    );
  }
  if (same) {
    // fail before the build, not after it, when the old image cannot go
    const users = [...imageBlockers(ctx, name), ...imageUsers(ctx, name)];
    if (users.length)
      throw new SnaplabError(
        'IMAGE_IN_USE',
        `image ${name} is used by ${users.join(', ')}`,
        'remove those first, or build under another --name',
      );
  }
  const cached = opts.rebuild ? undefined : ctx.store.findImageByBuildKey(key);
  const build: Record<string, unknown> = {
    suite: spec.suite,
    variant: spec.variant,
    packages: spec.packages,
    mirror: spec.mirror ?? 'host apt sources',
    key,
  };
  const log = join(ctx.home, 'images', '.logs', `${key.slice(0, 16)}.log`);
  const replaceOld = async (): Promise<void> => {
    if (same) await removeImage(ctx, name, trace);
  };
  if (cached) {
    opts.onProgress?.(`copying ${cached.name} (built from the same inputs)`);
    const image = await trace.phase('copy tree', () =>
      ctx.images.create(
        name,
        cached.source,
        async (root) => {
          await run('cp', ['-a', '--reflink=auto', '--', `${cached.path}/.`, root]);
          await fixUp(root, name);
          return {
            provenance: {
              ...(cached.provenance as Provenance),
              notes: [`a copy of ${cached.name}, built from the same inputs`],
            },
            config: cached.config ?? undefined,
          };
        },
        key,
      ),
    );
    return { image, cached: true };
  }
  const v = await run('mmdebstrap', ['--version'], { allowFail: true }).catch(() => ({ stdout: '', stderr: '' }));
  const version = `${v.stdout}${v.stderr}`.trim();
  const image = await trace.phase('mmdebstrap', () =>
    ctx.images.create(
      name,
      `debian:${spec.suite}`,
      async (root, scratch) => {
        await runMmdebstrap(root, spec, sources, scratch, log, opts.onProgress);
        opts.onProgress?.('fixing up the tree for machines');
        await fixUp(root, name);
        await skeleton(root);
        const provenance: Provenance = {
          kind: 'debian',
          source: `mmdebstrap ${spec.suite}`,
          build: { ...build, mmdebstrap: version },
          notes: [],
        };
        return { provenance };
      },
      key,
      replaceOld,
    ),
  );
  return { image, cached: false, log };
}
