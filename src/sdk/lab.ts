import { noted } from '../cleanup.js';
import { alternatives, checkList } from './paging.js';
import { STOPPED_REASONS } from '../lab/lifecycle/stopped.js';
import { checkRangeSize } from '../host/userns/registry.js';
import { LabContext } from '../lab/context.js';
import { envHome } from '../lab/home.js';
import { collectGarbage } from '../lab/lifecycle/gc.js';
import { imageVolume } from '../lab/images/volume.js';
import { withDefaults } from '../lab/lifecycle/limits.js';
import { raiseSandbox } from '../lab/lifecycle/raise.js';
import { definePool, getPool, poolStats, type PoolSpec, type PoolStats } from '../lab/pools/admin.js';
import { PoolRunner } from '../lab/pools/runner.js';
import { runOnce, withImageConfig, type RunOutcome, type RunSpec } from '../lab/pools/run.js';
import { destroyRecord } from '../lab/lifecycle/teardown.js';
import { Pool } from './pool.js';
import { Scenario } from './scenario.js';
import { getScenario } from '../scenario/down.js';
import { upScenario, type UpOptions } from '../scenario/up.js';
import { reconcile } from '../lab/lifecycle/reconcile.js';
import { sandboxKey } from '../lab/names.js';
import { checkLabels, noMeta, updateMeta } from '../lab/meta.js';
import { checkSandboxes, reconcileUnsettled, storedTraces } from '../lab/lifecycle/check.js';
import { thawOrphans } from '../lab/lifecycle/inflight.js';
import type { ImportOptions } from '../image/import.js';
import type { DebianSpec } from '../image/debian.js';
import type { BuildOptions, Built } from '../lab/images/build.js';
import { removeImage, removeSnapshot, sandboxNotFound, snapshotNotFound } from '../lab/lifecycle/removals.js';
import type { StorageKind, Volume } from '../storage/backend.js';
import type {
  EventRecord,
  ImageRecord,
  Limits,
  OnTimeout,
  SandboxMeta,
  SandboxRecord,
  SessionRows,
} from '../store/records.js';
import type { SandboxQuery, WatchMark } from '../store/store.js';
import type { TraceSummary } from '../timing/trace.js';
import { checkKeepsTime, Sandbox } from './sandbox.js';
import type {
  BufferOutput,
  CheckResult,
  CountOptions,
  EgressRequest,
  LabApi,
  LabCreateOptions,
  ListOptions,
  SandboxCount,
  StoredTrace,
  TraceQuery,
  CallerInfo,
} from './api.js';
import { encoded, type Text } from './output.js';
import type { ConnectOptions } from '../client/http.js';
import type { RemoteLab } from '../client/remote.js';
import { Snapshot } from './snapshot.js';
import { KeyRing, SCOPES } from '../lab/keys.js';
import { NO_CEILINGS, heldBy, type Owned } from '../lab/ceilings.js';
import { diskUsage, type DiskUsage } from '../lab/disk-usage.js';
import { machineInit, resolveCreate, resolveEgress } from './create-options.js';
import { egressTotals, sweepEgress } from '../lab/net/egress.js';
import { buildTemplate, resolveImage, underBuildLock } from '../lab/images/templates.js';
import { templateRecipe, TEMPLATES } from '../image/templates.js';
import { isSnaplabError, SnaplabError } from '../errors.js';
import { DEFAULT_DRIVER, DEFAULT_IMAGE, DEFAULT_ON_TIMEOUT } from '../defaults.js';

export type RunOptions = RunSpec & { pool?: string; image?: string; storage?: StorageKind; limits?: Limits };

export interface LabOptions {
  /** where state, images and volumes live; default $SNAPLAB_HOME or /var/lib/snaplab */
  home?: string;
  /**
   * @internal the daemon: it keeps the clocks of sandboxes' timeouts (and ends them), so this lab
   * takes `timeoutS`; without it a timeout is refused (nothing would end the sandbox)
   */
  keepsTime?: boolean;
}

