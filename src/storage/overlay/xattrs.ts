import { SnaplabError } from '../../errors.js';
import { HostOps } from '../../host/hostops.js';

/**
 * Move overlayfs's trusted.overlay.* marks below `dir` to user.overlay.* (the userxattr format
 * every overlay mount uses: layers.ts OVERLAY_XATTRS), without following links or crossing
 * mounts. Returns how many were moved. Needs the host helper: Node has no xattr calls.
 */
export async function moveXattrs(dir: string): Promise<number> {
  const ops = HostOps.get();
  if (!ops)
    throw new SnaplabError(
      'INTERNAL',
      'the host helper (snaplab-hostops) is needed to convert overlay layers',
      'build it: npm run build',
    );
  const [n] = await ops.request('overlay-xattrs', dir);
  return Number(n);
}
