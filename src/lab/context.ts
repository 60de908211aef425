import { realpathSync } from 'node:fs';
import { resolve } from 'node:path';
import { SnaplabError } from '../errors.js';
import type { Availability } from '../host/probe-types.js';
import type { Driver } from '../drivers/driver.js';
import { DEFAULT_DRIVER } from '../defaults.js';
import { createDrivers, unknownDriver } from '../drivers/registry.js';
import { createBackend, pickDefault, type StorageBackend, type StorageKind } from '../storage/index.js';
import { openDb } from '../store/db.js';
import { Store } from '../store/store.js';
import type { TraceSummary } from '../timing/trace.js';
import { Trace } from '../timing/trace.js';
import { Images } from './images/images.js';

export { DEFAULT_HOME } from './home.js';
export const STORAGE_KINDS: readonly StorageKind[] = ['btrfs', 'overlay', 'dir'];

/** Everything the lab's operations share: the store, the drivers, the storage backends. */
export class LabContext {
  readonly store: Store;
  readonly images: Images;
  readonly drivers: Map<string, Driver>;
  private readonly backends = new Map<StorageKind, StorageBackend>();
  private readonly ready = new Map<StorageKind, Promise<void>>();
  private defaultKind: StorageKind | undefined;
  /** probe answers already had in this process (pickDefault probes on the way) */
  private readonly probed = new Map<StorageKind, Availability>();

  /** a daemon stands on this lab and ends sandboxes whose timeout passed (Lab.open's keepsTime) */
  keepsTime = false;

  /**
   * The home's one spelling, absolute with no link in it: host-wide objects name their home by its
   * path (the user namespace registry's claims, the cgroups), so `./lab`, `lab/` and a link to it
   * must be one home to every process, whatever its working directory.
   */
  readonly home: string;

  constructor(home: string) {
    if (process.getuid?.() !== 0) {
      throw new SnaplabError(
        'NOT_ROOT',
        'snaplab needs root: it makes namespaces, mounts and cgroups',
        'run it as root, e.g. `sudo snaplab ...`',
      );
    }
    const db = openDb(resolve(home)); // (which makes the directory)
    this.home = realpathSync(resolve(home));
    this.store = new Store(db);
    this.images = new Images(this.home, this.store);
    this.drivers = createDrivers(this.home);
  }

  /** The driver of that name (drivers/registry.ts), the default one when none is named. */
  driver(name: string = DEFAULT_DRIVER): Driver {
    const d = this.drivers.get(name);
    if (!d) throw unknownDriver(name);
    return d;
  }

  backend(kind: StorageKind): StorageBackend {
    if (!STORAGE_KINDS.includes(kind)) {
      throw new SnaplabError(
        'BAD_INPUT',
        `unknown storage ${JSON.stringify(kind)}`,
        `use one of: ${STORAGE_KINDS.join(', ')}`,
      );
    }
    let b = this.backends.get(kind);
    if (!b) this.backends.set(kind, (b = createBackend(kind, this.home)));
    return b;
  }

  /** The backend, probed and initialised once per process (pool mounted for btrfs); concurrent callers share the work. */
  async readyBackend(kind: StorageKind): Promise<StorageBackend> {
    const b = this.backend(kind);
    let ready = this.ready.get(kind);
    if (!ready) {
      ready = (async () => {
        const a = this.probed.get(kind) ?? (await b.probe());
        if (!a.ok)
          throw new SnaplabError(
            'STORAGE_UNAVAILABLE',
            `storage ${kind} does not work here: ${a.reason}`,
            a.fix ?? 'run `snaplab doctor`',
          );
        await b.init();
      })();
      this.ready.set(kind, ready);
      ready.catch(() => this.ready.delete(kind));
    }
    await ready;
    return b;
  }

  /** Probe and initialise again on next use (after gc unmounted the pool). */
  forgetReady(): void {
    this.ready.clear();
    this.probed.clear();
  }

  async defaultStorage(): Promise<StorageKind> {
    if (!this.defaultKind) {
      const choice = await pickDefault(this.home);
      for (const [k, a] of Object.entries(choice.probes)) this.probed.set(k as StorageKind, a);
      this.defaultKind = choice.kind;
    }
    return this.defaultKind;
  }

  /** Run `fn` under a trace that is stored whatever the outcome (principle 2). */
  async traced<T>(
    kind: string,
    target: string | null,
    fn: (t: Trace) => Promise<T>,
    details?: (r: T) => unknown,
  ): Promise<{ result: T; trace: TraceSummary }> {
    const trace = new Trace(kind, target);
    let result: T;
    try {
      result = await trace.within(() => fn(trace));
    } catch (e) {
      const summary = trace.finish(e);
      this.store.putOperation(summary);
      if (e instanceof SnaplabError || (e instanceof Error && 'operationId' in e))
        (e as Error & { operationId?: string }).operationId = summary.id;
      throw e;
    }
    const summary = trace.finish();
    this.store.putOperation(summary, details?.(result));
    return { result, trace: summary };
  }

  close(): void {
    this.store.db.close();
  }
}