/** What changed among a lab's sandboxes since a mark (Lab.changes). */
export interface SandboxChanges {
  /** pass it as `since` next time */
  mark: number;
  /** every sandbox was read (no mark, or one too old to tell from): one not among them is gone */
  complete: boolean;
  sandboxes: Sandbox[];
  /** ids of those removed since the mark (or asked for again and gone) */
  removed: string[];
}

/** The name a daemon's event log keeps its place in the changes under (Store.watchMark). */
const JOURNAL_WATCH = 'events';

/** Who made a sandbox and how long it lives: the daemon's callers, given to the lab it stands on. */
export interface Lifetime {
  /** the API key that made it ('local': the Unix socket) */
  owner?: string;
  timeoutS?: number;
  onTimeout?: OnTimeout;
}

/** What `create` takes: the options both libraries share (sdk/api.ts), and an AbortSignal. */
export interface CreateOptions extends LabCreateOptions, Lifetime {
  signal?: AbortSignal;
}

export interface RestoreOptions extends Lifetime {
  labels?: Record<string, string>;
  metadata?: Record<string, string>;
  name?: string;
  limits?: Limits;
  signal?: AbortSignal;
  /** as in CreateOptions */
  userns?: boolean;
  /** as in CreateOptions; default: the size of the snapshot's sandbox */
  ids?: number;
  /** as in CreateOptions (a snapshot carries none) */
  egress?: boolean | EgressRequest;
}

/**
 * The entry point of the library: `const lab = await Lab.open()`.
 * Every lifecycle call is traced; `lab.trace(id)` returns a stored trace.
 */
export class Lab implements LabApi {
  private readonly runners = new Map<string, PoolRunner>();
  /** pools this Lab is removing: holdPools leaves them be */
  private readonly removing = new Set<string>();

  private constructor(private readonly ctx: LabContext) {}

  /** Open the lab at `home` (state in SQLite there). Needs root. */
  static async open(opts: LabOptions = {}): Promise<Lab> {
    const ctx = new LabContext(opts.home ?? envHome());
    ctx.keepsTime = opts.keepsTime === true;
    return new Lab(ctx);
  }

  /**
   * The same library over a daemon's API (`snaplab serve`): `url` is http://HOST:PORT (with a
   * `token`) or unix:/path/to/daemon.sock; default $SNAPLAB_HOST and $SNAPLAB_TOKEN.
   */
  static async connect(opts: ConnectOptions = {}): Promise<RemoteLab> {
    const { RemoteLab } = await import('../client/remote.js');
    const lab = new RemoteLab(opts);
    await lab.health();
    return lab;
  }

  get home(): string {
    return this.ctx.home;
  }

  /** Create a sandbox; resolves once a command has executed inside it. */
  async create(opts: CreateOptions & { diskAsked?: boolean | 'server' } = {}): Promise<Sandbox> {
    const c = resolveCreate(opts);
    this.checkLifetime(c);
    const labels = checkLabels('label', opts.labels);
    const metadata = checkLabels('metadata', opts.metadata);
    if (c.from === 'pool') return this.takeStandby(c.pool, { labels, metadata, ...lifetimeMeta(opts) });
    // a caller past the types (JavaScript, a daemon's body) may ask for a snapshot: a restore
    if (c.from === 'snapshot') return this.restore(c.snapshot, { ...opts, limits: c.limits, egress: c.egress });
    const { result, trace } = await this.ctx.traced('create', opts.name ?? null, async (t) => {
      const storage = c.storage ?? (await t.phase('pick storage', () => this.ctx.defaultStorage()));
      const img = await t.phase('resolve image', () => resolveImage(this.ctx, c.image, opts.onProgress));
      const base = (): Promise<Volume> => imageVolume(this.ctx, img.name, storage, t);
      return raiseSandbox(
        this.ctx,
        {
          name: opts.name,
          image: img.name,
          storage,
          driver: c.driver,
          limits: c.limits,
          // (a server's: its key's default cap is not asked for; undefined: as limits says)
          ...(opts.diskAsked !== undefined ? { diskAsked: opts.diskAsked } : {}),
          base,
          origin: null,
          userns: c.userns,
          ...(c.ids !== undefined ? { ids: c.ids } : {}),
          ...(c.egress ? { egress: c.egress } : {}),
          // the image's own systemd boots unless the caller says --init agent (where a system machine can run)
          init: machineInit(c, img.provenance?.init),
        },
        t,
        opts.signal,
      );
    });
    const life = lifetimeMeta(opts);
    if (opts.labels || opts.metadata || Object.keys(life).length)
      updateMeta(this.ctx, result.record.id, { labels, metadata, ...life });
    return new Sandbox(this.ctx, result.record, result.agent, trace);
  }

