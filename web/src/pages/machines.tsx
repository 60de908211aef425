/**
 * The machine list, live: read once, then kept by the event stream (created, paused, resumed,
 * exited, destroyed, failed) without reloading; CPU and memory of its page from GET /usage every 2 s. Events
 * are gathered and applied once per frame, so a burst of them costs one render, and each row
 * renders again only when its machine or its usage changed.
 */
import { Component } from 'preact';
import { useEffect, useMemo, useRef, useState } from 'preact/hooks';
import { api, apiPage, enc, shownState, subscribe, type Sandbox, type SnaplabEvent, type Usage } from '../api';
import { Button, ErrorBox, Section, State } from '../components';
import { age, bytes, num } from '../format';
import { href, useAction, usePoll } from '../hooks';

interface Load {
  memoryBytes?: number;
  pids?: number;
  cpuPct?: number;
}

/**
 * Apply a batch of events to a page of the list; the ids of machines made that it does not hold
 * and of those made ready (whose record must be fetched, if they belong to it) are returned. An event for another machine
 * it does not hold is for another page.
 */
export function applyEvents(
  list: Map<string, Sandbox>,
  events: SnaplabEvent[],
): { list: Map<string, Sandbox>; fetch: Set<string> } {
  const next = new Map(list);
  const fetch = new Set<string>();
  const patch = (id: string, p: Partial<Sandbox>): void => {
    const b = next.get(id);
    if (b) next.set(id, { ...b, ...p });
  };
  for (const e of events) {
    if (!e.sandbox) continue;
    switch (e.type) {
      case 'created':
      case 'ready':
      case 'started': // a fresh boot: its pid, its reason, read again
        fetch.add(e.sandbox);
        break;
      case 'paused':
        patch(e.sandbox, { state: 'paused', reason: e.reason });
        break;
      case 'resumed':
        patch(e.sandbox, { state: 'running', reason: null });
        break;
      case 'exited':
        patch(e.sandbox, { state: 'dead', reason: e.reason });
        break;
      case 'stopped':
        patch(e.sandbox, { state: 'dead', stopped: true, reason: e.reason });
        break;
      case 'destroyed':
      case 'failed':
        next.delete(e.sandbox);
        fetch.delete(e.sandbox);
        break;
    }
  }
  return { list: next, fetch };
}

function limitsText(l: Sandbox['limits']): string {
  const parts = [
    l.memoryBytes ? bytes(l.memoryBytes) : '',
    l.pids ? `${l.pids} pids` : '',
    l.cpus ? `${l.cpus} cpu` : '',
    l.diskBytes ? `disk ${bytes(l.diskBytes)}` : '',
  ].filter(Boolean);
  return parts.join(' · ') || 'none';
}

const cpuText = (l: Load | undefined): string => (l?.cpuPct === undefined ? '—' : `${num(l.cpuPct)}%`);
const shownLoad = (l: Load | undefined): string => `${cpuText(l)} ${bytes(l?.memoryBytes)}`;

interface RowProps {
  box: Sandbox;
  load: Load | undefined;
  selected: boolean;
  now: number;
  onSelect: (id: string, on: boolean) => void;
}

/** One row; rendered again only when what it shows changed. */
class Row extends Component<RowProps> {
  shouldComponentUpdate(n: RowProps): boolean {
    const p = this.props;
    // usage compared as shown (a new poll with the same figures redraws nothing): with 500 rows,
    // redrawing every row at each poll was a long task (137 ms) every 2 s
    return (
      n.box !== p.box ||
      shownLoad(n.load) !== shownLoad(p.load) ||
      n.selected !== p.selected ||
      Math.floor(n.now / 10_000) !== Math.floor(p.now / 10_000)
    );
  }

