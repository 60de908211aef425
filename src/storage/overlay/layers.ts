import { join } from 'node:path';
import { readMeta } from '../meta.js';
import { overlayLowerDirs, readMounts } from '../mounts.js';
import { listIds } from '../tree.js';

/**
 * Layer ownership (the rule delete() relies on):
 * - a layer is the directory `<root>/<id>/layer` and belongs to volume <id>: an image owns its
 *   imported tree, a snapshot of a clone owns the copy of the clone's upper dir it made;
 * - clones, and snapshots of read-only volumes, own no layer: they only name the owners' ids in
 *   their stack (`Volume.ref.layers`, top first, and meta.json);
 * - the lab deletes a snapshot or image only when nothing cloned from it is alive; the backend
 *   enforces it: deleting a layer's owner while another volume still stacks the layer (found in
 *   meta.json files and in /proc/self/mountinfo) fails with the users named.
 */
export interface OverlayMeta {
  role: 'image' | 'clone' | 'snapshot';
  /** ids of the layer owners, top first */
  layers: string[];
  readOnly: boolean;
  name?: string;
  /** a clone mounted inside a sandbox's user namespace, never on the host (OverlayBackend.clone) */
  inNamespace?: boolean;
}

export const MAX_LAYERS = 32;

/**
 * Every overlay mount of snaplab, on the host or inside a sandbox's user namespace
 * (native/userns.c), is `userxattr`: overlayfs keeps its marks (opaque directories, redirects)
 * as user.overlay.* xattrs, which the namespace's root can write; trusted.overlay.* it cannot,
 * and the kernel then silently loses opaque directories (an image directory removed inside
 * comes back, or fails with EIO). One format for all mounts, so that any layer stacks under any
 * mount. Layers made before are moved to it once (OverlayBackend.init).
 */
export const OVERLAY_XATTRS = 'userxattr';

/** The mount options of a stack: layers top first; no upper dir makes it read-only. */
export function overlayOptions(lowers: string[], upper?: { upper: string; work: string }): string {
  return [
    `lowerdir=${lowers.join(':')}`,
    ...(upper ? [`upperdir=${upper.upper}`, `workdir=${upper.work}`] : []),
    OVERLAY_XATTRS,
  ].join(',');
}

export const layerDir = (root: string, id: string): string => join(root, id, 'layer');

/** Volumes other than `self` that stack the layer owned by `owner`. */
export async function layerUsers(root: string, owner: string, self: string): Promise<string[]> {
  const users = new Set<string>();
  for (const id of await listIds(root)) {
    if (id === self) continue;
    const meta = await readMeta<OverlayMeta>(join(root, id));
    if (meta?.layers.includes(owner)) users.add(id);
  }
  const layer = layerDir(root, owner);
  for (const m of await readMounts()) {
    if (m.fstype !== 'overlay' || m.target === join(root, self, 'merged')) continue;
    if (overlayLowerDirs(m).includes(layer)) users.add(m.target);
  }
  return [...users];
}