  /** A timeout needs a clock that ends it: the daemon's (keepsTime). */
  private checkLifetime(o: Lifetime): void {
    if (o.timeoutS) checkKeepsTime(this.ctx);
  }

  /** A ready standby of the pool, with these labels, metadata and lifetime (checked before the take). */
  private async takeStandby(pool: string, meta: Partial<SandboxMeta>): Promise<Sandbox> {
    const box = await this.pool(pool).take();
    updateMeta(this.ctx, box.id, meta);
    return box;
  }

  /** A new running sandbox whose filesystem is the snapshot's. */
  async restore(snapshot: string, opts: RestoreOptions & { diskAsked?: boolean | 'server' } = {}): Promise<Sandbox> {
    this.checkLifetime(opts);
    const labels = checkLabels('label', opts.labels);
    const metadata = checkLabels('metadata', opts.metadata);
    const egress = resolveEgress(opts.egress);
    const { result, trace } = await this.ctx.traced('restore', opts.name ?? null, async (t) => {
      const snap = this.ctx.store.getSnapshot(snapshot);
      if (!snap) throw snapshotNotFound(this.ctx, snapshot);
      // (an asked size is checked as a create's is: NaN or 0 is refused, never read as "none")
      const ids = opts.ids !== undefined ? checkRangeSize(opts.ids) : opts.userns === false ? null : snap.ids;
      return raiseSandbox(
        this.ctx,
        {
          name: opts.name,
          image: snap.image,
          storage: snap.storage,
          driver: snap.memory?.driver ?? snap.driver ?? DEFAULT_DRIVER,
          // a memory snapshot continues a machine of a fixed size: its limits come with it
          // (the snapshot's disk cap is carried unless another is given)
          limits:
            opts.limits && !snap.memory
              ? withDefaults({
                  ...(snap.limits.diskBytes !== undefined ? { diskBytes: snap.limits.diskBytes } : {}),
                  ...opts.limits,
                })
              : snap.limits,
          // the snapshot's cap is carried as a default: held where it can be, dropped where not
          diskAsked: opts.diskAsked ?? opts.limits?.diskBytes !== undefined,
          base: async () => snap.volume,
          origin: snap.name,
          memory: snap.memory ?? undefined,
          userns: opts.userns,
          // the size of the sandbox it was taken of, unless another is asked
          ...(ids != null ? { ids } : {}),
          ...(egress ? { egress } : {}),
          ...(snap.init ? { init: snap.init } : {}),
        },
        t,
        opts.signal,
      );
    });
    const life = lifetimeMeta(opts);
    if (opts.labels || opts.metadata || Object.keys(life).length)
      updateMeta(this.ctx, result.record.id, { labels, metadata, ...life });
    return new Sandbox(this.ctx, result.record, result.agent, trace);
  }

  /** The sandbox with this id or name, its state reconciled with the host. */
  async get(idOrName: string, opts: { check?: boolean } = {}): Promise<Sandbox> {
    // SCENARIO/MACHINE names a scenario machine (its sandbox is SCENARIO.MACHINE)
    const rec = this.ctx.store.getSandbox(sandboxKey(idOrName));
    if (!rec) throw sandboxNotFound(this.ctx, idOrName);
    return new Sandbox(this.ctx, opts.check === false ? rec : await reconcile(this.ctx, rec));
  }