  render({ box: b, load, selected, now, onSelect }: RowProps) {
    return (
      <tr class={selected ? 'selected' : ''} data-machine={b.name} data-state={shownState(b)}>
        <td>
          <input
            type="checkbox"
            checked={selected}
            aria-label={`select ${b.name}`}
            onChange={(e) => onSelect(b.id, (e.target as HTMLInputElement).checked)}
          />
        </td>
        <td>
          <a href={href('machines', b.id)}>{b.name}</a>
          <div class="muted mono">{b.id}</div>
        </td>
        <td>
          <State state={shownState(b)} />
          {b.reason && <div class="muted">{b.reason}</div>}
        </td>
        <td>{b.image}</td>
        <td class="hide-narrow">
          {b.driver} · {b.storage}
        </td>
        <td class="hide-narrow">{limitsText(b.limits)}</td>
        <td class="num">{age(b.createdAt, now)}</td>
        <td class="hide-narrow">
          {Object.entries(b.labels).map(([k, v]) => (
            <span class="label">
              {k}={v}
            </span>
          ))}
        </td>
        <td class="num">{cpuText(load)}</td>
        <td class="num">{bytes(load?.memoryBytes)}</td>
      </tr>
    );
  }
}

function CreateForm({ onCreated }: { onCreated: (b: Sandbox) => void }) {
  const images = usePoll(() => api<{ name: string }[]>('GET', '/images'));
  const [image, setImage] = useState('busybox');
  const [name, setName] = useState('');
  const create = useAction(async () => {
    const b = await api<Sandbox>('POST', '/sandboxes', { image, ...(name.trim() ? { name: name.trim() } : {}) });
    setName('');
    onCreated(b);
  });
  return (
    <form
      class="row"
      onSubmit={(e) => {
        e.preventDefault();
        void create.run();
      }}
      aria-label="create a machine"
    >
      <label class="inline">
        image
        <select value={image} onChange={(e) => setImage((e.target as HTMLSelectElement).value)}>
          {(images.data ?? [{ name: 'busybox' }]).map((i) => (
            <option value={i.name}>{i.name}</option>
          ))}
        </select>
      </label>
      <label class="inline">
        name
        <input value={name} placeholder="(generated)" onInput={(e) => setName((e.target as HTMLInputElement).value)} />
      </label>
      <button type="submit" class="primary" disabled={create.busy}>
        {create.busy ? 'Creating…' : 'Create'}
      </button>
      <ErrorBox error={create.error} />
    </form>
  );
}

interface PageState {
  listRef: { current: Map<string, Sandbox> | undefined };
  nextRef: { current: string | null };
  setList: (
    f: Map<string, Sandbox> | undefined | ((l: Map<string, Sandbox> | undefined) => Map<string, Sandbox> | undefined),
  ) => void;
  setNext: (n: string | null) => void;
  setError: (e: unknown) => void;
  setLost: (l: boolean) => void;
}

/**
 * Read the page, then follow the events; a reconnect of the stream reads the page again. The
 * events that came while a read was under way are applied again on top of what it answered (each
 * event sets a state or adds or removes a machine, so applying one twice in order changes
 * nothing), so an answer older than an event cannot undo it, and none is dropped before the first
 * answer. Returns what stops it.
 */
