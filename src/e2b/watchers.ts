/**
 * The watchers envd's CreateWatcher makes (spec/envd/filesystem/filesystem.proto): each a watch of
 * the Lab API's `sandbox.watch` kept here, its events collected until GetWatcherEvents asks for
 * them, ended by RemoveWatcher or with its sandbox.
 */
import { randomBytes } from 'node:crypto';
import type { SandboxApi, WatchEvent, WatchHandle } from '../sdk/api.js';
import { posix } from 'node:path';
import { noted, orElse } from '../cleanup.js';
import { ConnectError } from './connect.js';
import { entryOf } from './entries.js';

/** A watcher holds at most this many events not yet asked for; past that it fails (as a full queue). */
const MAX_PENDING = 100_000;

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
  user: string | undefined;
}

/** Read from a request's message: proto3 JSON names, camelCase or as in the .proto. */
export function watchAsk(m: Record<string, unknown>, path: string, user: string | undefined): WatchAsk {
  return { path, recursive: m.recursive === true, includeEntry: (m.includeEntry ?? m.include_entry) === true, user };
}

/**
 * The events of a watch as envd sends them, in the order they came. With includeEntry, a create,
 * write or chmod is sent with its entry, stat-ed when told (as envd does: gone by then, none; a
 * remove or rename never has one, the path's entry being another's by then). `flushed` resolves
 * once every event told so far is sent.
 */
export function envdEvents(
  box: SandboxApi,
  ask: WatchAsk,
  send: (e: ReturnType<typeof eventOf>) => void,
): { tell: (e: WatchEvent) => void; flushed: () => Promise<void> } {
  if (!ask.includeEntry) return { tell: (e) => send(eventOf(e)), flushed: async () => undefined };
  let chain = Promise.resolve();
  const entry = async (e: WatchEvent) => {
    if (e.type !== 'create' && e.type !== 'write' && e.type !== 'chmod') return undefined;
    const at = posix.join(ask.path, e.name);
    const info = await box.files.stat(at, { user: ask.user }).catch(orElse(undefined, `stat ${at}`, 'FILE_NOT_FOUND'));
    return info && entryOf(info);
  };
  return {
    tell: (e) => {
      chain = chain.then(async () => send(eventOf(e, await entry(e))));
    },
    flushed: () => chain,
  };
}

interface Watcher {
  sandbox: string;
  handle: WatchHandle;
  events: ReturnType<typeof eventOf>[];
  error?: unknown;
}

/** The watchers CreateWatcher made, by id. */
export class Watchers {
  private readonly byId = new Map<string, Watcher>();

  async create(box: SandboxApi, ask: WatchAsk): Promise<string> {
    const w: Partial<Watcher> & { events: Watcher['events'] } = { sandbox: box.id, events: [] };
    const events = envdEvents(box, ask, (e) => {
      if (w.events.length < MAX_PENDING) w.events.push(e);
      else w.error ??= new ConnectError('resource_exhausted', `over ${MAX_PENDING} events not asked for`);
    });
    w.handle = await box.watch(ask.path, { recursive: ask.recursive, user: ask.user }, events.tell);
    w.handle.done.catch((e: unknown) => void (w.error ??= e));
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
    return this.byId.get(w.id)!.events.splice(0);
  }

  async remove(box: SandboxApi, id: unknown): Promise<void> {
    const w = this.of(box, id);
    this.byId.delete(w.id);
    await w.handle.close();
  }

  /** A sandbox gone: its watchers with it (their watches end with it). */
  forget(sandbox: string): void {
    for (const [id, w] of this.byId)
      if (w.sandbox === sandbox) {
        this.byId.delete(id);
        w.handle.close().catch(noted('close a watcher of a sandbox gone', 'SANDBOX_NOT_FOUND'));
      }
  }

  close(): void {
    for (const w of this.byId.values()) w.handle.close().catch(noted('close a watcher'));
    this.byId.clear();
  }
}