  /**
   * Every sandbox, reconciled: one whose processes are gone is reported dead, with the reason.
   * The filters (`labels`, `owner`, `metadata`, `state`, `createdSince`), `order`, `check`,
   * `limit` and `after`: see ListOptions. The filters and the page are read from the store in one
   * query (only the page's rows), and only the page is checked against the host. Each sandbox's
   * labels and lifetime are as this list read them (with its state), until it changes them itself
   * or is refreshed.
   */
  async list(opts: ListOptions = {}): Promise<Sandbox[]> {
    const after = checkList(opts);
    const rows = this.ctx.store.pageSandboxes({
      ...queryOf(opts),
      ...(opts.order ? { order: opts.order } : {}),
      ...(after ? { after } : {}),
      ...(opts.limit !== undefined ? { limit: opts.limit } : {}),
    });
    const listed = (r: SandboxRecord, meta: SandboxMeta | null): Sandbox =>
      new Sandbox(this.ctx, r, undefined, undefined, meta ?? noMeta(r.id));
    if (opts.check === false) return rows.map((r) => listed(r.record, r.meta));
    await thawOrphans(this.ctx);
    return Promise.all(rows.map(async (r) => listed(await reconcile(this.ctx, r.record), r.meta)));
  }

  /** How many a list with these filters gives, by state, counted in the store (LabApi.count). */
  async count(opts: CountOptions = {}): Promise<SandboxCount> {
    checkList(opts);
    if (opts.check !== false) await reconcileUnsettled(this.ctx, true);
    return this.ctx.store.countSandboxes(queryOf(opts), STOPPED_REASONS);
  }

  /** A check pass (see LabApi.check): what `snaplab serve` runs on its tick. */
  async check(opts: { reconciled?: boolean; quick?: boolean } = {}): Promise<CheckResult> {
    return checkSandboxes(this.ctx, opts);
  }

  /** The drivers this lab has and the storage it picks: what a cluster node tells placement. */
  async capabilities(): Promise<{ drivers: string[]; storage: StorageKind[] }> {
    return { drivers: [...this.ctx.drivers.keys()], storage: [await this.ctx.defaultStorage()] };
  }

  async snapshots(): Promise<Snapshot[]> {
    return this.ctx.store.listSnapshots().map((r) => new Snapshot(r));
  }

  async snapshot(name: string): Promise<Snapshot> {
    const r = this.ctx.store.getSnapshot(name);
    if (!r) throw snapshotNotFound(this.ctx, name);
    return new Snapshot(r);
  }

  async removeSnapshot(name: string): Promise<TraceSummary> {
    return (await this.ctx.traced('snapshot rm', name, (t) => removeSnapshot(this.ctx, name, t))).trace;
  }

  async images(): Promise<ImageRecord[]> {
    return this.ctx.store.listImages();
  }

  /** A rootfs tarball or directory, a `docker save` tarball, or an OCI image layout (directory or tarball). */
  async importImage(source: string, name: string, opts: ImportOptions = {}): Promise<ImageRecord> {
    return (await this.ctx.traced('image import', name, () => this.ctx.images.import(source, name, opts))).result;
  }

  /**
   * Get ready ahead of time, so that nothing is fetched at run time: the image (built-in busybox
   * by default), and for the VM driver its guest kernel (apt) and initramfs.
   */
  async prepare(
    opts: { driver?: string; image?: string } = {},
    onProgress?: (s: string) => void,
  ): Promise<{ image: string; vm?: { version: string; kernel: string; initramfs: string } }> {
    const driver = this.ctx.driver(opts.driver ?? DEFAULT_DRIVER);
    const image = opts.image ?? DEFAULT_IMAGE;
    onProgress?.(`image ${image}`);
    const img = await resolveImage(this.ctx, image, onProgress);
    if (!driver.prepareHost) return { image: img.name };
    return { image: img.name, vm: await driver.prepareHost(onProgress) };
  }

  /** Make sure an image exists (builds the built-in busybox image and the built-in templates on first use). */
  async image(name: string, onProgress?: (s: string) => void): Promise<ImageRecord> {
    return resolveImage(this.ctx, name, onProgress);
  }