function followPage(per: number, after: string | undefined, st: PageState): () => void {
  const { listRef, nextRef, setList, setNext, setError, setLost } = st;
  // another page: nothing of the one before is shown, patched or paged from until this one answers
  listRef.current = undefined;
  nextRef.current = null;
  setList(undefined);
  setNext(null);
  let live = true;
  // machines new to this page being read (fetchOne): shown only if still wanted when read
  const wanted = new Set<string>();
  const pending: SnaplabEvent[] = [];
  let during: SnaplabEvent[] | null = null; // events since the read under way began
  let frame: { cancel: () => void } | null = null;
  const path = `/sandboxes?limit=${per}${after === undefined ? '' : `&after=${enc(after)}`}`;
  const reload = (): void => {
    during = [];
    apiPage<Sandbox>(path).then(
      (page) => {
        if (!live) return;
        const { list: next, fetch } = applyEvents(new Map(page.items.map((b) => [b.id, b])), during ?? []);
        during = null;
        listRef.current = next;
        nextRef.current = page.next;
        setList(next);
        setNext(page.next);
        setError(undefined);
        added(fetch);
        schedule(); // what waited for the answer
      },
      (e: unknown) => {
        during = null;
        if (live) setError(e);
      },
    );
  };
  // a machine's record read again: kept if it is on the page or still wanted there (a destroyed or
  // failed event meanwhile, or a new page, drops it: an answer older than those cannot bring it back)
  const fetchOne = (id: string): void => {
    api<Sandbox>('GET', `/sandboxes/${enc(id)}`).then(
      (b) => {
        if (live && (listRef.current?.has(b.id) || wanted.delete(b.id)))
          setList((l) => (l ? new Map(l).set(b.id, b) : l));
      },
      () => wanted.delete(id), // gone again before we asked: its destroyed event removes it
    );
  };
  // machines made or made ready: read again if here; a new one belongs to the last page
  const added = (ids: Set<string>): void => {
    const here = listRef.current;
    const fresh = [...ids].filter((id) => !here?.has(id));
    for (const id of ids) if (here?.has(id)) fetchOne(id);
    // those already being read count toward the page's size
    const size = (here?.size ?? 0) + wanted.size;
    // a full page with a next one: the new ones sort after it
    if (!fresh.length || during || (nextRef.current !== null && size >= per)) return;
    if (nextRef.current === null && size + fresh.length <= per)
      for (const id of fresh) {
        wanted.add(id);
        fetchOne(id);
      }
    else reload(); // the page as the server cuts it now (and the next one's cursor)
  };
  const flush = (): void => {
    frame = null;
    if (!listRef.current) return; // kept until the first answer
    const batch = pending.splice(0);
    const { list: next, fetch } = applyEvents(listRef.current, batch);
    listRef.current = next;
    setList(next);
    added(fetch);
  };
  // once a frame (a burst costs one render); a hidden tab has no frames: a timer there
  const schedule = (): void => {
    if (frame || !pending.length) return;
    if (document.hidden) {
      const t = setTimeout(flush, 500);
      frame = { cancel: () => clearTimeout(t) };
    } else {
      const f = requestAnimationFrame(flush);
      frame = { cancel: () => cancelAnimationFrame(f) };
    }
  };
  const stop = subscribe(
    (e) => {
      if (e.sandbox && (e.type === 'destroyed' || e.type === 'failed')) wanted.delete(e.sandbox);
      pending.push(e);
      during?.push(e);
      schedule();
    },
    (first) => {
      if (!first) reload();
    },
    () => live && setLost(true),
  );
  reload();
  return () => {
    live = false;
    stop();
    frame?.cancel();
  };
}

/** Machines per page: `?per=N` in the page's address (1 to 1000: the tests use a few), else 100. */
export function pageSize(): number {
  const n = Number(new URLSearchParams(location.search).get('per'));
  return Number.isInteger(n) && n >= 1 && n <= 1000 ? n : 100;
}

/**
 * One page of the machines, kept live: the page (GET /sandboxes?limit&after, oldest first), then
 * the events; `lost` once the event stream was refused. A machine made while this is the last
 * page joins it (the page is read again once it is full, for the next page's cursor); an event
 * for a machine on another page is left to that page. `setList` is for a machine this page made.
 */
function useLiveList() {
  const per = useMemo(pageSize, []);
  const [list, setList] = useState<Map<string, Sandbox> | undefined>(undefined);
  const [error, setError] = useState<unknown>(undefined);
  const [lost, setLost] = useState(false);
  // the cursor of each page seen before this one (the first page has none): Previous pops it
  const [cursors, setCursors] = useState<string[]>([]);
  const [next, setNext] = useState<string | null>(null);
  const listRef = useRef(list);
  listRef.current = list;
  const nextRef = useRef(next);
  nextRef.current = next;
  const after = cursors.at(-1);

  useEffect(() => followPage(per, after, { listRef, nextRef, setList, setNext, setError, setLost }), [after, per]);
  /** a machine this page made: shown if it belongs here (the last page, with room) */
  const made = (b: Sandbox): void => {
    if (nextRef.current === null) setList((l) => (l && l.size < per ? new Map(l).set(b.id, b) : l));
  };
  const paging = {
    per,
    page: cursors.length + 1,
    next: next === null ? undefined : () => setCursors((c) => [...c, next]),
    prev: cursors.length ? () => setCursors((c) => c.slice(0, -1)) : undefined,
  };
  return { list, made, error, lost, paging };
}

