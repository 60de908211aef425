/**
 * Who serves a sandbox's own calls (routes-sandboxes.ts, routes-egress.ts, routes-files.ts,
 * routes-streams.ts, routes-rpc.ts): a daemon itself, with its processes, rings, TTL clocks and exec quotas; a
 * cluster gateway by its RouteHost's `passToNode`, which hands each request to the node that holds
 * the sandbox. The routes (path, method, schema, scope) are registered once, for both: a body a
 * daemon refuses, a gateway refuses the same way before it passes anything on, and the two
 * servers' OpenAPI documents are made from the same schemas.
 */
import type { RouteHandlerMethod } from 'fastify';
import type { WebsocketHandler } from '@fastify/websocket';
import type { Daemon } from './daemon.js';
import type { PassToNode, RouteHost } from './served-lab.js';

/** The Daemon, or a host that passes a sandbox's calls on (a gateway's: cluster/gateway-host.ts). */
export type SandboxCalls = Daemon | (RouteHost & { passToNode: PassToNode });

/**
 * A route's handler: the daemon's own (`local`, made for it), or the host's passToNode with the
 * sandbox of the request's `:id` (none: /rpc, whose calls name their own).
 */
export function servedBy(s: SandboxCalls, local: (d: Daemon) => RouteHandlerMethod): RouteHandlerMethod {
  return 'passToNode' in s ? passed(s.passToNode, false) : local(s);
}

/**
 * A WebSocket route's handler: the daemon's own, or passToNode, which joins the upgrade to the
 * node's (a gateway's app has no WebSocket plugin: Fastify calls it as any route's handler).
 */
export function socketServedBy(s: SandboxCalls, local: (d: Daemon) => WebsocketHandler): WebsocketHandler {
  return 'passToNode' in s ? (passed(s.passToNode, true) as unknown as WebsocketHandler) : local(s);
}

function passed(pass: PassToNode, socket: boolean): RouteHandlerMethod {
  return (req, reply) => pass(req, reply, { sandbox: (req.params as { id?: string }).id ?? null, socket });
}