  /** Build a built-in template (`base`, `code-interpreter-v1`: src/image/templates.ts) under its name. */
  async buildTemplate(name: string, opts: Omit<BuildOptions, 'name'> = {}): Promise<Built> {
    const recipe = templateRecipe(name);
    if (!recipe)
      throw new SnaplabError(
        'BAD_INPUT',
        `no built-in template named ${JSON.stringify(name)}`,
        `built-in templates: ${TEMPLATES.map((t) => t.name).join(', ')}; or \`snaplab image build debian --packages …\``,
      );
    // after a first use's build of it, if one is under way: then a cache hit (or --rebuild's own)
    return underBuildLock(this.ctx, name, () => buildTemplate(this.ctx, recipe, opts));
  }

  /** Build a Debian image with mmdebstrap (cached by its inputs; see docs/images.md). */
  async buildImage(spec: DebianSpec, opts: BuildOptions = {}): Promise<Built> {
    const { buildDebian } = await import('../lab/images/build.js');
    return (await this.ctx.traced('image build', opts.name ?? spec.suite, (t) => buildDebian(this.ctx, spec, opts, t)))
      .result;
  }

  /** Remove an image; `force` removes the sandboxes and snapshots that use it first (their names are returned). */
  async removeImage(name: string, opts: { force?: boolean } = {}): Promise<{ removed: string[]; trace: TraceSummary }> {
    const r = await this.ctx.traced('image rm', name, (t) => removeImage(this.ctx, name, t, opts.force));
    return { removed: r.result, trace: r.trace };
  }

  /** What the sandboxes made with this key hold: their count and limits (lab/ceilings.ts heldBy), a key's rows only. */
  async held(owner: string): Promise<Owned> {
    return heldBy(this.ctx.store.ownedLimits(owner, STOPPED_REASONS));
  }

  /**
   * Does a disk cap hold for a machine of this driver on this storage (the default where none is
   * named)? What a key's disk ceilings stand on (server/ceilings.ts): where none holds (btrfs on
   * Linux before 6.7), a key's sandbox is made without one rather than refused.
   */
  async diskCapHolds(driver?: string, storage?: StorageKind): Promise<boolean> {
    if (!this.ctx.driver(driver).capabilities.rootIsVolumeTree) return false;
    const b = await this.ctx.readyBackend(storage ?? (await this.ctx.defaultStorage()));
    return b.limitDisk !== undefined && (b.diskCapOff?.() ?? null) === null;
  }

  /** How many snapshots this key's sandboxes have (its snapshots ceiling), by the owner's index. */
  async ownedSnapshots(owner: string): Promise<number> {
    return this.ctx.store.countSnapshotsOf(owner);
  }

  /** Every machine's egress counters summed (a server's metrics): how many have egress, bytes out, connections, refusals. */
  async egressTotals(): Promise<{ machines: number; bytesOut: number; connections: number; denied: number }> {
    return egressTotals(this.ctx);
  }
  /**
   * Flows the host's connection table keeps of this home's egress router that the router ended
   * (docs/egress.md "Flows"), removed: a daemon does it every minute. Returns how many went.
   */
  sweepEgress(): Promise<number> {
    return sweepEgress(this.ctx);
  }

  /** Remove every snaplab host object no live record owns; the list of what was removed is stored with the trace. */
  async gc(): Promise<{ removed: string[]; notes: string[]; trace: TraceSummary }> {
    const { result, trace } = await this.ctx.traced(
      'gc',
      null,
      (t) => collectGarbage(this.ctx, t),
      (r) => r,
    );
    return { ...result, trace };
  }

  /** Disk use per sandbox, snapshot and image (`snaplab df`); a volume its backend cannot measure has an error. */
  async diskUsage(): Promise<DiskUsage[]> {
    return diskUsage(this.ctx);
  }

  async trace(operationId: string): Promise<StoredTrace | undefined> {
    return this.ctx.store.getOperation(operationId);
  }

  /** Stored traces, newest first (a number: the limit). */
  async traces(query: TraceQuery | number = {}): Promise<StoredTrace[]> {
    return storedTraces(this.ctx, typeof query === 'number' ? { limit: query } : query);
  }

  /** Define a pool of paused standbys and raise them (`size` of them) before returning. */
  async createPool(spec: PoolSpec, onProgress?: (ready: number, target: number) => void): Promise<Pool> {
    await definePool(this.ctx, spec);
    const pool = this.pool(spec.name);
    try {
      await pool.fill(onProgress);
    } catch (e) {
      // a pool whose standbys cannot be raised (an image without what --warm needs) is not left behind
      await pool.remove().catch(noted(`remove pool ${spec.name}`));
      throw e;
    }
    return pool;
  }