/**
 * The memory, processes and CPU of the machines on the page (`ids`, read at each poll: the page
 * as it is then), polled; `now` moves with each poll (for the ages). Only the page's are asked
 * for, so a poll costs the same beside 10 000 machines as beside 100.
 */
function useLoads(ids: { current: string[] }) {
  const [loads, setLoads] = useState<Map<string, Load>>(new Map());
  const [now, setNow] = useState(Date.now());
  // usage every 2 s: CPU is the difference of cpu time over the difference of wall time
  useEffect(() => {
    let prev = new Map<string, Usage>();
    let timer: ReturnType<typeof setTimeout>;
    let live = true;
    const poll = async (): Promise<void> => {
      // no page yet (or an empty one): nothing to ask; looked at again soon, not in 2 s
      if (!ids.current.length) {
        if (live) timer = setTimeout(() => void poll(), 250);
        return;
      }
      try {
        const us = await api<Usage[]>('GET', `/usage?id=${ids.current.map(enc).join(',')}`);
        const next = new Map<string, Load>();
        for (const u of us) {
          const p = prev.get(u.id);
          const cpuPct =
            p?.cpuUsec !== undefined && u.cpuUsec !== undefined && u.at > p.at
              ? ((u.cpuUsec - p.cpuUsec) / ((u.at - p.at) * 1000)) * 100
              : undefined;
          next.set(u.id, { memoryBytes: u.memoryBytes, pids: u.pids, cpuPct });
        }
        prev = new Map(us.map((u) => [u.id, u]));
        if (live) setLoads(next);
      } catch {
        /* the list shows the daemon's error; usage stays as it was */
      }
      if (!live) return; // the page went while a poll was out: no next one
      setNow(Date.now());
      timer = setTimeout(() => void poll(), 2000);
    };
    void poll();
    return () => {
      live = false;
      clearTimeout(timer);
    };
  }, []);
  return { loads, now };
}

