/**
 * The watchers envd's CreateWatcher makes (spec/envd/filesystem/filesystem.proto): each a watch of
 * the Lab API's `sandbox.watch` kept here, its events collected until GetWatcherEvents asks for
 * them, ended by RemoveWatcher or with its sandbox.
 */
import { Underway, forgottenMeanwhile } from './underway.js';
import { randomBytes } from 'node:crypto';
import type { SandboxApi, WatchEvent, WatchHandle } from '../sdk/api.js';
import { posix } from 'node:path';
import { noted, orElse } from '../cleanup.js';
import { ConnectError } from './connect.js';
import { entryOf } from './entries.js';
import type { IdNames } from './users.js';

/**
 * A watcher holds at most this many bytes of events not yet asked for (names, and entries counted
 * at ENTRY_BYTES each); past that it fails, as a full queue: a client that never asks holds at most
 * this much of the daemon's memory a watcher, whatever its sandbox does.
 */
const MAX_PENDING_BYTES = 4 << 20;
const EVENT_BYTES = 64;
const ENTRY_BYTES = 512;
/** With includeEntry, at most this many events wait for their entry's stat (the rest are sent without). */
const MAX_QUEUED = 1000;

/** What a watch's events hold of memory here, roughly. */
const sizeOf = (e: ReturnType<typeof eventOf>): number => EVENT_BYTES + e.name.length + (e.entry ? ENTRY_BYTES : 0);

/** An event as envd sends it (`entry`: with includeEntry, envd ≥ 0.6.3). */
export const eventOf = (e: WatchEvent, entry?: Record<string, unknown>) => ({
  name: e.name,
  type: `EVENT_TYPE_${e.type.toUpperCase()}`,
  ...(entry ? { entry } : {}),
});

/** What envd's WatchDirRequest and CreateWatcherRequest ask, as the front takes it. */
export interface WatchAsk {
  path: string;
  recursive: boolean;
  /** each create, write and chmod event carries the entry's EntryInfo (envd ≥ 0.6.3) */
  includeEntry: boolean;
  /** how an entry's owner and group are named */
  ids: IdNames;
}

/**
 * Read from a request's message: proto3 JSON names, camelCase or as in the .proto. A watch, and the
 * stat of an event's entry, run as root, as envd's do (its inotify is its own, root's).
 */
export function watchAsk(m: Record<string, unknown>, path: string, ids: IdNames): WatchAsk {
  return { path, recursive: m.recursive === true, includeEntry: (m.includeEntry ?? m.include_entry) === true, ids };
}

/**
 * The events of a watch as envd sends them, in the order they came. With includeEntry, a create,
 * write or chmod is sent with its entry, stat-ed when told (as envd does: gone by then, none; a
 * remove or rename never has one, the path's entry being another's by then). `flushed` resolves
 * once every event told so far is sent. At most MAX_QUEUED stats wait at once: an event that
 * comes while they do is sent without its entry, in its turn (a sandbox that changes files faster
 * than they can be stat-ed, one agent command each, would queue work and memory here without end).
 * `stop` drops what waits.
 */
export function envdEvents(
  box: SandboxApi,
  ask: WatchAsk,
  send: (e: ReturnType<typeof eventOf>) => void,
): { tell: (e: WatchEvent) => void; flushed: () => Promise<void>; stop: () => void } {
  let stopped = false;
  const stop = (): void => void (stopped = true);
  if (!ask.includeEntry) return { tell: (e) => stopped || send(eventOf(e)), flushed: async () => undefined, stop };
  let chain = Promise.resolve();
  let stats = 0;
  const entry = async (e: WatchEvent) => {
    const at = posix.join(ask.path, e.name);
    const info = await box.files.stat(at).catch(orElse(undefined, `stat ${at}`, 'FILE_NOT_FOUND'));
    return info && entryOf(info, ask.ids);
  };
  return {
    tell: (e) => {
      if (stopped) return;
      const stat = (e.type === 'create' || e.type === 'write' || e.type === 'chmod') && stats < MAX_QUEUED;
      if (stat) stats++;
      chain = chain.then(async () => {
        const info = stat && !stopped ? await entry(e) : undefined;
        if (stat) stats--;
        if (!stopped) send(eventOf(e, info));
      });
    },
    flushed: () => chain,
    stop,
  };
}

interface Watcher {
  sandbox: string;
  handle: WatchHandle;
  events: ReturnType<typeof eventOf>[];
  /** what `events` holds, roughly (sizeOf) */
  bytes: number;
  stop: () => void;
  error?: unknown;
}

/** The watchers CreateWatcher made, by id. */
export class Watchers {
  private readonly byId = new Map<string, Watcher>();
  private readonly underway = new Underway();

  async create(box: SandboxApi, ask: WatchAsk): Promise<string> {
    const w: Partial<Watcher> & { events: Watcher['events']; bytes: number } = {
      sandbox: box.id,
      events: [],
      bytes: 0,
    };
    const full = (e: ConnectError): void => {
      w.error ??= e;
      w.events = [];
      w.bytes = 0;
      events.stop();
    };
    const events = envdEvents(box, ask, (e) => {
      w.bytes += sizeOf(e);
      if (w.bytes <= MAX_PENDING_BYTES) w.events.push(e);
      else full(new ConnectError('resource_exhausted', `over ${MAX_PENDING_BYTES >> 20} MiB of events not asked for`));
    });
    w.stop = events.stop;
    const { value: handle, forgotten } = await this.underway.run(box.id, () =>
      box.watch(ask.path, { recursive: ask.recursive }, events.tell),
    );
    w.handle = handle;
    w.handle.done.catch((e: unknown) => void (w.error ??= e));
    if (forgotten) {
      // its sandbox was killed or stopped while the watch began: nothing is kept of it (forget)
      events.stop();
      await handle.close().catch(noted('close a watcher of a sandbox gone', 'SANDBOX_NOT_FOUND'));
      throw forgottenMeanwhile(box.id, 'the watch began');
    }
    const id = `w${randomBytes(8).toString('hex')}`;
    this.byId.set(id, w as Watcher);
    return id;
  }

  private of(box: SandboxApi, id: unknown): Watcher & { id: string } {
    const w = typeof id === 'string' ? this.byId.get(id) : undefined;
    if (!w || w.sandbox !== box.id) throw new ConnectError('not_found', `watcher with id ${String(id)} not found`);
    return { ...w, id: id as string };
  }

  /** Its events since the last ask (its error, once it failed). */
  take(box: SandboxApi, id: unknown): Watcher['events'] {
    const w = this.of(box, id);
    if (w.error) throw w.error;
    const kept = this.byId.get(w.id)!;
    kept.bytes = 0;
    return kept.events.splice(0);
  }

  async remove(box: SandboxApi, id: unknown): Promise<void> {
    const w = this.of(box, id);
    this.byId.delete(w.id);
    w.stop();
    await w.handle.close();
  }

  /** A sandbox gone: its watchers with it (their watches end with it). */
  forget(sandbox: string): void {
    this.underway.forget(sandbox);
    for (const [id, w] of this.byId)
      if (w.sandbox === sandbox) {
        this.byId.delete(id);
        w.stop();
        w.handle.close().catch(noted('close a watcher of a sandbox gone', 'SANDBOX_NOT_FOUND'));
      }
  }

  close(): void {
    for (const w of this.byId.values()) {
      w.stop();
      w.handle.close().catch(noted('close a watcher'));
    }
    this.byId.clear();
  }
}