  /** An existing pool; this Lab holds one runner per pool name. */
  pool(name: string): Pool {
    getPool(this.ctx, name);
    let runner = this.runners.get(name);
    if (!runner) this.runners.set(name, (runner = new PoolRunner(this.ctx, name)));
    return new Pool(this.ctx, runner, () => {
      this.runners.delete(name);
      this.removing.add(name);
      return () => this.removing.delete(name);
    });
  }

  /**
   * Keep every pool of the home at its target from this process (a daemon does, at its start and
   * on its tick): pools another process defined since, too (`snaplab pool create` without
   * SNAPLAB_HOST beside a running daemon). Starting one already held does nothing.
   */
  holdPools(): void {
    const live = new Set(this.ctx.store.listPools().map((p) => p.name));
    for (const name of live) {
      if (this.removing.has(name)) continue;
      try {
        this.pool(name).start();
      } catch (e) {
        // removed since the list was read: nothing to hold
        if (!isSnaplabError(e, 'POOL_NOT_FOUND')) throw e;
      }
    }
    // a pool another process removed: its runner here stops (its timer, its reaper, its connections)
    for (const [name, runner] of this.runners)
      if (!live.has(name)) {
        this.runners.delete(name);
        void runner.close();
      }
  }

  async pools(): Promise<PoolStats[]> {
    return Promise.all(this.ctx.store.listPools().map((p) => poolStats(this.ctx, p.name)));
  }

  /** The embedded lab acts for whoever opened the home: 'local', every scope, no quota, no ceiling. */
  async whoami(): Promise<CallerInfo> {
    return { key: 'local', scopes: [...SCOPES], maxSandboxes: null, maxExecs: null, ceilings: { ...NO_CEILINGS } };
  }

  /**
   * Run argv in a fresh sandbox and return its result: from a pool (`pool`), or raised for this
   * execution and destroyed after (`image`, default busybox).
   */
  async run(argv: string[], opts: RunOptions & BufferOutput): Promise<RunOutcome & { trace: TraceSummary }>;
  async run(argv: string[], opts?: RunOptions): Promise<Text<RunOutcome> & { trace: TraceSummary }>;
  async run(argv: string[], opts: RunOptions = {}): Promise<(RunOutcome | Text<RunOutcome>) & { trace: TraceSummary }> {
    if (opts.pool !== undefined)
      return this.pool(opts.pool)
        .run(argv, { ...opts, encoding: 'buffer' })
        .then((r) => ({ ...encoded(r, opts.encoding), trace: r.trace }));
    ({ argv, spec: opts } = withImageConfig(this.ctx, opts.image ?? DEFAULT_IMAGE, argv, opts));
    const { result, trace } = await this.ctx.traced('run', opts.image ?? DEFAULT_IMAGE, (t) =>
      runOnce(
        this.ctx,
        async () => {
          const box = await this.create({ image: opts.image, storage: opts.storage, limits: opts.limits });
          return { record: box.info as SandboxRecord, agent: await box.agentConnection() };
        },
        async (r) => destroyRecord(this.ctx, r),
        argv,
        opts,
        t,
      ),
    );
    return { ...encoded(result, opts.encoding), trace };
  }

  /**
   * Raise a scenario file: networks, machines in parallel, provisioning, start steps, readiness.
   * A failure removes everything it made unless `keepOnFailure`.
   */
  async up(file: string, opts: UpOptions = {}): Promise<Scenario> {
    // the parser (yaml, zod) is loaded by the commands that read scenario files, not by every one
    const { loadScenario } = await import('../scenario/parse.js');
    const loaded = await loadScenario(file);
    const { result, trace } = await this.ctx.traced('up', opts.name ?? loaded.spec.name ?? null, (t) =>
      upScenario(this.ctx, loaded, opts, t),
    );
    return new Scenario(this.ctx, result.name, trace);
  }

