/**
 * envd's EntryInfo (spec/envd/filesystem/filesystem.proto) from the Lab API's FileInfo, and a
 * file's metadata (envd ≥ 0.6.2), which envd keeps as `user.e2b.*` extended attributes: an
 * upload's `X-Metadata-KEY: V` is the attribute `user.e2b.KEY`, and EntryInfo's `metadata` is
 * every such attribute, the prefix taken off.
 */
import type { FileInfo } from '../lab/io/files.js';
import type { IdNames } from './users.js';

/** The xattr namespace of envd's file metadata. */
export const METADATA_XATTR = 'user.e2b.';

/** A file's envd metadata: its `user.e2b.*` extended attributes, the prefix taken off (none: undefined). */
export function metadataOf(xattrs: Record<string, string> | undefined): Record<string, string> | undefined {
  const entries = Object.entries(xattrs ?? {})
    .filter(([k]) => k.startsWith(METADATA_XATTR))
    .map(([k, v]) => [k.slice(METADATA_XATTR.length), v]);
  return entries.length ? Object.fromEntries(entries) : undefined;
}

const FILE_TYPE: Record<string, string> = {
  file: 'FILE_TYPE_FILE',
  dir: 'FILE_TYPE_DIRECTORY',
  symlink: 'FILE_TYPE_SYMLINK',
};

function permissions(type: string, mode: number): string {
  const bits = 'rwxrwxrwx'.split('').map((c, i) => (mode & (0o400 >> i) ? c : '-'));
  return (type === 'dir' ? 'd' : type === 'symlink' ? 'L' : '-') + bits.join('');
}

/** A snaplab FileInfo as envd's EntryInfo (JSON): its owner and group named as the machine names them. */
export function entryOf(f: FileInfo, ids: IdNames): Record<string, unknown> {
  const mode = Number.parseInt(f.mode, 8);
  const metadata = metadataOf(f.xattrs);
  return {
    name: f.name,
    type: FILE_TYPE[f.type] ?? 'FILE_TYPE_UNSPECIFIED',
    path: f.path,
    size: String(f.size),
    mode,
    permissions: permissions(f.type, mode),
    owner: ids.users.get(f.uid) ?? String(f.uid),
    group: ids.groups.get(f.gid) ?? String(f.gid),
    modifiedTime: f.mtime,
    ...(f.target !== undefined ? { symlinkTarget: f.target } : {}),
    ...(metadata ? { metadata } : {}),
  };
}
