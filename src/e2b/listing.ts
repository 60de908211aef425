/**
 * A sandbox as E2B's API shows it (SandboxDetail, ListedSandbox), and the list with its filters
 * (metadata, state, startedAfter inclusive, template), newest first, paged with X-Next-Token.
 * What the front keeps of a sandbox (its template, its envVars, its network options, whether it
 * asked for autoResume) is in its metadata under `e2b.`, which E2B's callers do not see; its
 * lifecycle's onTimeout is the sandbox's own (the Lab API's onTimeout), not a copy.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import {
  FRONT_METADATA_PREFIXES,
  type KeyedLabApi,
  type ListOptions,
  type ListState,
  type SandboxApi,
} from '../sdk/api.js';
import { SnaplabError } from '../errors.js';
import { checkPage, listCursor } from '../sdk/paging.js';
import { capacityOf } from '../sdk/capacity.js';

/** the front's own metadata keys' prefix: kept by a replace of the metadata that does not name them */
export const RESERVED = FRONT_METADATA_PREFIXES.e2b;

/** The envd version advertised: the features of envd this front implements (docs/e2b.md). */
export const ENVD_VERSION = '0.6.4';
const MB = 1 << 20;

export interface E2bView {
  templateID: string;
  /** the create's envVars, given to every command */
  envs: Record<string, string>;
  /** the create asked for autoResume: an envd call for it while it is paused resumes it (state.ts) */
  autoResume: boolean;
  detail: Record<string, unknown>;
}

/** The template a sandbox without one (made through snaplab's own API by the same key) is shown with. */
const NO_TEMPLATE = 'base';

/**
 * The size of the filesystem each storage's sandboxes without a disk cap live on, as the last
 * getMetrics of one of them read it (its `diskTotal`): getInfo's and a list's diskSizeMB for them.
 * Not read for them (a sandbox's usage syncs and measures its volume: too dear for a list).
 */
export class DiskSizes {
  private readonly known = new Map<string, number>();

  /** What a sample of a sandbox's use said of its disk (metrics.ts). */
  seen(box: SandboxApi, totalBytes: number | null): void {
    if (!box.limits.diskBytes && totalBytes) this.known.set(box.storage, totalBytes);
  }

  /** A sandbox's disk in bytes: its cap, else its storage's filesystem (0 until a sample said it). */
  of(box: SandboxApi): number {
    return box.limits.diskBytes ?? this.known.get(box.storage) ?? 0;
  }
}

export function fromMetadata(box: SandboxApi, disks?: DiskSizes): E2bView {
  const meta = box.metadata ?? {};
  const { templateID, envs } = keptOf(meta);
  const metadata = Object.fromEntries(Object.entries(meta).filter(([k]) => !k.startsWith(RESERVED)));
  const end = box.expiresAt ?? (box.timeoutS ? Date.now() + box.timeoutS * 1000 : Date.UTC(9999, 0));
  const autoResume = asksAutoResume(meta);
  const capacity = capacityOf(box);
  const detail = {
    sandboxID: box.id,
    templateID,
    alias: templateID,
    clientID: 'snaplab',
    startedAt: new Date(box.createdAt).toISOString(),
    endAt: new Date(end).toISOString(),
    envdVersion: ENVD_VERSION,
    cpuCount: capacity.cpus,
    memoryMB: Math.round(capacity.memoryTotalBytes / MB),
    diskSizeMB: Math.round((disks?.of(box) ?? box.limits.diskBytes ?? 0) / MB),
    metadata,
    // one paused without its memory is stopped: paused to E2B's callers, a connect starts it
    state: box.state === 'paused' || box.stopped ? 'paused' : 'running',
    // E2B's two actions: a stop on timeout is its pause without the memory
    lifecycle: { onTimeout: box.onTimeout === 'kill' ? 'kill' : 'pause', autoResume },
    ...networkView(meta[`${RESERVED}network`]),
  };
  return { templateID, envs, autoResume, detail };
}

/** Did its create ask for autoResume (`e2b.autoResume`, control.ts)? */
export const asksAutoResume = (meta: Record<string, string> | undefined): boolean =>
  meta?.[`${RESERVED}autoResume`] === 'true';

/**
 * The template and envVars the front kept in a sandbox's metadata (one read of it: a command's
 * Start needs these alone, not the rest of the view, each part of which is a read of the record).
 */
export function keptOf(meta: Record<string, string>): Pick<E2bView, 'templateID' | 'envs'> {
  const templateID = meta[`${RESERVED}template`] ?? NO_TEMPLATE;
  try {
    return { templateID, envs: JSON.parse(meta[`${RESERVED}envs`] ?? '{}') as Record<string, string> };
  } catch {
    return { templateID, envs: {} };
  }
}

