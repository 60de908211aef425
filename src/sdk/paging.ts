/**
 * Pages of a sandbox list (ListOptions `limit` and `after`; E2B's list, newest first): ordered by
 * creation time then id, so that a page is the same whichever implementation answers it (a lab, a
 * daemon, a cluster gateway merging its nodes' pages). A cursor names the last sandbox of the page
 * before by its creation time and id, so it stays valid when that sandbox is removed meanwhile. A
 * sandbox that comes into a list while a client pages through it (made, or taken from a pool by
 * this key, which keeps its standby's creation time) is seen only if it sorts after the cursor.
 * A lab reads its page in this order from its store, only the page's rows (Store.pageSandboxes: a
 * keyset query on an index of creation time and id), with every filter of ListOptions in the same
 * statement; `pageOf` pages a list already in hand (a gateway's merge of its nodes' pages), and
 * `listFilter` filters what a gateway holds of its own (its absent sandboxes) as a store does.
 */
import { SnaplabError } from '../errors.js';
import type { ListOptions, ListState, SandboxCount } from './api.js';

export interface Listed {
  readonly id: string;
  readonly createdAt: number;
}

/** The cursor after `b`: pass it as `after` for the next page. */
export const listCursor = (b: Listed): string => `${b.createdAt}.${b.id}`;

/** The next page's cursor after a page asked with `limit`: a full page may have one after it, a shorter one has none. */
export const nextCursor = (page: readonly Listed[], limit: number | undefined): string | undefined =>
  limit !== undefined && page.length === limit && page.length > 0 ? listCursor(page.at(-1)!) : undefined;

const CURSOR = /^(\d{1,15})\.([0-9a-z][0-9a-z-]{0,63})$/;

function parseCursor(after: string): Listed {
  const m = CURSOR.exec(after);
  if (!m)
    throw new SnaplabError(
      'BAD_INPUT',
      `invalid list cursor ${JSON.stringify(after)}`,
      'pass the X-Next-Cursor of the page before (listCursor of its last sandbox)',
    );
  return { createdAt: Number(m[1]), id: m[2]! };
}

const before = (a: Listed, b: Listed): number => a.createdAt - b.createdAt || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);

export interface PageAsked {
  limit?: number;
  after?: string;
  /** newest first (E2B's list); default oldest first */
  order?: 'asc' | 'desc';
}

/** The largest page a list gives, embedded and through a daemon alike (it was the daemon's alone: `ls --limit 20000` worked here and not there). */
export const MAX_PAGE = 10_000;

/** Throws BAD_INPUT for a limit or cursor no page can have (before any work is asked of anyone). */
export function checkPage(opts: PageAsked): Listed | undefined {
  if (opts.limit !== undefined && !(Number.isInteger(opts.limit) && opts.limit >= 1 && opts.limit <= MAX_PAGE))
    throw new SnaplabError(
      'BAD_INPUT',
      `invalid list limit ${opts.limit}`,
      `a whole number of sandboxes from 1 to ${MAX_PAGE} (more: page on with the next cursor)`,
    );
  return opts.after === undefined ? undefined : parseCursor(opts.after);
}

/** The page of `all` that `limit` and `after` ask for, in list order (all of it when neither is given). */
export function pageOf<T extends Listed>(all: T[], opts: PageAsked): T[] {
  const from = checkPage(opts);
  const sign = opts.order === 'desc' ? -1 : 1;
  const sorted = [...all].sort((a, b) => sign * before(a, b));
  const rest = from ? sorted.filter((b) => sign * before(b, from) > 0) : sorted;
  return opts.limit === undefined ? rest : rest.slice(0, opts.limit);
}

export const LIST_STATES: readonly ListState[] = ['creating', 'running', 'paused', 'stopped', 'dead', 'removing'];

const badList = (what: string, hint: string): SnaplabError =>
  new SnaplabError('BAD_INPUT', `invalid list ${what}`, hint);

