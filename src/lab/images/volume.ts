import type { StorageKind, Volume } from '../../storage/backend.js';
import type { Trace } from '../../timing/trace.js';
import type { LabContext } from '../context.js';
import { inflight } from '../lifecycle/inflight.js';
import { resolveImage } from './templates.js';

/** The image's read-only volume on `storage`, imported on first use of that pair (a built-in template built first). */
export async function imageVolume(ctx: LabContext, image: string, storage: StorageKind, trace: Trace): Promise<Volume> {
  const have = ctx.store.getImageVolume(image, storage);
  if (have) return have;
  const img = await resolveImage(ctx, image);
  return trace.phase('import image', () =>
    inflight(ctx, 'import', async () => {
      const backend = await ctx.readyBackend(storage);
      const v = await backend.importImage(img.path, img.name);
      const raced = ctx.store.getImageVolume(img.name, storage);
      if (raced) {
        await backend.delete(v); // another process imported it meanwhile: use theirs
        return raced;
      }
      ctx.store.putImageVolume(img.name, storage, v);
      return v;
    }),
  );
}
