/**
 * The built-in templates (src/image/templates.ts) built on first use: a create, a pool or a
 * prepare that names `base` or `code-interpreter-v1` on a home without it builds it once (a Debian
 * build of a minute or more), then it is an ordinary image. Creates that ask while it is being
 * built wait for that one build (in this process, and in others through a lock file).
 */
import { join } from 'node:path';
import { SnaplabError } from '../../errors.js';
import { withLock } from '../../host/lock.js';
import { templateRecipe, type TemplateRecipe } from '../../image/templates.js';
import type { ImageRecord } from '../../store/records.js';
import type { LabContext } from '../context.js';
import { buildDebian, type Built } from './build.js';

/** Longest wait for another process's build of a template: far above a real one (minutes). */
const BUILD_WAIT_MS = 30 * 60_000;

/** Builds under way in this process, by home and name: two creates that ask at once share one build. */
const building = new Map<string, Promise<ImageRecord>>();

/**
 * The image record of `name`: found; or a built-in template, built now (progress on `onProgress`);
 * or the built-in busybox, made on first use; else IMAGE_NOT_FOUND.
 */
export async function resolveImage(
  ctx: LabContext,
  name: string,
  onProgress?: (s: string) => void,
): Promise<ImageRecord> {
  const found = ctx.store.getImage(name);
  if (found) return found;
  const recipe = templateRecipe(name);
  if (!recipe) return ctx.images.resolve(name);
  const key = `${ctx.home}\0${name}`;
  const under = building.get(key);
  if (under !== undefined) {
    onProgress?.(`waiting for the build of ${name} under way`);
    return under;
  }
  // one build across processes too (two `snaplab create --image base` at once): the second finds
  // the image the first recorded. No caller's signal: a caller that goes away leaves the build to
  // finish for the next one
  const p = underBuildLock(
    ctx,
    name,
    async () => ctx.store.getImage(name) ?? (await buildTemplate(ctx, recipe, { onProgress })).image,
  );
  building.set(key, p);
  return p.finally(() => building.delete(key));
}

/** Under the template's build lock: one build of it at a time across processes (first use, `image build`). */
export const underBuildLock = <T>(ctx: LabContext, name: string, fn: () => Promise<T>): Promise<T> =>
  withLock(join(ctx.home, 'images', `.build-${name}.lock`), fn, BUILD_WAIT_MS);

/** Build a built-in template under its name (a cache hit when an image of the same inputs exists). */
export async function buildTemplate(
  ctx: LabContext,
  recipe: TemplateRecipe,
  opts: { rebuild?: boolean; onProgress?: (s: string) => void; signal?: AbortSignal } = {},
): Promise<Built> {
  opts.onProgress?.(`building image ${recipe.name} (${recipe.description}) from Debian's archive, once`);
  try {
    const { result } = await ctx.traced('image build', recipe.name, (t) =>
      buildDebian(ctx, recipe.spec, { ...opts, name: recipe.name }, t),
    );
    return result;
  } catch (e) {
    // (an abort, a name taken, a missing mmdebstrap: said as they are)
    if (e instanceof SnaplabError && e.code !== 'IMAGE_BUILD_FAILED') throw e;
    const why = e instanceof Error ? e.message : String(e);
    const hint = e instanceof SnaplabError ? `${e.hint}; ` : '';
    throw new SnaplabError(
      'IMAGE_BUILD_FAILED',
      `the built-in template ${recipe.name} could not be built: ${why}`,
      `${hint}it is built from Debian's archive with mmdebstrap (logs in ${join(ctx.home, 'images', '.logs')}); try again with \`snaplab image build ${recipe.name}\``,
      { cause: e },
    );
  }
}
