/**
 * The watchers envd's CreateWatcher makes (spec/envd/filesystem/filesystem.proto): each a watch of
 * the Lab API's `sandbox.watch` kept here, its events collected until GetWatcherEvents asks for
 * them, ended by RemoveWatcher or with its sandbox.
 */
import { randomBytes } from 'node:crypto';
import type { SandboxApi, WatchEvent, WatchHandle } from '../sdk/api.js';
import { noted } from '../cleanup.js';
import { ConnectError } from './connect.js';

/** A watcher holds at most this many events not yet asked for; past that it fails (as a full queue). */
const MAX_PENDING = 100_000;

/** An event as envd sends it. */
export const eventOf = (e: WatchEvent) => ({ name: e.name, type: `EVENT_TYPE_${e.type.toUpperCase()}` });

interface Watcher {
  sandbox: string;
  handle: WatchHandle;
  events: ReturnType<typeof eventOf>[];
  error?: unknown;
}

/** The watchers CreateWatcher made, by id. */
export class Watchers {
  private readonly byId = new Map<string, Watcher>();

  async create(box: SandboxApi, path: string, recursive: boolean, user: string | undefined): Promise<string> {
    const w: Partial<Watcher> & { events: Watcher['events'] } = { sandbox: box.id, events: [] };
    w.handle = await box.watch(path, { recursive, user }, (e) => {
      if (w.events.length < MAX_PENDING) w.events.push(eventOf(e));
      else w.error ??= new ConnectError('resource_exhausted', `over ${MAX_PENDING} events not asked for`);
    });
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