  /** A scenario that is up. */
  scenario(name: string): Scenario {
    getScenario(this.ctx, name);
    return new Scenario(this.ctx, name);
  }

  scenarios(): Scenario[] {
    return this.ctx.store.listScenarios().map((s) => new Scenario(this.ctx, s.name));
  }

  /** The API keys of this home's daemon (`snaplab key`): only their hashes are kept. */
  get keys(): KeyRing {
    return new KeyRing(this.ctx.store);
  }

  /** @internal the event journal a daemon on this home keeps (`GET /events`), in the home's store */
  get journal(): {
    append(e: Omit<EventRecord, 'id'>): EventRecord;
    after(id: number, limit?: number): EventRecord[];
    lastId(): number;
    watched(): WatchMark | undefined;
    setWatched(m: WatchMark): void;
  } {
    const store = this.ctx.store;
    return {
      append: (e) => store.appendEvent(e),
      after: (id, n) => store.eventsAfter(id, n),
      lastId: () => store.lastEventId(),
      watched: () => store.watchMark(JOURNAL_WATCH),
      setWatched: (m) => store.setWatchMark(JOURNAL_WATCH, m),
    };
  }

  /**
   * @internal what a server's tick reads instead of every record: the sandboxes whose record
   * changed since `since` (a mark this gave before; undefined: every sandbox, `complete`), and
   * those of `again` however they are, as listed (check: false); the ids of those removed; the
   * mark to pass next time (Store.sandboxChanges).
   */
  async changes(since: number | undefined, again: readonly string[] = []): Promise<SandboxChanges> {
    const c = this.ctx.store.sandboxChanges(since, again);
    return {
      mark: c.mark,
      complete: c.complete,
      sandboxes: c.rows.map(
        (r) => new Sandbox(this.ctx, r.record, undefined, undefined, r.meta ?? noMeta(r.record.id)),
      ),
      removed: c.removed,
    };
  }

  /** @internal the sandboxes whose timeout's clock ended by `by` (ms since the epoch), as listed: a server's tick */
  async expired(by: number): Promise<Sandbox[]> {
    return this.ctx.store
      .expiredSandboxes(by)
      .map((r) => new Sandbox(this.ctx, r.record, undefined, undefined, r.meta ?? noMeta(r.record.id)));
  }

  /** @internal the rows a daemon's E2B front keeps its sessions in (sealed by it: src/e2b/sessions.ts) */
  get e2bSessions(): SessionRows {
    const store = this.ctx.store;
    return {
      list: () => store.listE2bSessions(),
      put: (id, sealed) => store.putE2bSession(id, sealed),
      delete: (id) => store.deleteE2bSession(id),
    };
  }

  /** @internal for the CLI's doctor and bench */
  get context(): LabContext {
    return this.ctx;
  }

  close(): void {
    for (const r of this.runners.values()) void r.stop();
    this.ctx.close();
  }

  [Symbol.dispose](): void {
    this.close();
  }
}

/** The meta a lifetime sets: its owner, and a clock running from now when it has a timeout. */
function lifetimeMeta(o: Lifetime): Partial<SandboxMeta> {
  return {
    ...(o.owner !== undefined ? { owner: o.owner } : {}),
    ...(o.timeoutS !== undefined ? { timeoutS: o.timeoutS, onTimeout: o.onTimeout ?? DEFAULT_ON_TIMEOUT } : {}),
    ...(o.timeoutS ? { expiresAt: Date.now() + o.timeoutS * 1000 } : {}),
  };
}

/** A list's filters as the store reads them (its page aside). */
function queryOf(opts: CountOptions): SandboxQuery {
  return {
    ...(opts.labels ? { labels: opts.labels } : {}),
    ...(opts.owner !== undefined ? { owner: opts.owner } : {}),
    ...(opts.metadata
      ? { metadata: Object.fromEntries(Object.entries(opts.metadata).map(([k, v]) => [k, alternatives(v)])) }
      : {}),
    ...(opts.state ? { state: opts.state, stoppedReasons: STOPPED_REASONS } : {}),
    ...(opts.createdSince !== undefined ? { createdSince: opts.createdSince } : {}),
  };
}
