/**
 * E2B's names of snapshots (`[namespace/]alias[:tag]`) and snaplab's (the alias, or `alias.tag`
 * for a tag other than `default`: an E2B alias has no dot): for the snapshot routes (snapshots.ts)
 * and a create whose template names one (control.ts).
 */
export const DEFAULT_TAG = 'default';
/** E2B's own rules for an alias and a tag (its id package), here case as given. */
const ALIAS = /^[a-z0-9_-]+$/i;
const TAG = /^[a-z0-9_.-]+$/i;

/** An E2B snapshot name or id (`[namespace/]alias[:tag]`) as its alias and tag, or undefined when it is not one. */
export function parseRef(ref: string): { alias: string; tag: string } | undefined {
  const [identifier = '', tag = DEFAULT_TAG, extra] = ref.trim().split(':');
  const alias = identifier.slice(identifier.lastIndexOf('/') + 1);
  if (extra !== undefined || !ALIAS.test(alias) || !TAG.test(tag)) return undefined;
  return { alias, tag };
}

/** The snaplab name of an E2B snapshot (the alias, or `alias.tag`). */
export const nameOf = (r: { alias: string; tag: string }): string =>
  r.tag === DEFAULT_TAG ? r.alias : `${r.alias}.${r.tag}`;

/** The E2B id of a snaplab snapshot name: `alias:tag` (the part before its first dot, and the rest). */
export function idOf(name: string): string {
  const dot = name.indexOf('.');
  return dot < 0 ? `${name}:${DEFAULT_TAG}` : `${name.slice(0, dot)}:${name.slice(dot + 1)}`;
}

/**
 * The snapshot a create's template names by its tag (`alias:tag`: no image or pool name has a
 * colon), else undefined (an alias alone is a snapshot's only where no image has that name: control.ts).
 */
export function snapshotNameOf(template: string): string | undefined {
  const ref = template.includes(':') ? parseRef(template) : undefined;
  return ref && nameOf(ref);
}
