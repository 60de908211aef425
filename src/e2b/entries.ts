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

/** Go's FileMode.String() of a Linux mode, as envd's `permissions` says it: `dtrwxrwxrwx`, `Lrwxrwxrwx`, `Dcrw-rw-rw-`. */
function permissions(type: FileInfo['type'], mode: number): string {
  // Go's letters in its order ("dalTLDpSugct?"), those a Linux file can have
  const letters =
    (type === 'dir' ? 'd' : '') +
    (type === 'symlink' ? 'L' : '') +
    (type === 'block' || type === 'char' ? 'D' : '') +
    (type === 'fifo' ? 'p' : '') +
    (type === 'socket' ? 'S' : '') +
    (mode & 0o4000 ? 'u' : '') +
    (mode & 0o2000 ? 'g' : '') +
    (type === 'char' ? 'c' : '') +
    (mode & 0o1000 ? 't' : '');
  const bits = 'rwxrwxrwx'.split('').map((c, i) => (mode & (0o400 >> i) ? c : '-'));
  return (letters || '-') + bits.join('');
}

/**
 * A snaplab FileInfo as envd's EntryInfo (JSON): its owner and group named as the machine names
 * them, its mode the permission bits (Go's Perm()). A link is shown as envd shows it: the type and
 * mode of where it ends (none: unspecified, 0), `symlinkTarget` that end's real path (none: the
 * link's own path), its size and `permissions` its own.
 */
export function entryOf(f: FileInfo, ids: IdNames): Record<string, unknown> {
  const own = Number.parseInt(f.mode, 8);
  const metadata = metadataOf(f.xattrs);
  const link = f.type === 'symlink';
  const end = link ? f.resolved : undefined;
  const type = link ? end?.type : f.type;
  const mode = link ? (end ? Number.parseInt(end.mode, 8) & 0o777 : 0) : own & 0o777;
  return {
    name: f.name,
    type: (type && FILE_TYPE[type]) ?? 'FILE_TYPE_UNSPECIFIED',
    path: f.path,
    size: String(f.size),
    mode,
    permissions: permissions(f.type, own),
    owner: ids.users.get(f.uid) ?? String(f.uid),
    group: ids.groups.get(f.gid) ?? String(f.gid),
    modifiedTime: f.mtime,
    ...(link ? { symlinkTarget: end?.path ?? f.path } : {}),
    ...(metadata ? { metadata } : {}),
  };
}
