/**
 * envd's watches (spec/envd/filesystem/filesystem.proto) on the Lab API's `sandbox.watch` (inotify
 * inside the machine): WatchDir streams a directory's events as they happen (a start event once
 * the watch holds, keepalives, each change), ended by the client, its deadline, or the sandbox's
 * end; CreateWatcher, GetWatcherEvents and RemoveWatcher keep a watch here whose events are
 * collected until asked for.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { WatchEvent, WatchHandle } from '../sdk/api.js';
import { noted } from '../cleanup.js';
import { ConnectError, deadlineOf, keepaliveMs, kindChecked, openStream, readBody, unenvelope } from './connect.js';
import { absolute } from './files.js';
import type { Unary } from './envd.js';
import { EnvdUnavailable, FROM_MEMORY, sendError, type E2bState } from './state.js';
import { envdEvents, watchAsk } from './watchers.js';

/** A WatchDir client this far behind (its events written, not read) is let go: its watch ends. */
const MAX_UNREAD = 4 << 20;

/** WatchDir: the watch first (a path not there ends the stream with not_found before a start), then its events. */
async function watchDir(state: E2bState, req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply | undefined> {
  const pending: WatchEvent[] = [];
  let send = (e: WatchEvent): void => void pending.push(e);
  let handle: WatchHandle;
  let events: ReturnType<typeof envdEvents>;
  let stream: ReturnType<typeof openStream> | undefined;
  // a client gone while the watch started: its watch is closed once it holds
  let gone = false;
  reply.raw.on('close', () => void (gone = true));
  try {
    const box = await state.envdSandbox(req);
    const m = unenvelope(await readBody(req.body)) as Record<string, unknown>;
    const user = await state.actAs(box, req);
    const ask = watchAsk(m, absolute(m.path, user), user.ids);
    // told only once the stream is open (the events before it wait in pending)
    events = envdEvents(box, ask, (e) => {
      stream?.send({ filesystem: e });
      // a client that does not read would have its events held here without end
      if (stream && stream.unread > MAX_UNREAD) stream.drop();
    });
    handle = await box.watch(ask.path, { recursive: ask.recursive }, (e) => send(e));
  } catch (err) {
    // a file watched as a directory: invalid_argument, as envd
    const e = kindChecked(state.unavailable(req, err));
    // a stream's error is its end-of-stream message (Connect reads an HTTP status as the transport's)
    if (e instanceof EnvdUnavailable) return sendError(reply, e);
    openStream(reply).end(e);
    return undefined;
  }
  if (gone) {
    handle.close().catch(noted('close a watch whose client went', 'SANDBOX_NOT_FOUND'));
    return undefined;
  }
  const out = openStream(reply);
  stream = out;
  out.send({ start: {} });
  send = events.tell;
  for (const e of pending) send(e);
  const every = keepaliveMs(req.headers['keepalive-ping-interval']);
  const keepalive = setInterval(() => out.send({ keepalive: {} }), every);
  const deadline = deadlineOf(req.headers['connect-timeout-ms']);
  const expiry = deadline
    ? setTimeout(() => out.end(new ConnectError('deadline_exceeded', 'the watch ran past its timeout')), deadline)
    : undefined;
  const stop = (): void => {
    events.stop();
    clearInterval(keepalive);
    clearTimeout(expiry);
    handle.close().catch(noted('close a watch', 'SANDBOX_NOT_FOUND'));
  };
  out.onClose(stop);
  // the stream ends after the events told before the watch ended
  handle.done.then(
    () => events.flushed().then(() => out.end()),
    (e: unknown) => events.flushed().then(() => out.end(e)),
  );
  return undefined;
}

export function registerWatches(app: FastifyInstance, state: E2bState, unary: Unary): void {
  const F = '/filesystem.Filesystem';
  app.post(`${F}/WatchDir`, (req, reply) => watchDir(state, req, reply));
  app.post(
    `${F}/CreateWatcher`,
    unary(state, async (box, m, req) => {
      const user = await state.actAs(box, req);
      const ask = watchAsk(m, absolute(m.path, user), user.ids);
      return { watcherId: await state.watchers.create(box, ask).catch((e: unknown) => Promise.reject(kindChecked(e))) };
    }),
  );
  app.post(
    `${F}/GetWatcherEvents`,
    unary(state, async (box, m) => ({ events: state.watchers.take(box, m.watcherId) }), FROM_MEMORY),
  );
  app.post(
    `${F}/RemoveWatcher`,
    unary(state, async (box, m) => {
      await state.watchers.remove(box, m.watcherId);
      return {};
    }),
  );
}
