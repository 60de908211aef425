/**
 * `GET /events` on a gateway: the cluster's events, read from etcd's own history. Each change of
 * a node's or a sandbox's entry is an event whose id is the store's revision, so a client may
 * reconnect to any gateway with `Last-Event-ID` (or `?after=`) and miss nothing: the watch
 * starts after that revision. One sandbox's stream (`?sandbox=`) is its node's.
 *
 *   node.joined, node.left (stopped on purpose), node.lost (its lease lapsed)
 *   created, destroyed, paused, resumed, stopped, started, exited, lost (its node lapsed)
 *   create.retried (a gateway placed a create again: its first node never got it)
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { IKeyValue } from 'etcd3';
import type { Caller } from '../server/keys.js';
import type { GatewayApi } from './gateway-api.js';
import type { SandboxEntry } from './store.js';
import { noted } from '../cleanup.js';

const SLOW_READER_BYTES = 1 << 20;

const STATE_EVENT: Record<string, string> = {
  running: 'resumed',
  paused: 'paused',
  dead: 'exited',
  lost: 'lost',
  forgotten: 'destroyed',
};

/** The event of a sandbox entry's change: a stopped machine is dead with its volume kept, and runs again `started`. */
function changeOf(was: SandboxEntry, e: SandboxEntry): string | undefined {
  if (e.state === 'dead' && e.stopped) return 'stopped';
  if (e.state === 'running' && was.stopped) return 'started';
  return STATE_EVENT[e.state];
}

export async function clusterEvents(
  g: Pick<GatewayApi, 'store' | 'view' | 'owns' | 'track'>,
  req: IncomingMessage,
  res: ServerResponse,
  caller: Caller,
): Promise<void> {
  const url = new URL(req.url!, 'http://x');
  const after = req.headers['last-event-id'] ?? url.searchParams.get('after');
  const from = typeof after === 'string' && /^\d+$/.test(after) ? after : undefined;
  const builder = g.store.client.watch().prefix(g.store.key('')).withPreviousKV();
  if (from) builder.startRevision(String(BigInt(from) + 1n));
  const watcher = await builder.create();
  // gone while the watch was made: nothing more to do for it
  if (res.destroyed || req.destroyed) return void watcher.cancel().catch(noted('cancel the event watch'));
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' });
  res.write(': snaplab cluster events\n\n');
  const leftSeen = new Set<string>();
  const send = (rev: string, type: string, data: Record<string, unknown>): void => {
    // a reader this far behind is let go: it resumes from its last id (Last-Event-ID) and misses nothing
    if (res.writableEnded) return;
    if (res.writableLength > SLOW_READER_BYTES) return void res.destroy();
    res.write(`id: ${rev}\nevent: ${type}\ndata: ${JSON.stringify({ id: Number(rev), type, ...data })}\n\n`);
  };
  const mine = (e: SandboxEntry): boolean => g.owns(caller, e);
  const change = (kv: IKeyValue, prev: IKeyValue | undefined, deleted: boolean): void => {
    const rest = kv.key.toString().slice(g.store.key('').length);
    const [kind, ...name] = rest.split('/');
    const id = name.join('/');
    const rev = kv.mod_revision;
    const at = new Date().toISOString();
    if (kind === 'left' && !deleted) leftSeen.add(id);
    else if (kind === 'nodes') {
      if (!deleted && !prev) send(rev, 'node.joined', { at, node: id });
      if (deleted) {
        const left = leftSeen.has(id) || g.view.left.has(id);
        send(rev, left ? 'node.left' : 'node.lost', {
          at,
          node: id,
          reason: left ? 'stopped' : 'its lease lapsed: it stopped answering',
        });
      }
    } else if (kind === 'sandboxes') {
      const e = JSON.parse((deleted ? prev : kv)?.value.toString() ?? 'null') as SandboxEntry | null;
      if (!e || !mine(e)) return;
      const base = { at, sandbox: e.id, name: e.name, node: e.node, data: { owner: e.owner } };
      // a forgotten one was told destroyed when its owner removed it: its tombstone's end is not news
      if (deleted) {
        if (e.state !== 'forgotten') send(rev, 'destroyed', { ...base, reason: null });
        return;
      }
      const was = prev ? (JSON.parse(prev.value.toString()) as SandboxEntry) : undefined;
      if (!was) send(rev, 'created', { ...base, reason: null });
      else if (was.state !== e.state || !was.stopped !== !e.stopped) {
        const type = changeOf(was, e);
        if (type) send(rev, type, { ...base, reason: e.reason ?? null });
      }
    } else if (kind === 'notes' && !deleted && caller.scopes.has('admin')) {
      const n = JSON.parse(kv.value.toString()) as { type: string };
      send(rev, n.type, { at, data: n });
    }
  };
  watcher.on('put', (kv, prev) => change(kv, prev, false));
  watcher.on('delete', (kv, prev) => change(kv, prev, true));
  watcher.on('error', (e: Error) => {
    clearInterval(ping);
    if (res.writableEnded) return;
    res.write(`event: error\ndata: ${JSON.stringify({ code: 'CLUSTER_UNAVAILABLE', message: e.message })}\n\n`);
    res.end();
  });
  const ping = setInterval(() => {
    if (!res.writableEnded) res.write(': ping\n\n');
  }, 15_000);
  const untrack = g.track(caller, () => res.destroy());
  res.once('close', () => {
    untrack();
    clearInterval(ping);
    void watcher.cancel().catch(noted('cancel the event watch'));
  });
}
