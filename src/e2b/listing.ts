/**
 * A sandbox as E2B's API shows it (SandboxDetail, ListedSandbox), and the list with its filters
 * (metadata, state, startedAfter inclusive, template), newest first, paged with X-Next-Token.
 * What the front keeps of a sandbox (its template, its envVars) is in its metadata under `e2b.`,
 * which E2B's callers do not see.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { LabApi, SandboxApi } from '../sdk/api.js';
import { SnaplabError } from '../errors.js';
import { ENVD_VERSION } from './state.js';

export const RESERVED = 'e2b.';
const MB = 1 << 20;

export interface E2bView {
  templateID: string;
  /** the create's envVars, given to every command */
  envs: Record<string, string>;
  detail: Record<string, unknown>;
}

export function fromMetadata(box: SandboxApi): E2bView {
  const meta = box.metadata ?? {};
  const templateID = meta[`${RESERVED}template`] ?? 'base';
  let envs: Record<string, string> = {};
  try {
    envs = JSON.parse(meta[`${RESERVED}envs`] ?? '{}') as Record<string, string>;
  } catch {
    envs = {};
  }
  const metadata = Object.fromEntries(Object.entries(meta).filter(([k]) => !k.startsWith(RESERVED)));
  const end = box.expiresAt ?? (box.timeoutS ? Date.now() + box.timeoutS * 1000 : Date.UTC(9999, 0));
  const detail = {
    sandboxID: box.id,
    templateID,
    alias: templateID,
    clientID: 'snaplab',
    startedAt: new Date(box.createdAt).toISOString(),
    endAt: new Date(end).toISOString(),
    envdVersion: ENVD_VERSION,
    cpuCount: Math.max(1, Math.ceil(box.limits.cpus ?? 1)),
    memoryMB: Math.round((box.limits.memoryBytes ?? 0) / MB),
    diskSizeMB: Math.round((box.limits.diskBytes ?? 0) / MB),
    metadata,
    state: box.state === 'paused' ? 'paused' : 'running',
    ...networkView(meta[`${RESERVED}network`]),
  };
  return { templateID, envs, detail };
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

function cursorOf(token: string | undefined): [number, string] | undefined {
  if (!token) return undefined;
  try {
    const c = JSON.parse(Buffer.from(token, 'base64url').toString()) as unknown;
    if (Array.isArray(c) && typeof c[0] === 'number' && typeof c[1] === 'string') return [c[0], c[1]];
  } catch {
    // said below
  }
  throw new SnaplabError('BAD_INPUT', 'the nextToken is not one this server gave', 'start again without it');
}

function pageLimit(text: string | undefined): number {
  if (text === undefined) return 100;
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1 || n > 100)
    throw new SnaplabError('BAD_INPUT', 'limit must be a whole number from 1 to 100', 'e.g. limit=10');
  return n;
}

/** The caller's sandboxes as E2B lists them; `paged`: v2, with limit and X-Next-Token. */
export async function listSandboxes(
  lab: LabApi,
  req: FastifyRequest,
  reply: FastifyReply,
  paged: boolean,
): Promise<Record<string, unknown>[]> {
  const q = req.query as ListQuery;
  const filter = metadataFilter(q.metadata);
  const states = (q.state ?? 'running,paused').split(',').filter(Boolean);
  const after = q.startedAfter ? Date.parse(q.startedAfter) : undefined;
  if (after !== undefined && Number.isNaN(after))
    throw new SnaplabError('BAD_INPUT', 'startedAfter is not a date', 'give an ISO 8601 time');
  const asc = q.order === 'asc';
  const boxes = (await lab.list({ check: false }))
    .filter((b) => b.state === 'running' || b.state === 'paused')
    .map((b) => ({ b, v: fromMetadata(b) }))
    .filter(({ b, v }) => states.includes(v.detail.state as string) && (after === undefined || b.createdAt >= after))
    .filter(({ v }) => !q.template || v.templateID === q.template)
    .filter(({ v }) => Object.entries(filter).every(([k, x]) => (v.detail.metadata as Record<string, string>)[k] === x))
    .sort((x, y) => (x.b.createdAt - y.b.createdAt || (x.b.id < y.b.id ? -1 : 1)) * (asc ? 1 : -1));
  if (!paged) return boxes.map(({ v }) => v.detail);
  const limit = pageLimit(q.limit);
  const cursor = cursorOf(q.nextToken);
  const past = (b: SandboxApi): boolean => {
    if (!cursor) return true;
    const d = b.createdAt - cursor[0] || (b.id < cursor[1] ? -1 : b.id > cursor[1] ? 1 : 0);
    return asc ? d > 0 : d < 0;
  };
  const rest = boxes.filter(({ b }) => past(b));
  const page = rest.slice(0, limit);
  if (rest.length > limit) {
    const last = page[page.length - 1]!.b;
    void reply.header('x-next-token', Buffer.from(JSON.stringify([last.createdAt, last.id])).toString('base64url'));
  }
  return page.map(({ v }) => v.detail);
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
