/**
 * `snaplab serve --node --cluster etcd://…`: the daemon joins a cluster. It keeps its NodeInfo
 * (capacity, sandboxes, each pool's ready standbys) under a lease it keeps alive, and writes
 * where each of its sandboxes lives. Stopping withdraws it (the lease is revoked); a node that
 * dies lapses with its lease and gateways mark its sandboxes `lost`. When it comes back, the
 * sandboxes declared lost meanwhile are destroyed here: their owners were told they were gone.
 */
import { statfs } from 'node:fs/promises';
import { setTimeout as sleepFor } from 'node:timers/promises';
import { cpus, freemem, totalmem } from 'node:os';
import type { Lease } from 'etcd3';
import { SnaplabError, isSnaplabError } from '../errors.js';
import type { SandboxApi } from '../sdk/api.js';
import type { Daemon } from '../server/daemon.js';
import type { EventRecord } from '../server/served-lab.js';
import { VERSION } from '../version.js';
import { HELD_STATES, unavailable, type ClusterStore, type NodeInfo, type SandboxEntry } from './store.js';
import { handledElsewhere, noted, orElse } from '../cleanup.js';

/**
 * How often a node compares every entry naming it with what it holds: a safety net (entries are
 * removed as sandboxes go), and a read of every sandbox entry, so not often.
 */
const SWEEP_MS = 300_000;
/**
 * How often the heartbeat compares every record with what it published; between, it reads the
 * store's changes since its last pass (Lab.changes: a relabel is one), so that beside 10 000 idle
 * sandboxes a heartbeat reads none (docs/benchmarks.md, "Density: the machine list and the node
 * at 10 000"). The full pass stays as a backstop for whatever the changes do not carry.
 */
const FULL_SYNC_MS = 60_000;

export interface NodeOptions {
  cluster: string;
  /** the node's name in the cluster (unique) */
  name: string;
  /** where gateways reach this daemon's TCP API */
  url: string;
  labels: Record<string, string>;
  /** seconds without a keep-alive before the node is out (default 10) */
  leaseTtlS?: number;
}

/** A sandbox the cluster routes to: not a pool's standby, nor one a pool run has borrowed. */
function routed(r: SandboxApi): boolean {
  if (r.state === 'creating' || r.state === 'removing') return false;
  return r.pool === null || r.owner !== null;
}

export class ClusterNode {
  private lease: Lease | undefined;
  /** what this node last wrote for each of its sandboxes (id → JSON) */
  private published = new Map<string, string>();
  private timer: NodeJS.Timeout | undefined;
  private soon: NodeJS.Timeout | undefined;
  private publishing: Promise<void> | undefined;
  private again = false;
  private closed = false;
  private readonly startedAt = Date.now();
  private lastGist = '';
  private lastPut = 0;
  /** the heartbeat (ms): the entry is rewritten at least this often */
  private every = 2000;
  /** sandboxes gone since the last sync (their entries go even if this process never wrote them) */
  private gone = new Map<string, string>();
  private lastSweep = Date.now();
  /** where the heartbeat's last pass read the store's changes to; undefined: every record next */
  private mark: number | undefined;
  private lastFull = 0;
  /** sandboxes events named since the last publish: each is read again alone, not the whole list */
  private named = new Set<string>();
  /** the heartbeat's publish compares every entry; an event's only those it named */
  private full = false;
  private readonly onEvent = (e: EventRecord): void => {
    if ((e.type === 'destroyed' || e.type === 'failed') && e.sandbox) this.gone.set(e.sandbox, e.name ?? '');
    if (e.sandbox) this.named.add(e.sandbox);
    this.schedule();
  };

  private constructor(
    readonly store: ClusterStore,
    readonly daemon: Daemon,
    readonly opts: Required<NodeOptions>,
    readonly token: string,
  ) {}

  /** Join with a store already open (its token is what this node's API accepts from gateways). */
  static async join(daemon: Daemon, store: ClusterStore, token: string, opts: NodeOptions): Promise<ClusterNode> {
    const node = new ClusterNode(store, daemon, { leaseTtlS: 10, ...opts }, token);
    await node.register();
    daemon.events.on('event', node.onEvent);
    node.every = Math.max(200, Math.min(2000, (node.opts.leaseTtlS * 1000) / 4));
    node.timer = setInterval(() => {
      node.full = true;
      node.schedule(0);
    }, node.every);
    node.timer.unref();
    return node;
  }

