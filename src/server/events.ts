/**
 * The event log behind `GET /events`: created, ready, paused, resumed, stopped, started, exited,
 * destroyed, failed, timeout, each with the sandbox, a reason and an id that only grows. Kept in the store, so a
 * client resumes with Last-Event-ID across a daemon restart. What the daemon does it records as
 * it does it; what other processes do (the CLI, the library) a watcher finds in what changed in
 * the store since it looked last (Lab.changes), once a second, and records with the reason it can give.
 */
import { EventEmitter } from 'node:events';
import type { EventJournal, EventRecord } from './served-lab.js';
import type { WatchMark } from '../store/store.js';
import { END_EVENTS, STATE_EVENTS } from '../store/records.js';

type SandboxState = 'creating' | 'running' | 'paused' | 'dead' | 'removing';

/** A sandbox as the log is told of it (a SandboxApi is one): `owner` the key that made it, if known. */
export interface Told {
  id: string;
  name?: string | null;
  owner?: string | null;
}

/** What the watcher reads of each sandbox (as Lab.changes gives it, the records as they stand). */
export interface Watched extends Told {
  name: string;
  state: string;
  reason: string | null;
  pool: string | null;
  /** dead by a stop, its filesystem kept (SandboxApi.stopped) */
  stopped?: boolean;
}

/** What the log tells: a sandbox's state (STATE_EVENTS), its end (END_EVENTS), and two that change neither. */
export type EventType = (typeof STATE_EVENTS)[number] | (typeof END_EVENTS)[number] | 'timeout' | 'process.exited';

/** The state each state-telling event leaves a sandbox in (the journal keeps each sandbox's newest). */
const TOLD: Record<(typeof STATE_EVENTS)[number], SandboxState> = {
  created: 'running',
  ready: 'running',
  resumed: 'running',
  started: 'running',
  paused: 'paused',
  exited: 'dead',
  stopped: 'dead',
};
const told = (type: string): SandboxState | undefined =>
  (STATE_EVENTS as readonly string[]).includes(type) ? TOLD[type as keyof typeof TOLD] : undefined;
const ends = (type: string): boolean => (END_EVENTS as readonly string[]).includes(type);

/** What a state the watcher finds means as an event. */
const STATE_EVENT: Partial<Record<SandboxState, EventType>> = { running: 'resumed', paused: 'paused', dead: 'exited' };

/** What a change the watcher finds means: a stop and a start are told as such, not as an exit and a resume. */
function changeEvent(was: SandboxState, r: Watched): EventType {
  if (r.state === 'dead' && r.stopped) return 'stopped';
  if (r.state === 'running' && was === 'dead') return 'started';
  return STATE_EVENT[r.state as SandboxState]!;
}

export class EventLog extends EventEmitter {
  /** the state of each sandbox as the log last told it */
  private readonly known = new Map<string, SandboxState>();
  private readonly names = new Map<string, string>();
  /** the key that made each sandbox, kept past its record: a key is told of its own sandboxes' ends */
  private readonly owners = new Map<string, string>();
  /** names of sandboxes the daemon is making now: the watcher leaves them to it */
  readonly making = new Set<string>();
  /** ids the daemon is changing now (destroy, pause, resume): the watcher leaves them to it */
  readonly busy = new Set<string>();
  /** pool standbys the daemon is taking now: one the watcher finds taken is left to it */
  taking = 0;
  /** where the watcher got to, as last kept in the journal */
  private kept: WatchMark | undefined;

  constructor(private readonly journal: EventJournal) {
    super();
    this.setMaxListeners(0);
    // what the log said last about each sandbox: a restart does not announce them again, and one
    // removed while no daemon ran is reported gone
    for (const e of this.replay()) {
      if (!e.sandbox) continue;
      if (e.name) this.names.set(e.sandbox, e.name);
      if (typeof e.data?.owner === 'string') this.owners.set(e.sandbox, e.data.owner);
      const state = told(e.type);
      if (ends(e.type)) {
        this.known.delete(e.sandbox);
        this.owners.delete(e.sandbox);
      } else if (state) this.known.set(e.sandbox, state);
    }
  }

  private *replay(): Generator<EventRecord> {
    for (let after = 0; ; ) {
      const batch = this.journal.after(after, 1000);
      if (!batch.length) return;
      yield* batch;
      after = batch.at(-1)!.id;
    }
  }

