/**
 * The scope each call of the daemon's API needs, in one table: the routes get theirs from it (the
 * `onRoute` hook of server/app.ts), and the keyed lab that the in-process fronts (E2B, MCP) stand
 * on checks each of its calls by the route that does the same (`scopeOf`), so a route and its
 * keyed call cannot come to need different scopes. A route the table does not name fails the
 * server's start, but for a hidden GET (the dashboard's built files, /healthz, /openapi.json),
 * which needs no key. A route that names its own `config.scope` fails too: it is written here.
 */
import type { Scope } from '../store/records.js';

export const ROUTE_SCOPES = {
  'GET /whoami': 'read',
  'GET /events': 'read',
  'GET /metrics': 'read',
  'GET /usage': 'read',
  'POST /check': 'admin',
  'GET /operations': 'read',
  'GET /operations/:id': 'read',
  'GET /traces': 'read',
  'GET /traces/:id': 'read',
  'GET /bench': 'read',
  'GET /bench/:name': 'read',
  'GET /rpc': 'exec',
  'POST /mcp': 'exec',
  'GET /mcp': 'read',
  'DELETE /mcp': 'read',
  'GET /cluster/nodes': 'read',

  'POST /sandboxes': 'exec',
  'GET /sandboxes': 'read',
  'GET /counts/sandboxes': 'read',
  'GET /sandboxes/:id': 'read',
  'PATCH /sandboxes/:id': 'exec',
  'DELETE /sandboxes/:id': 'exec',
  'POST /sandboxes/:id/pause': 'exec',
  'POST /sandboxes/:id/resume': 'exec',
  'POST /sandboxes/:id/stop': 'exec',
  'POST /sandboxes/:id/start': 'exec',
  'POST /sandboxes/:id/timeout': 'exec',
  'POST /sandboxes/:id/snapshots': 'exec',
  'GET /sandboxes/:id/usage': 'read',
  'GET /sandboxes/:id/egress': 'read',
  'PUT /sandboxes/:id/egress': 'exec',
  'POST /sandboxes/:id/exec': 'exec',
  'GET /sandboxes/:id/exec': 'exec',
  'POST /sandboxes/:id/processes': 'exec',
  'GET /sandboxes/:id/processes': 'read',
  'GET /sandboxes/:id/processes/:pid': 'read',
  'DELETE /sandboxes/:id/processes/:pid': 'exec',
  'GET /sandboxes/:id/processes/:pid/attach': 'exec',
  'GET /sandboxes/:id/processes/:pid/output': 'read',
  'POST /sandboxes/:id/processes/:pid/signal': 'exec',
  'POST /sandboxes/:id/processes/:pid/stdin': 'exec',
  'GET /sandboxes/:id/files': 'read',
  'PUT /sandboxes/:id/files': 'exec',
  'DELETE /sandboxes/:id/files': 'exec',
  'GET /sandboxes/:id/files/list': 'read',
  'GET /sandboxes/:id/files/stat': 'read',
  'POST /sandboxes/:id/files/mkdir': 'exec',
  'POST /sandboxes/:id/files/move': 'exec',
  'GET /sandboxes/:id/archive': 'read',
  'PUT /sandboxes/:id/archive': 'exec',

  'GET /snapshots': 'read',
  'GET /snapshots/:name': 'read',
  'DELETE /snapshots/:name': 'exec',

  'GET /pools': 'read',
  'POST /pools': 'admin',
  'GET /pools/:name': 'read',
  'PATCH /pools/:name': 'admin',
  'DELETE /pools/:name': 'admin',
  'POST /pools/:name/run': 'exec',
  'GET /pools/:name/takes': 'read',

  'GET /images': 'read',
  'POST /images/import': 'admin',
  'POST /images/build': 'admin',
  'DELETE /images/:name': 'admin',

  'GET /scenarios': 'read',
  'POST /scenarios': 'admin',
  'GET /scenarios/:name': 'read',
  'DELETE /scenarios/:name': 'admin',
  'POST /scenarios/:name/net': 'admin',
  'POST /scenarios/:name/reset': 'admin',
  'POST /scenarios/:name/snapshot': 'admin',

  'GET /keys': 'admin',
  'POST /keys': 'admin',
  'DELETE /keys/:name': 'admin',
} as const satisfies Record<string, Scope>;

/** A route of the API, as `METHOD /path` with Fastify's `:param`s. */
export type Route = keyof typeof ROUTE_SCOPES;

/** The scope a route needs (and the keyed call that does what it does). */
export function scopeOf(route: Route): Scope {
  return ROUTE_SCOPES[route];
}

/**
 * The scope of a route being registered (`methods` as Fastify gives them; a HEAD is its GET's), or
 * undefined where the table does not name it: such a route must be marked public (`config.public`,
 * checked when the server is ready: `publicOrFail`). A route that writes its own scope, or whose
 * methods the table gives different scopes, is an error that says where its scope is written.
 */
export function registeredScope(methods: string | string[], url: string, ownScope: unknown): Scope | undefined {
  const where = `route ${[methods].flat().join(',')} ${url}`;
  if (ownScope !== undefined)
    throw new Error(`${where} names its own scope: a route's scope is written in server/scopes.ts (ROUTE_SCOPES)`);
  const named = [...new Set([methods].flat().map((m) => (m === 'HEAD' ? 'GET' : m)))];
  const scopes = new Set(named.map((m) => (ROUTE_SCOPES as Record<string, Scope>)[`${m} ${url}`]));
  if (scopes.size > 1) throw new Error(`${where}: its methods have different scopes in server/scopes.ts`);
  return [...scopes][0];
}

/**
 * A route the table does not name, once every hook has had its say: it needs no key only where it
 * is marked public (/healthz, /openapi.json, the dashboard's built files), never a WebSocket or a
 * route with a parameter; anything else fails the server's start, so a route added without its
 * scope is never open to every caller.
 */
export function publicOrFail(r: {
  method: string | string[];
  url?: string;
  websocket?: boolean;
  config?: { public?: boolean };
}): void {
  const where = `route ${[r.method].flat().join(',')} ${r.url ?? ''}`;
  if (r.config?.public !== true)
    throw new Error(`${where} has no scope in server/scopes.ts (ROUTE_SCOPES): add it there, or mark it config.public`);
  if (r.websocket || (r.url ?? '').includes(':'))
    throw new Error(`${where} is marked public, but a WebSocket or a route with a parameter never is: give it a scope`);
}