  get name(): string {
    return this.opts.name;
  }

  /**
   * Put NodeInfo under a new lease. The name is ours if nobody holds it, or if it was this home's
   * (its daemon is dead: this process holds the home's daemon lock). Then destroy what the cluster
   * declared lost while this node was away, and write what is here.
   */
  private async register(): Promise<void> {
    const key = this.store.key('nodes', this.name);
    const prior = (await this.store.client
      .get(key)
      .string()
      .catch((e: unknown) => {
        throw unavailable(e, 'reading the node list');
      })) as string | null;
    if (prior) {
      const was = JSON.parse(prior) as NodeInfo;
      if (was.home !== this.daemon.lab.home) {
        throw new SnaplabError(
          'NODE_EXISTS',
          `a node named ${this.name} is in the cluster already (home ${was.home}, ${was.url})`,
          'give this node another --node-name, or stop that one',
        );
      }
    }
    const lease = this.store.lease(this.opts.leaseTtlS);
    lease.on('lost', (e: Error) => {
      if (this.closed || this.lease !== lease) return;
      this.daemon.log({ msg: 'cluster lease lost; joining again', error: e.message });
      this.lease = undefined;
      // never rejects: each failed attempt is logged and tried again
      void this.rejoin();
    });
    // the lease is the node's only once all of this is done: a failure on the way revokes it, and
    // the next attempt (rejoin) does it all again, lost sandboxes included
    let joined = false;
    try {
      await lease.grant().catch((e: unknown) => {
        throw unavailable(e, 'granting the node lease');
      });
      const here = (await this.daemon.lab.list({ check: false })).filter(routed).length;
      await lease.put(key).value(JSON.stringify(await this.info(here)));
      await this.store.client.delete().key(this.store.key('left', this.name));
      await this.collectLost();
      // what the cluster says is here: entries of sandboxes gone meanwhile are removed by the sync
      this.published = new Map(
        (await this.store.sandboxes())
          .filter((e) => e.node === this.name && HELD_STATES.has(e.state))
          .map((e) => [e.id, JSON.stringify(e)]),
      );
      // a publish still under way (on the old lease) ends first (waited for 5 s at most: etcd may
      // be what is failing), and this pass compares every record: what etcd says may differ from
      // what this node published before it left
      if (this.publishing !== undefined)
        await Promise.race([this.publishing, sleepFor(5000, undefined, { ref: false })]);
      this.mark = undefined;
      await this.sync();
      joined = true;
    } finally {
      if (!joined) await lease.revoke().catch(noted("revoke the node's lease"));
    }
    this.lease = lease;
    this.daemon.log({
      msg: 'joined the cluster',
      node: this.name,
      url: this.opts.url,
      hosts: this.store.address.hosts,
    });
  }

  private async rejoin(): Promise<void> {
    for (let wait = 500; !this.closed && !this.lease; wait = Math.min(wait * 2, 5000)) {
      try {
        await this.register();
      } catch (e) {
        this.daemon.log({ msg: 'joining the cluster again failed; retrying', error: (e as Error).message, inMs: wait });
        await new Promise((r) => setTimeout(r, wait));
      }
    }
  }

  /**
   * The sandboxes gateways declared lost while this node was out: destroyed. A lost entry stays
   * (its owner removes it); a forgotten one (removed by its owner) goes once it is destroyed.
   */
  private async collectLost(): Promise<void> {
    for (const e of await this.store.sandboxes()) {
      if (e.node !== this.name || (e.state !== 'lost' && e.state !== 'forgotten')) continue;
      if (await this.holds(e.id)) {
        const ok = await this.daemon
          .destroy(e.id, `declared lost while node ${this.name} was out of the cluster (${e.reason ?? ''})`)
          .then(
            () => true,
            (err: Error) => {
              this.daemon.log({ msg: 'destroying a lost sandbox failed', sandbox: e.name, error: err.message });
              return false;
            },
          );
        if (!ok) continue;
      }
      if (e.state === 'forgotten') await this.store.client.delete().key(this.store.key('sandboxes', e.id));
    }
  }

  /** Is this sandbox (by id) here, as recorded? */
  private async holds(id: string): Promise<boolean> {
    return this.daemon.lab.get(id, { check: false }).then(
      (box) => box.id === id,
      (e: unknown) => {
        if (isSnaplabError(e, 'SANDBOX_NOT_FOUND')) return false;
        throw e;
      },
    );
  }

