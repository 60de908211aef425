import type { Availability } from '../../host/probe-types.js';
import { toolsVerdict } from '../../host/tools.js';
import { checkImportSource, importInto, type ImportOptions } from '../import.js';
import type { ImagePlan, ImageSource } from '../source.js';
import { unpackBinaryPath } from '../unpack.js';

export interface ArchiveInput extends Omit<ImportOptions, 'signal' | 'onProgress'> {
  /** a rootfs tarball or directory, a `docker save` tarball, or an OCI image layout (directory or tarball) */
  path: string;
}

/**
 * An image from an archive or a tree on the host: applied by the helper (native/unpack.c), which
 * resolves every path inside the new tree; layers are checked against their digests.
 */
export const archiveSource: ImageSource<ArchiveInput> = {
  kind: 'archive',
  feature: 'image',
  async probe(): Promise<Availability> {
    const tools = await toolsVerdict('image', 'image import');
    if (tools) return tools;
    try {
      return { ok: true, reason: `the image helper at ${unpackBinaryPath()}` };
    } catch (e) {
      return { ok: false, reason: (e as Error).message, fix: 'make -C native (or npm run build)' };
    }
  },
  async plan({ path, ...opts }: ArchiveInput): Promise<ImagePlan> {
    const { abs } = await checkImportSource(path);
    return {
      source: abs,
      produce: ({ root, scratch, signal, onProgress }) =>
        importInto(root, path, scratch, { ...opts, signal, onProgress }),
    };
  },
};
