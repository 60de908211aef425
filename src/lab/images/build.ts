import { join } from 'node:path';
import { SnaplabError } from '../../errors.js';
import { run } from '../../host/run.js';
import { defaultName, fixUp, type DebianSpec } from '../../image/debian.js';
import { debianSource } from '../../image/registry.js';
import { packageCacheDir } from '../../image/package-cache.js';
import type { ImagePlan, Provenance } from '../../image/source.js';
import type { ImageRecord } from '../../store/records.js';
import type { Trace } from '../../timing/trace.js';
import type { LabContext } from '../context.js';
import { checkName } from '../names.js';
import { imageBlockers, imageUsers, removeImage } from '../lifecycle/removals.js';

export interface BuildOptions {
  name?: string;
  /** build again even when an image of the same inputs exists */
  rebuild?: boolean;
  onProgress?: (s: string) => void;
  /** an abort stops mmdebstrap (its mounts undone) and rejects with the signal's reason; no image is left */
  signal?: AbortSignal;
}

export interface Built {
  image: ImageRecord;
  /** an image of the same inputs existed: nothing was downloaded or built */
  cached: boolean;
  log?: string;
}

/** Another name for a cached build: a copy of its tree, with its own hostname (no download). */
function copyOf(cached: ImageRecord): ImagePlan {
  return {
    source: cached.source,
    buildKey: cached.buildKey ?? undefined,
    async produce({ root, name, signal }) {
      await run('cp', ['-a', '--reflink=auto', '--', `${cached.path}/.`, root], { signal });
      await fixUp(root, name);
      return {
        provenance: {
          ...(cached.provenance as Provenance),
          notes: [`a copy of ${cached.name}, built from the same inputs`],
        },
        config: cached.config ?? undefined,
      };
    },
  };
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
  const plan = await debianSource.plan({
    spec: input,
    logDir: join(ctx.home, 'images', '.logs'),
    packageCache: packageCacheDir(ctx.home),
  });
  const key = plan.buildKey;
  const name = opts.name ?? defaultName(plan.spec, key);
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
  const produce = { trace, signal: opts.signal, onProgress: opts.onProgress };
  if (cached) {
    opts.onProgress?.(`copying ${cached.name} (built from the same inputs)`);
    const image = await trace.phase('copy tree', () => ctx.images.create(name, copyOf(cached), produce));
    return { image, cached: true };
  }
  const replace = async (): Promise<void> => {
    if (same) await removeImage(ctx, name, trace);
  };
  const image = await trace.phase('mmdebstrap', () => ctx.images.create(name, plan, { ...produce, replace }));
  return { image, cached: false, log: plan.log };
}