  /** What this node tells placement; `sandboxes`: how many it routes (what it has published, once synced). */
  async info(sandboxes = this.published.size): Promise<NodeInfo> {
    const lab = this.daemon.lab;
    const disk = await statfs(this.daemon.lab.home).catch(orElse(null, 'statfs', 'ENOENT'));
    const pools: NodeInfo['pools'] = {};
    for (const p of await this.daemon.lab.pools()) pools[p.name] = { image: p.image, size: p.target, ready: p.ready };
    return {
      name: this.name,
      url: this.opts.url,
      labels: this.opts.labels,
      version: VERSION,
      pid: process.pid,
      home: this.daemon.lab.home,
      startedAt: this.startedAt,
      updatedAt: Date.now(),
      capacity: {
        cores: cpus().length,
        memoryBytes: totalmem(),
        memoryFreeBytes: freemem(),
        diskBytes: disk ? disk.blocks * disk.bsize : 0,
        diskFreeBytes: disk ? disk.bavail * disk.bsize : 0,
      },
      sandboxes,
      pools,
      images: (await lab.images()).map((i) => i.name),
      snapshots: (await lab.snapshots()).map((s) => s.name),
      ...(await lab.capabilities()),
    };
  }

  /** Publish soon (coalesced): after an event, or on the heartbeat. */
  private schedule(ms = 50): void {
    if (this.closed || this.soon) return;
    this.soon = setTimeout(() => {
      this.soon = undefined;
      // never rejects: a failed publish is logged, and the next heartbeat publishes again
      void this.publish();
    }, ms);
  }

  /** NodeInfo and the sandbox entries, written now; never two at once. */
  publish(): Promise<void> {
    if (this.publishing !== undefined) {
      this.again = true;
      return this.publishing;
    }
    this.publishing = (async () => {
      do {
        this.again = false;
        const lease = this.lease;
        if (!lease || this.closed) return;
        try {
          // the heartbeat compares every entry; an event's publish reads only the sandboxes it named
          const full = this.full;
          const named = [...this.named];
          this.full = false;
          this.named.clear();
          try {
            await (full ? this.sync() : this.syncNamed(named));
          } catch (e) {
            this.full = true; // what was not written is compared on the next publish
            throw e;
          }
          // the entry is rewritten when what placement reads changed, or on the heartbeat
          const info = await this.info();
          const {
            updatedAt: _u,
            capacity: { memoryFreeBytes: _m, diskFreeBytes: _d, ...fixed },
            ...rest
          } = info;
          const gist = JSON.stringify({ rest, fixed });
          if (gist !== this.lastGist || Date.now() - this.lastPut >= this.every - 50) {
            await lease.put(this.store.key('nodes', this.name)).value(JSON.stringify(info));
            this.lastGist = gist;
            this.lastPut = Date.now();
          }
        } catch (e) {
          this.daemon.log({ msg: 'publishing to the cluster failed', error: (e as Error).message });
        }
      } while (this.again);
    })().finally(() => (this.publishing = undefined));
    return this.publishing;
  }

  /** The entry a routed sandbox has in the cluster. */
  private entryOf(r: SandboxApi): SandboxEntry {
    return {
      id: r.id,
      name: r.name,
      node: this.name,
      owner: r.owner,
      state: r.state as SandboxEntry['state'],
      image: r.image,
      labels: r.labels,
      createdAt: r.createdAt,
      reason: r.reason,
      ...(r.stopped ? { stopped: true } : {}),
    };
  }

  /**
   * An event's share of the sync: the entries of the sandboxes the events named, each read alone
   * (its record, not the list: the cost does not grow with the sandboxes here), then those gone.
   */
  private async syncNamed(ids: string[]): Promise<void> {
    for (const id of ids) {
      const box = await this.daemon.lab.get(id, { check: false }).catch((e: unknown) => {
        if (isSnaplabError(e, 'SANDBOX_NOT_FOUND')) return null;
        throw e;
      });
      await this.syncOne(id, box);
    }
    await this.dropGone((id) => this.published.has(id));
  }

  /** One sandbox's entry as its record now is (null: it is gone). */
  private async syncOne(id: string, box: SandboxApi | null): Promise<void> {
    const was = this.published.get(id);
    // being started again (a stopped one): the cluster keeps its entry as it was until it runs
    if (box && was !== undefined && box.state === 'creating') return;
    if (box && box.id === id && routed(box)) {
      const e = this.entryOf(box);
      const text = JSON.stringify(e);
      if (was === text) return;
      await this.store.putSandbox(e);
      this.published.set(id, text);
    } else if (was !== undefined) {
      await this.store.deleteSandbox(JSON.parse(was) as SandboxEntry);
      this.published.delete(id);
    }
  }

