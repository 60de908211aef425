/**
 * A gateway's copy of the cluster's state: one etcd watch over the whole prefix keeps it current
 * (nodes, drains, sandboxes, names, keys), so routing and placement read memory, not the store.
 * The watch starts before the first read: changes made between them arrive after it, in order,
 * and leave the copy as the store is.
 *
 * It also decides what a node's disappearance means: a node whose entry went without saying it
 * was leaving (its lease lapsed) has its sandboxes marked `lost`, once, by whichever gateway
 * gets there first (a compare-and-set in the store).
 */
import { EventEmitter } from 'node:events';
import type { IKeyValue, Watcher } from 'etcd3';
import {
  HELD_STATES,
  type ClusterStore,
  type CreateClaim,
  type KeyEntry,
  type NameEntry,
  type NodeInfo,
  type SandboxEntry,
} from './store.js';
import { noted } from '../cleanup.js';

const HELD = HELD_STATES;

export class ClusterView extends EventEmitter {
  readonly nodes = new Map<string, NodeInfo>();
  readonly drained = new Set<string>();
  readonly left = new Set<string>();
  readonly sandboxes = new Map<string, SandboxEntry>();
  readonly names = new Map<string, NameEntry>();
  readonly creates = new Map<string, CreateClaim>();
  private readonly keysByHash = new Map<string, KeyEntry>();
  private watcher: Watcher | undefined;
  private lostSweep: Promise<void> = Promise.resolve();

  constructor(
    readonly store: ClusterStore,
    private readonly log: (line: Record<string, unknown>) => void,
  ) {
    super();
    this.setMaxListeners(0);
  }

  /**
   * Read everything, then watch from the revision of that read: every change after it arrives,
   * in order, and none before it. Also how the copy starts again when etcd ends the watch (its
   * history compacted past us after a long partition): keys removed meanwhile are told of, and
   * nodes gone meanwhile lapse.
   */
  async start(): Promise<void> {
    const all = await this.store.client.getAll().prefix(this.store.key('')).exec();
    const keysBefore = new Set(this.keysByHash.keys());
    for (const m of [this.nodes, this.sandboxes, this.names, this.creates, this.keysByHash]) m.clear();
    this.drained.clear();
    this.left.clear();
    for (const kv of all.kvs) this.apply(kv, false, true);
    for (const h of keysBefore) if (!this.keysByHash.has(h)) this.emit('keyRemoved', h);
    const w = await this.store.watch('', all.header.revision);
    if (this.closed) return void w.cancel().catch(noted('cancel the cluster watch'));
    this.watcher = w;
    w.on('put', (kv) => this.apply(kv, false));
    w.on('delete', (kv) => this.apply(kv, true));
    w.on('error', (e: Error) => {
      if (this.closed || this.watcher !== w) return;
      this.log({ msg: 'cluster watch ended; reading the cluster again', error: e.message });
      void w.cancel().catch(noted('cancel the cluster watch'));
      this.watcher = undefined;
      const again = (): void => {
        if (this.closed) return;
        void this.start().catch((err: Error) => {
          this.log({ msg: 'reading the cluster again failed; retrying', error: err.message });
          setTimeout(again, 2000).unref();
        });
      };
      again();
    });
    // nodes that lapsed while nobody watched (each once)
    const lapsed = new Set<string>();
    for (const e of this.sandboxes.values())
      if (HELD.has(e.state) && !this.nodes.has(e.node) && !this.left.has(e.node)) lapsed.add(e.node);
    for (const n of lapsed) this.nodeLapsed(n);
  }

