/**
 * `GET /rpc` on a gateway: the client's calls, each sent on to the node that holds its sandbox
 * (exec) or that placement picks for it (a pool run), on one node connection per node and
 * client connection. Answers come back as the nodes give them. A node connection that closes
 * fails its calls still running with NODE_UNAVAILABLE; the client's closing closes them all, and
 * the nodes kill those commands, as a single daemon does.
 */
import WebSocket, { type RawData } from 'ws';
import { SnaplabError } from '../errors.js';
import type { Caller } from '../server/keys.js';
import { CALLER_HEADER } from '../server/keys.js';
import { asSnaplab, callerHeader, CONNECT_TIMEOUT_MS, neverConnected } from './proxy.js';
import type { ClusterCore } from './core.js';
import { handledElsewhere } from '../cleanup.js';

interface Upstream {
  ws: Promise<WebSocket>;
  /** call ids sent there and not answered */
  pending: Map<string, { pool?: string }>;
}

/**
 * The node connections of one client connection (in `ups`): the function gives a node's, made on
 * first use. Answers go to the client as they come; a node's close fails the calls it still had.
 */
function nodeConnections(
  g: ClusterCore,
  caller: Caller,
  client: WebSocket,
  ups: Map<string, Upstream>,
  fail: (id: unknown, e: SnaplabError) => void,
): (node: string) => Upstream {
  return (node: string): Upstream => {
    const had = ups.get(node);
    if (had) return had;
    const info = g.view.live(node);
    if (!info) {
      const gone = Promise.reject(
        new SnaplabError('NODE_UNAVAILABLE', `node ${node} is not up`, 'see `snaplab cluster nodes`'),
      );
      gone.catch(handledElsewhere);
      return { pending: new Map(), ws: gone };
    }
    const u: Upstream = { pending: new Map(), ws: undefined as unknown as Promise<WebSocket> };
    ups.set(node, u);
    u.ws = new Promise((resolve, reject) => {
      const ws = new WebSocket(`${info.url.replace(/^http/, 'ws')}/rpc`, {
        headers: { authorization: `Bearer ${g.token}`, [CALLER_HEADER]: callerHeader(caller) },
        maxPayload: 64 << 20,
        handshakeTimeout: CONNECT_TIMEOUT_MS,
      });
      ws.once('open', () => resolve(ws));
      ws.on('error', (e) => {
        if (ups.get(node) === u) ups.delete(node);
        reject(
          Object.assign(
            new SnaplabError(
              'NODE_UNAVAILABLE',
              `node ${node} did not answer: ${e.message}`,
              'see `snaplab cluster nodes`',
              { cause: e },
            ),
            { connect: neverConnected(e) },
          ),
        );
      });
      ws.on('message', (data: RawData) => {
        const text = String(data);
        let id: unknown;
        try {
          id = (JSON.parse(text) as { id?: unknown } | null)?.id;
        } catch {
          return;
        }
        const p = u.pending.get(JSON.stringify(id));
        u.pending.delete(JSON.stringify(id));
        if (p?.pool) g.runDone(node, p.pool);
        if (client.readyState === client.OPEN) client.send(text);
      });
      ws.once('close', () => {
        if (ups.get(node) === u) ups.delete(node);
        for (const [id, p] of u.pending) {
          if (p.pool) g.runDone(node, p.pool);
          fail(
            JSON.parse(id) as unknown,
            new SnaplabError(
              'NODE_UNAVAILABLE',
              `node ${node} closed the connection before the answer`,
              'its command was killed with it; try again',
            ),
          );
        }
        u.pending.clear();
      });
    });
    u.ws.catch(handledElsewhere);
    return u;
  };
}

export function relayRpc(g: ClusterCore, client: WebSocket, caller: Caller): void {
  const ups = new Map<string, Upstream>();
  let closed = false;
  const answer = (m: unknown): void => {
    if (client.readyState === client.OPEN) client.send(JSON.stringify(m));
  };
  const fail = (id: unknown, e: SnaplabError): void => answer({ id, error: e.toJSON() });
  const untrack = g.track(caller, () => client.close(1008, 'key removed'));

  const open = nodeConnections(g, caller, client, ups, fail);

  const send = async (node: string, id: unknown, text: string, pool?: string): Promise<void> => {
    const u = open(node);
    const ws = await u.ws;
    // the client went, or the node's socket closed, while it opened: nothing is sent
    if (closed) {
      ws.close();
      throw new SnaplabError('ABORTED', 'the client went before the call was sent');
    }
    if (ws.readyState !== ws.OPEN)
      throw new SnaplabError('NODE_UNAVAILABLE', `node ${node} closed the connection`, 'try again');
    u.pending.set(JSON.stringify(id), { pool });
    ws.send(text);
  };

  client.on('message', (data: RawData, isBinary: boolean) => {
    const text = String(data);
    let call: { id?: unknown; op?: string; sandbox?: unknown; pool?: unknown };
    try {
      if (isBinary) throw new SyntaxError('a binary frame');
      const v = JSON.parse(text) as unknown;
      if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new SyntaxError('not an object');
      call = v as typeof call;
      // the id names its answer: a call without one could never be answered (nor its node's answer matched)
      if (typeof call.id !== 'string' && typeof call.id !== 'number')
        throw new SyntaxError('no id (a string or a number)');
    } catch (e) {
      return fail(
        null,
        new SnaplabError('BAD_INPUT', `rpc: not a JSON object: ${(e as Error).message}`, 'send JSON text frames', {
          cause: e,
        }),
      );
    }
    void (async () => {
      if (!g.stillValid(caller)) {
        client.close(1008, 'key removed');
        throw new SnaplabError(
          'UNAUTHORIZED',
          'the API key is not known (any more)',
          'make a new one with `snaplab key create NAME --cluster …`',
        );
      }
      if (call.op === 'run' && typeof call.pool === 'string') {
        // a run that never reached its node is placed again once, elsewhere
        const tried = new Set<string>();
        for (;;) {
          const node = await g.placeRun(call.pool, tried);
          try {
            return await send(node, call.id, text, call.pool);
          } catch (e) {
            g.runDone(node, call.pool);
            if (!(e as { connect?: boolean }).connect || tried.size) throw e;
            tried.add(node);
          }
        }
      }
      if (call.op === 'exec' && typeof call.sandbox === 'string')
        return send(await g.nodeOf(call.sandbox, caller), call.id, text);
      // anything else: the first node says what is wrong with it
      const any = [...g.view.nodes.keys()][0];
      if (!any)
        throw new SnaplabError(
          'NODE_UNAVAILABLE',
          'no node is in the cluster',
          'start a node: `snaplab serve --node --cluster …`',
        );
      return send(any, call.id, text);
    })().catch((e: unknown) => fail(call.id ?? null, asSnaplab(e)));
  });
  // a bad frame (unmasked, not UTF-8, too large): ws closes the socket after telling us
  client.on('error', () => client.terminate());
  client.once('close', () => {
    closed = true;
    untrack();
    for (const u of ups.values())
      void u.ws.then(
        (ws) => ws.close(),
        () => undefined,
      );
  });
}
