/**
 * The dashboard's one way to the daemon: same origin, same API as every other client. On TCP the
 * key is asked for once and kept for the tab (sessionStorage; "remember" keeps it in localStorage);
 * through `snaplab ui` (a local forward to the Unix socket) no key is needed.
 */
const KEY = 'snaplab.key';

export function key(): string | null {
  return sessionStorage.getItem(KEY) ?? localStorage.getItem(KEY);
}

export function setKey(k: string | null, remember = false): void {
  sessionStorage.removeItem(KEY);
  localStorage.removeItem(KEY);
  if (k) (remember ? localStorage : sessionStorage).setItem(KEY, k);
}

/**
 * `snaplab ui` prints a URL with its token after `#key=` (a fragment is never sent to a server).
 * It is taken out of the address bar at once, and kept only when the daemon answers to it as the
 * local forward does (`local`): a link carrying someone's real API key does not sign a visitor in
 * as them, nor replace the key they had.
 */
export async function adoptLinkKey(): Promise<void> {
  const m = /^#key=([A-Za-z0-9_-]{16,})$/.exec(location.hash);
  if (!m) return;
  history.replaceState(null, '', `${location.pathname}#/machines`);
  const res = await fetch('/whoami', { headers: { authorization: `Bearer ${m[1]}` } }).catch((e: unknown) => {
    console.warn('snaplab: /whoami failed; the key in the link is not used', e);
    return undefined;
  });
  const who = res?.ok ? ((await res.json()) as { key?: string }) : undefined;
  if (who?.key === 'local') setKey(m[1]!);
}

/** An error the API answered with: its code, message and hint, as the CLI prints them. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly hint?: string,
  ) {
    super(message);
  }
}

function headers(extra: Record<string, string> = {}): Record<string, string> {
  const k = key();
  return k ? { ...extra, authorization: `Bearer ${k}` } : extra;
}

async function failure(res: Response): Promise<ApiError> {
  const text = await res.text();
  try {
    const e = JSON.parse(text) as { code?: string; message?: string; hint?: string };
    return new ApiError(res.status, e.code ?? 'HTTP', e.message ?? text, e.hint);
  } catch {
    return new ApiError(res.status, 'HTTP', text || res.statusText);
  }
}

/** A JSON call; an error answer is thrown as an ApiError. */
export async function api<T = unknown>(method: string, path: string, body?: unknown): Promise<T> {
  const res = await fetch(path, {
    method,
    headers: headers(body === undefined ? {} : { 'content-type': 'application/json' }),
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!res.ok) throw await failure(res);
  if (res.status === 204) return undefined as T;
  return (await res.json()) as T;
}

/** A page of a list (`limit` and `after`): its items, and the cursor of the next page when the server names one. */
export async function apiPage<T>(path: string): Promise<{ items: T[]; next: string | null }> {
  const res = await fetch(path, { headers: headers() });
  if (!res.ok) throw await failure(res);
  return { items: (await res.json()) as T[], next: res.headers.get('x-next-cursor') };
}

/** A raw call (file bodies both ways). */
export async function raw(
  method: string,
  path: string,
  body?: BodyInit,
  type = 'application/octet-stream',
): Promise<Response> {
  const res = await fetch(path, { method, headers: headers(body === undefined ? {} : { 'content-type': type }), body });
  if (!res.ok) throw await failure(res);
  return res;
}

/** A URL for what a browser cannot send a header with (WebSockets, EventSource): the key as ?token=. */
export function streamUrl(path: string, ws = false): string {
  const u = new URL(path, location.href);
  if (ws) u.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const k = key();
  if (k) u.searchParams.set('token', k);
  return u.toString();
}

export const enc = encodeURIComponent;

/** The state a machine is shown in: a stopped one is dead with its filesystem kept, shown `stopped`. */
export const shownState = (b: Pick<Sandbox, 'state' | 'stopped'>): string => (b.stopped ? 'stopped' : b.state);

export interface Sandbox {
  id: string;
  name: string;
  state: string;
  reason: string | null;
  image: string;
  storage: string;
  driver: string;
  labels: Record<string, string>;
  metadata: Record<string, string>;
  owner: string | null;
  timeoutS: number;
  onTimeout: string;
  expiresAt: string | null;
  createdAt: string;
  limits: { memoryBytes?: number; pids?: number; cpus?: number; diskBytes?: number };
  origin: string | null;
  pid: number | null;
  init: string;
  /** stopped (`stop`): dead with its filesystem kept; `start` raises it again */
  stopped?: boolean;
  /** outbound network (docs/egress.md), or null: loopback only */
  egress?: { address: string; allow: string[]; deny: string[] } | null;
}

/** GET /sandboxes/{id}/egress */
export interface EgressUsage {
  address: string;
  allow: string[];
  deny: string[];
  bytesOut: number;
  connections: number;
  denied: number;
}

export interface Usage {
  id: string;
  at: number;
  memoryBytes?: number;
  pids?: number;
  cpuUsec?: number;
}

export interface SnaplabEvent {
  id: number;
  at: string;
  type: string;
  sandbox: string | null;
  name: string | null;
  reason: string | null;
  data: Record<string, unknown> | null;
}

// the daemon's own definitions (src/views.ts): a change there is a type error here
export type { Phase, TraceSummary as Trace } from '../../src/views';

const TYPES = [
  'created',
  'ready',
  'paused',
  'resumed',
  'stopped',
  'started',
  'exited',
  'destroyed',
  'failed',
  'timeout',
  'process.exited',
];

/**
 * The daemon's event stream. EventSource reconnects by itself and sends Last-Event-ID, so a
 * dropped connection loses nothing; `onOpen` tells the page to re-read what it shows.
 */
export function subscribe(
  onEvent: (e: SnaplabEvent) => void,
  onOpen?: (first: boolean) => void,
  onLost?: () => void,
): () => void {
  const src = new EventSource(streamUrl('/events'));
  const handler = (m: MessageEvent<string>): void => onEvent(JSON.parse(m.data) as SnaplabEvent);
  for (const t of TYPES) src.addEventListener(t, handler as EventListener);
  let opened = 0;
  src.addEventListener('open', () => onOpen?.(opened++ === 0));
  // a refused stream (the key removed, `snaplab ui` restarted) is not retried by the browser
  src.addEventListener('error', () => {
    if (src.readyState === EventSource.CLOSED) onLost?.();
  });
  return () => src.close();
}