/**
 * Throws BAD_INPUT for list options no list can have (checkPage's, and the filters': a state
 * that is not a ListState, metadata values that are not strings or lists of strings and null, a
 * time that is not a whole number of ms, an order that is neither asc nor desc).
 */
/** a list's filter: at most this many label and metadata keys, and this many values a metadata key */
export const MAX_FILTER_KEYS = 32;
export const MAX_ALTERNATIVES = 256;

export function checkList(opts: ListOptions): Listed | undefined {
  const from = checkPage(opts);
  for (const st of opts.state ?? [])
    if (!LIST_STATES.includes(st)) throw badList(`state ${JSON.stringify(st)}`, `one of ${LIST_STATES.join(', ')}`);
  const keys = Object.keys(opts.metadata ?? {}).length + Object.keys(opts.labels ?? {}).length;
  if (keys > MAX_FILTER_KEYS)
    throw badList(`a filter of ${keys} keys`, `at most ${MAX_FILTER_KEYS} label and metadata keys in one list`);
  for (const [k, v] of Object.entries(opts.metadata ?? {})) {
    if (Array.isArray(v) && v.length > MAX_ALTERNATIVES)
      throw badList(`metadata filter ${JSON.stringify(k)} of ${v.length} values`, `at most ${MAX_ALTERNATIVES} a key`);
    const ok =
      typeof v === 'string' || (Array.isArray(v) && v.every((x: unknown) => typeof x === 'string' || x === null));
    if (!ok)
      throw badList(
        `metadata filter ${JSON.stringify(k)}`,
        'give each key a string, or a list of strings (null among them: or without the key)',
      );
  }
  if (opts.createdSince !== undefined && !Number.isSafeInteger(opts.createdSince))
    throw badList(`createdSince ${opts.createdSince}`, 'a time in ms since the epoch (a whole number)');
  if (opts.order !== undefined && opts.order !== 'asc' && opts.order !== 'desc')
    throw badList(`order ${JSON.stringify(opts.order)}`, 'asc (oldest first) or desc (newest first)');
  return from;
}

/** A metadata filter's alternatives for one key (null: without the key). */
export const alternatives = (v: string | readonly (string | null)[]): readonly (string | null)[] =>
  typeof v === 'string' ? [v] : v;

/** What a list filters a sandbox by. */
export interface Filtered extends Listed {
  readonly state: string;
  readonly stopped: boolean;
  readonly metadata: Record<string, string>;
}

/** Its state as a list filters it (ListState; a state no list names, e.g. a gateway's `lost`, as it is). */
export const listStateOf = (b: Filtered): string => (b.stopped ? 'stopped' : b.state);

/**
 * Does `b` pass the filters of ListOptions this module knows (metadata, state, createdSince)? For a
 * list a gateway holds itself; a lab's store runs the same filters in SQL (Store.pageSandboxes).
 */
export function listFilter(opts: ListOptions): (b: Filtered) => boolean {
  const meta = Object.entries(opts.metadata ?? {}).map(([k, v]) => [k, alternatives(v)] as const);
  const states = opts.state && new Set<string>(opts.state);
  return (b) =>
    (states === undefined || states.has(listStateOf(b))) &&
    (opts.createdSince === undefined || b.createdAt >= opts.createdSince) &&
    meta.every(([k, alts]) => alts.includes(Object.hasOwn(b.metadata, k) ? b.metadata[k]! : null));
}

/**
 * A count of sandboxes already at hand, by state as a list filters it (a stopped one `stopped`):
 * where there is no store to count in (a gateway's absent ones, from its watched copy).
 */
export function countOf(boxes: readonly Filtered[]): SandboxCount {
  const byState: SandboxCount['byState'] = {};
  for (const b of boxes) byState[listStateOf(b)] = (byState[listStateOf(b)] ?? 0) + 1;
  return { total: boxes.length, byState };
}