export function MachinesPage() {
  const { list, made, error, lost, paging } = useLiveList();
  const pageIds = useRef<string[]>([]);
  pageIds.current = [...(list?.keys() ?? [])];
  const { loads, now } = useLoads(pageIds);
  const [selected, setSelected] = useState<Set<string>>(new Set());
  const [filter, setFilter] = useState('');
  const [stateFilter, setStateFilter] = useState('');
  const all = useMemo(
    () =>
      // the page's order: oldest first (by creation time, then id)
      [...(list?.values() ?? [])].sort((a, b) =>
        a.createdAt < b.createdAt ? -1 : a.createdAt > b.createdAt ? 1 : a.id < b.id ? -1 : a.id > b.id ? 1 : 0,
      ),
    [list],
  );
  const q = filter.trim().toLowerCase();
  const shown = all.filter(
    (b) =>
      (!stateFilter || shownState(b) === stateFilter) &&
      (!q ||
        [b.name, b.id, b.image, b.driver, ...Object.entries(b.labels).map(([k, v]) => `${k}=${v}`)].some((s) =>
          s.toLowerCase().includes(q),
        )),
  );
  const chosen = shown.filter((b) => selected.has(b.id));
  const onSelect = useMemo(
    () => (id: string, on: boolean) =>
      setSelected((s) => {
        const n = new Set(s);
        if (on) n.add(id);
        else n.delete(id);
        return n;
      }),
    [],
  );
  const destroy = useAction(async () => {
    if (!confirm(`Destroy ${chosen.length} machine${chosen.length === 1 ? '' : 's'}? Their filesystems are removed.`))
      return;
    const results = await Promise.allSettled(chosen.map((b) => api('DELETE', `/sandboxes/${enc(b.id)}`)));
    setSelected(new Set());
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
  });

  return (
    <>
      <h1>Machines</h1>
      <Section title="New machine">
        <CreateForm onCreated={made} />
      </Section>
      <Section
        title={`${shown.length} of ${all.length} machines on page ${paging.page}`}
        actions={
          <Button kind="danger" disabled={!chosen.length} busy={destroy.busy} onClick={() => void destroy.run()}>
            Destroy selected ({chosen.length})
          </Button>
        }
      >
        <div class="row">
          <label class="inline">
            filter
            <input
              type="search"
              value={filter}
              placeholder="name, id, image, label k=v"
              onInput={(e) => setFilter((e.target as HTMLInputElement).value)}
            />
          </label>
          <label class="inline">
            state
            <select value={stateFilter} onChange={(e) => setStateFilter((e.target as HTMLSelectElement).value)}>
              <option value="">all</option>
              {['running', 'paused', 'stopped', 'dead', 'creating', 'removing'].map((s) => (
                <option value={s}>{s}</option>
              ))}
            </select>
          </label>
        </div>
        {lost && (
          <div class="error" role="alert">
            The event stream was refused (the key removed, or <code>snaplab ui</code> restarted): this list no longer
            updates. Reload the page.
          </div>
        )}
        <ErrorBox error={error ?? destroy.error} />
        <MachineTable
          shown={shown}
          chosen={chosen}
          selected={selected}
          setSelected={setSelected}
          onSelect={onSelect}
          loads={loads}
          now={now}
        />
        <nav class="row" aria-label="pages">
          <Button disabled={!paging.prev} onClick={() => paging.prev?.()}>
            Previous
          </Button>
          <span data-testid="page">page {paging.page}</span>
          <Button disabled={!paging.next} onClick={() => paging.next?.()}>
            Next
          </Button>
          <span class="muted">{paging.per} a page, oldest first</span>
        </nav>
        {list && !all.length && paging.page === 1 && (
          <p class="muted">
            No machines. Create one above, or <code>snaplab create --image busybox</code>.
          </p>
        )}
        {!list && !error && <p>loading…</p>}
      </Section>
    </>
  );
}

function MachineTable({
  shown,
  chosen,
  selected,
  setSelected,
  onSelect,
  loads,
  now,
}: {
  shown: Sandbox[];
  chosen: Sandbox[];
  selected: Set<string>;
  setSelected: (s: Set<string>) => void;
  onSelect: (id: string, on: boolean) => void;
  loads: Map<string, Load>;
  now: number;
}) {
  return (
    <div class="table-wrap">
      <table data-testid="machines" class="fixed">
        <thead>
          <tr>
            <th class="w-check">
              <input
                type="checkbox"
                aria-label="select all shown"
                checked={shown.length > 0 && chosen.length === shown.length}
                onChange={(e) =>
                  setSelected((e.target as HTMLInputElement).checked ? new Set(shown.map((b) => b.id)) : new Set())
                }
              />
            </th>
            <th>name</th>
            <th class="w-state">state</th>
            <th class="w-image">image</th>
            <th class="hide-narrow w-driver">driver · storage</th>
            <th class="hide-narrow w-limits">limits</th>
            <th class="num w-age">age</th>
            <th class="hide-narrow">labels</th>
            <th class="num w-cpu">CPU</th>
            <th class="num w-mem">memory</th>
          </tr>
        </thead>
        <tbody>
          {shown.map((b) => (
            <Row
              key={b.id}
              box={b}
              load={loads.get(b.id)}
              selected={selected.has(b.id)}
              now={now}
              onSelect={onSelect}
            />
          ))}
        </tbody>
      </table>
    </div>
  );
}