/** E2B's metadata filter: `k=v&k2=v2`, each key and value URL-encoded again inside. */
function metadataFilter(text: unknown): Record<string, string> {
  if (typeof text !== 'string' || !text) return {};
  const out: Record<string, string> = {};
  for (const [k, v] of new URLSearchParams(text)) {
    try {
      out[decodeURIComponent(k)] = decodeURIComponent(v);
    } catch {
      throw new SnaplabError('BAD_INPUT', 'the metadata filter is not URL-encoded', 'send metadata=k%3Dv');
    }
  }
  return out;
}

interface ListQuery {
  metadata?: string;
  state?: string;
  startedAfter?: string;
  template?: string;
  order?: string;
  limit?: string;
  nextToken?: string;
}

/** The list cursor (sdk/paging.ts) a nextToken carries: this server's tokens are its cursors, base64url. */
function cursorOf(token: string | undefined): string | undefined {
  if (!token) return undefined;
  const cursor = Buffer.from(token, 'base64url').toString();
  try {
    checkPage({ after: cursor });
    return cursor;
  } catch (e) {
    throw new SnaplabError('BAD_INPUT', 'the nextToken is not one this server gave', 'start again without it', {
      cause: e,
    });
  }
}

function pageLimit(text: string | undefined): number {
  if (text === undefined) return 100;
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1 || n > 100)
    throw new SnaplabError('BAD_INPUT', 'limit must be a whole number from 1 to 100', 'e.g. limit=10');
  return n;
}

/** E2B's states, as the Lab API's list filters them: a stopped machine is `paused` to E2B (fromMetadata). */
const E2B_STATES: Record<string, ListState[]> = { running: ['running'], paused: ['paused', 'stopped'] };

/**
 * What the Lab API's list is asked for E2B's filters, or undefined when no sandbox can pass them:
 * the filters are read in the lab's store (its page only), never over every sandbox here.
 */
function listOptions(q: ListQuery, paged: boolean): ListOptions | undefined {
  const filter = metadataFilter(q.metadata);
  // v1 lists the running ones, as E2B's; v2 both states unless asked, an unknown one refused as there
  const asked = paged ? (q.state ?? 'running,paused').split(',').filter(Boolean) : ['running'];
  for (const s of asked)
    if (!Object.hasOwn(E2B_STATES, s))
      throw new SnaplabError('BAD_INPUT', `unknown state ${JSON.stringify(s)}`, 'state: running, paused or both');
  if (q.order !== undefined && q.order !== 'asc' && q.order !== 'desc')
    throw new SnaplabError('BAD_INPUT', `unknown order ${JSON.stringify(q.order)}`, 'order: asc or desc');
  const state = [...new Set(asked.flatMap((s) => E2B_STATES[s]!))];
  const after = q.startedAfter ? Date.parse(q.startedAfter) : undefined;
  if (after !== undefined && Number.isNaN(after))
    throw new SnaplabError('BAD_INPUT', 'startedAfter is not a date', 'give an ISO 8601 time');
  // the front's own keys are not the caller's metadata: a filter on one keeps nothing
  if (Object.keys(filter).some((k) => k.startsWith(RESERVED))) return undefined;
  const metadata: Record<string, string | (string | null)[]> = { ...filter };
  // (a sandbox without a template is shown with NO_TEMPLATE, and kept by a filter on it)
  if (q.template) metadata[`${RESERVED}template`] = q.template === NO_TEMPLATE ? [NO_TEMPLATE, null] : q.template;
  return {
    check: false,
    state,
    metadata,
    order: q.order === 'asc' ? 'asc' : 'desc',
    ...(after !== undefined ? { createdSince: after } : {}),
  };
}

/** The caller's sandboxes as E2B lists them; `paged`: v2, with limit and X-Next-Token. */
export async function listSandboxes(
  lab: KeyedLabApi,
  disks: DiskSizes,
  req: FastifyRequest,
  reply: FastifyReply,
  paged: boolean,
): Promise<Record<string, unknown>[]> {
  const q = req.query as ListQuery;
  const opts = listOptions(q, paged);
  const limit = paged ? pageLimit(q.limit) : undefined;
  const after = paged ? cursorOf(q.nextToken) : undefined;
  if (!opts) return [];
  if (limit === undefined) return (await lab.list(opts)).map((b) => fromMetadata(b, disks).detail);
  // one more than the page: a next page is named only when there is one
  const page = await lab.list({ ...opts, limit: limit + 1, ...(after !== undefined ? { after } : {}) });
  if (page.length > limit) {
    page.pop();
    void reply.header('x-next-token', Buffer.from(listCursor(page.at(-1)!)).toString('base64url'));
  }
  return page.map((b) => fromMetadata(b, disks).detail);
}

/** The network options the sandbox was made (or last updated) with, as E2B's getInfo gives them. */
function networkView(stored: string | undefined): Record<string, unknown> {
  if (!stored) return {};
  try {
    const n = JSON.parse(stored) as { allowOut?: string[]; denyOut?: string[]; internet: boolean };
    return {
      allowInternetAccess: n.internet,
      network: { ...(n.allowOut ? { allowOut: n.allowOut } : {}), ...(n.denyOut ? { denyOut: n.denyOut } : {}) },
    };
  } catch {
    return {};
  }
}