  private apply(kv: IKeyValue, deleted: boolean, initial = false): void {
    const rest = kv.key.toString().slice(this.store.key('').length);
    const slash = rest.indexOf('/');
    const kind = slash < 0 ? rest : rest.slice(0, slash);
    const id = slash < 0 ? '' : rest.slice(slash + 1);
    const value = deleted ? undefined : kv.value.toString();
    switch (kind) {
      case 'nodes': {
        const had = this.nodes.get(id);
        if (value) this.nodes.set(id, JSON.parse(value) as NodeInfo);
        else this.nodes.delete(id);
        // gone without saying it was leaving: its lease lapsed
        if (!initial && had && !value && !this.left.has(id)) this.nodeLapsed(id);
        break;
      }
      case 'drain':
        if (value) this.drained.add(id);
        else this.drained.delete(id);
        break;
      case 'left':
        if (value) this.left.add(id);
        else this.left.delete(id);
        break;
      case 'sandboxes':
        if (value) this.sandboxes.set(id, JSON.parse(value) as SandboxEntry);
        else this.sandboxes.delete(id);
        break;
      case 'names':
        if (value) this.names.set(id, JSON.parse(value) as NameEntry);
        else this.names.delete(id);
        break;
      case 'creates':
        if (value) this.creates.set(id, JSON.parse(value) as CreateClaim);
        else this.creates.delete(id);
        break;
      case 'keys': {
        for (const [h, k] of this.keysByHash) {
          if (k.name !== id) continue;
          this.keysByHash.delete(h);
          this.emit('keyRemoved', h);
        }
        if (value) {
          const k = JSON.parse(value) as KeyEntry;
          this.keysByHash.set(k.hash, k);
        }
        break;
      }
    }
  }

  /** A node's entry went with its lease: its sandboxes are lost (each gateway tries; one succeeds). */
  private nodeLapsed(node: string): void {
    const reason = `its node ${node} stopped answering: its cluster lease lapsed at ${new Date().toISOString()}`;
    this.lostSweep = this.lostSweep.then(async () => {
      const marked = await this.store.markLost(node, reason).catch((e: Error) => {
        this.log({ msg: "marking a lapsed node's sandboxes lost failed", node, error: e.message });
        return [];
      });
      this.log({ msg: 'node lapsed: its sandboxes are lost', node, sandboxes: marked.map((m) => m.name) });
    });
  }

  keyByHash(hash: string): KeyEntry | undefined {
    return this.keysByHash.get(hash);
  }

  /** A node that is up and takes work. */
  live(name: string): NodeInfo | undefined {
    return this.nodes.get(name);
  }

  /** The entry of a sandbox by id or name (a create in flight has a name entry only). */
  resolve(idOrName: string): { entry?: SandboxEntry; node: string } | undefined {
    const byId = this.sandboxes.get(idOrName);
    // a forgotten one (a lost record its owner removed) is gone, as far as anyone asks
    if (byId?.state === 'forgotten') return undefined;
    if (byId) return { entry: byId, node: byId.node };
    const n = this.names.get(idOrName);
    if (!n) return undefined;
    const entry = n.id ? this.sandboxes.get(n.id) : undefined;
    return { entry, node: entry?.node ?? n.node };
  }

  /** Sandboxes recorded on each node, and creates placed there and not yet recorded. */
  load(): Map<string, number> {
    const load = new Map<string, number>();
    for (const e of this.sandboxes.values()) if (HELD.has(e.state)) load.set(e.node, (load.get(e.node) ?? 0) + 1);
    for (const c of this.creates.values()) load.set(c.node, (load.get(c.node) ?? 0) + 1);
    return load;
  }

  /** A key's sandboxes in the cluster: recorded and held, and (unless `held`) creates in flight. */
  owned(key: string, held = false): number {
    let n = 0;
    for (const e of this.sandboxes.values()) if (e.owner === key && HELD.has(e.state)) n++;
    if (!held) for (const c of this.creates.values()) if (c.owner === key) n++;
    return n;
  }

  private closed = false;

  async close(): Promise<void> {
    this.closed = true;
    await this.watcher?.cancel().catch(noted('cancel the cluster watch'));
    await this.lostSweep;
  }
}