  record(
    type: EventType,
    sandbox: Told | null,
    reason: string | null,
    data: Record<string, unknown> | null = null,
  ): EventRecord {
    const name = sandbox ? (sandbox.name ?? this.names.get(sandbox.id) ?? null) : null;
    // a sandbox's owner, once it has one, is for good (its key's): known, it is not read again
    // (a read of its record, on every command's end event)
    const owner = sandbox ? (this.owners.get(sandbox.id) ?? sandbox.owner ?? null) : null;
    if (sandbox && owner) this.owners.set(sandbox.id, owner);
    const e = this.journal.append({
      at: Date.now(),
      type,
      sandbox: sandbox?.id ?? null,
      name,
      reason,
      data: owner ? { ...data, owner } : data,
    });
    if (sandbox) {
      if (name) this.names.set(sandbox.id, name);
      const state = told(type);
      if (ends(type)) {
        this.known.delete(sandbox.id);
        this.names.delete(sandbox.id);
        this.owners.delete(sandbox.id);
      } else if (state) this.known.set(sandbox.id, state);
    }
    this.emit('event', e);
    return e;
  }

  /** Note who owns a sandbox before its record goes (its `destroyed` event is then its owner's). */
  remember(box: Told): void {
    if (box.owner) this.owners.set(box.id, box.owner);
  }

  /** Where the watcher got to in the lab's changes when the log was last kept (a restart reads on from there). */
  watchedTo(): WatchMark | undefined {
    return (this.kept = this.journal.watched());
  }

  /**
   * Compare what changed (Lab.changes: the records read, every one when `complete`, a known
   * sandbox not among them then gone; the ids removed) with what was last told; record what
   * changed behind the daemon's back, then keep where the log got to. Those it leaves to the daemon
   * for now (being made, changed or taken here) are kept with it: the next pass reads them again,
   * changed or not. Returns where to read on from.
   */
  watch(changes: { mark: number; complete: boolean; sandboxes: Watched[]; removed: readonly string[] }): WatchMark {
    const again: string[] = [];
    const seen = new Set<string>();
    for (const r of changes.sandboxes) {
      seen.add(r.id);
      // standbys of a pool are not anyone's sandboxes until taken (pool runs use them unseen); a
      // create or a removal ends in a change of state, read then
      if (r.pool !== null || r.state === 'creating' || r.state === 'removing') continue;
      // a standby a create here is taking: out of its pool, its owner not yet set (the create
      // records it when it returns); another sandbox without an owner is told of on a later pass
      if (this.making.has(r.name) || this.busy.has(r.id) || (this.taking && !this.known.has(r.id) && !r.owner)) {
        again.push(r.id);
        continue;
      }
      const was = this.known.get(r.id);
      if (was === undefined) {
        this.record('created', r, 'made outside the daemon');
        if (r.state !== 'running') this.record(STATE_EVENT[r.state as SandboxState]!, r, r.reason);
      } else if (was !== r.state) {
        this.record(changeEvent(was, r), r, r.reason ?? (r.pool ? `pool ${r.pool}` : 'outside the daemon'));
      }
    }
    const gone = changes.complete
      ? [...this.known.keys()].filter((id) => !seen.has(id))
      : changes.removed.filter((id) => this.known.has(id));
    for (const id of gone) {
      if (this.busy.has(id)) again.push(id);
      else this.record('destroyed', { id }, 'removed outside the daemon');
    }
    const to = { mark: changes.mark, again };
    // kept when it moved (an idle daemon writes nothing)
    if (to.mark !== this.kept?.mark || to.again.join() !== this.kept.again.join()) this.journal.setWatched(to);
    this.kept = to;
    return to;
  }

  /** Read these again on the next pass (what was done for them failed): kept with the mark. */
  retry(ids: string[]): WatchMark | undefined {
    if (!this.kept || !ids.length) return this.kept;
    const to = { mark: this.kept.mark, again: [...new Set([...this.kept.again, ...ids])] };
    this.journal.setWatched(to);
    return (this.kept = to);
  }

  after(id: number, limit?: number): EventRecord[] {
    return this.journal.after(id, limit);
  }
}