  /**
   * The heartbeat's pass: what changed in the store since the last one (each read as syncNamed
   * reads one), or, every FULL_SYNC_MS and first, every record compared (syncAll). The mark moves
   * only once the pass has written all it read: a failed one is read again.
   */
  private async sync(): Promise<void> {
    const full = this.mark === undefined || Date.now() - this.lastFull >= FULL_SYNC_MS;
    const c = await this.daemon.lab.changes(full ? undefined : this.mark);
    if (c.complete) {
      await this.syncAll(c.sandboxes);
      this.lastFull = Date.now();
    } else {
      for (const box of c.sandboxes) await this.syncOne(box.id, box);
      for (const id of c.removed) await this.syncOne(id, null);
      await this.dropGone((id) => this.published.has(id));
    }
    this.mark = c.mark;
  }

  /** Write each sandbox's entry that changed, remove those of sandboxes gone. */
  private async syncAll(all: SandboxApi[]): Promise<void> {
    const now = new Map<string, SandboxEntry>();
    for (const r of all) {
      const was = this.published.get(r.id);
      // being started again (a stopped one): its entry stays as it was until it runs (not destroyed, then created)
      if (r.state === 'creating' && was !== undefined) now.set(r.id, JSON.parse(was) as SandboxEntry);
      else if (routed(r)) now.set(r.id, this.entryOf(r));
    }
    for (const [id, e] of now) {
      const text = JSON.stringify(e);
      if (this.published.get(id) === text) continue;
      await this.store.putSandbox(e);
      this.published.set(id, text);
    }
    for (const [id, text] of [...this.published]) {
      if (now.has(id)) continue;
      await this.store.deleteSandbox(JSON.parse(text) as SandboxEntry);
      this.published.delete(id);
    }
    await this.dropGone((id) => now.has(id));
    // and every 5 minutes, every entry that says it is here and is not (whatever left it)
    if (Date.now() - this.lastSweep >= SWEEP_MS) {
      this.lastSweep = Date.now();
      for (const e of await this.store.sandboxes()) {
        if (e.node !== this.name || now.has(e.id) || !HELD_STATES.has(e.state)) continue;
        // asked of the store again: a create that ended since `now` was read has its entry already
        if (await this.holds(e.id)) continue;
        await this.store.deleteSandbox(e);
        this.published.delete(e.id);
      }
    }
  }

  /**
   * The entries of sandboxes gone before this node wrote them (a gateway wrote the entry; a create
   * and destroy within one publish).
   */
  private async dropGone(here: (id: string) => boolean): Promise<void> {
    for (const [id, name] of [...this.gone]) {
      this.gone.delete(id);
      if (here(id)) continue;
      const e = await this.store.sandbox(id);
      if (e && e.node === this.name && e.state !== 'lost' && e.state !== 'forgotten')
        await this.store.deleteSandbox({ id, name: e.name || name, node: this.name });
    }
  }

  /**
   * Withdraw: the node's entry goes with its lease. Its sandboxes stay recorded and keep running
   * on the host: gateways report them unreachable (not lost) until the node is back.
   */
  async leave(): Promise<void> {
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    if (this.soon) clearTimeout(this.soon);
    this.daemon.events.off('event', this.onEvent);
    await this.publishing?.catch(handledElsewhere);
    // "left" and the entry's removal in one transaction: gateways report its sandboxes
    // unreachable, not lost. If it cannot be said, the lease is left to lapse (and they are lost).
    const said = await this.store.client
      .if(this.store.key('nodes', this.name), 'Create', '>', 0)
      .then(
        this.store.client.put(this.store.key('left', this.name)).value(JSON.stringify({ at: Date.now() })),
        this.store.client.delete().key(this.store.key('nodes', this.name)),
      )
      .commit()
      .then(
        (r) => r.succeeded,
        () => false,
      );
    if (said) await this.lease?.revoke().catch(noted("revoke the node's lease"));
    else
      this.daemon.log({
        msg: 'could not tell the cluster this node is leaving: its sandboxes will be reported lost when its lease lapses',
      });
    this.lease?.release();
  }
}
