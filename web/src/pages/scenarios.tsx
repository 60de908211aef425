/**
 * Scenarios: the list (#/scenarios) and one scenario (#/scenarios/NAME) with its network graph,
 * its machines, snapshot / reset (and the reset's waterfall), network faults (block, unblock,
 * partition, heal) and down. The status is polled every 2 s and re-read after every action.
 */
import { useState } from 'preact/hooks';
import { ApiError, api, enc, type Trace } from '../api';
import { ms } from '../format';
import { Button, ErrorBox, Section, State } from '../components';
import { ScenarioGraph, type ScenarioStatus } from '../graph';
import { go, href, useAction, usePoll } from '../hooks';
import { Waterfall } from '../waterfall';

const POLL_MS = 2000;

export function ScenariosPage({ name }: { name?: string }) {
  // keyed by name: another scenario starts with fresh inputs and no stale waterfall
  return name ? <ScenarioPage key={name} name={name} /> : <ScenarioList />;
}

// ---------------------------------------------------------------------------------------------
// the list

function ScenarioList() {
  const list = usePoll(() => api<ScenarioStatus[]>('GET', '/scenarios'), POLL_MS);
  return (
    <>
      <h1>Scenarios</h1>
      <ErrorBox error={list.error} />
      {!list.data ? (
        !list.error && <p class="muted">loading…</p>
      ) : list.data.length === 0 ? (
        <section class="card" data-testid="scenarios-empty">
          <p>No scenario is up.</p>
          <p>
            Raise one with <code>snaplab up FILE --name NAME</code> (for example{' '}
            <code>snaplab up examples/scenarios/tiny-service/scenario.yaml --name lab</code>), or with{' '}
            <code>POST /scenarios {'{"file": "/path/to/scenario.yaml", "name": "lab"}'}</code>.
          </p>
        </section>
      ) : (
        <Section title={`${list.data.length} scenario${list.data.length === 1 ? '' : 's'}`}>
          <div class="table-wrap">
            <table data-testid="scenarios-table">
              <thead>
                <tr>
                  <th>Name</th>
                  <th>State</th>
                  <th class="num">Machines</th>
                  <th class="num">Networks</th>
                  <th class="num">Blocked pairs</th>
                  <th>Snapshots</th>
                  <th class="hide-narrow">File</th>
                </tr>
              </thead>
              <tbody>
                {list.data.map((s) => {
                  const running = s.machines.filter((m) => m.state === 'running').length;
                  return (
                    <tr data-scenario={s.name}>
                      <td>
                        <a href={href('scenarios', s.name)}>{s.name}</a>
                      </td>
                      <td>
                        <State state={s.state} />
                        {s.reason && <div class="muted">{s.reason}</div>}
                      </td>
                      <td class="num">
                        {s.machines.length}
                        {running !== s.machines.length && <span class="muted"> ({running} running)</span>}
                      </td>
                      <td class="num">{s.networks?.length ?? '—'}</td>
                      <td class="num">{s.blocked?.length ?? '—'}</td>
                      <td>
                        {s.snapshots.length ? (
                          s.snapshots.map((n) => <span class="label">{n}</span>)
                        ) : (
                          <span class="muted">none</span>
                        )}
                      </td>
                      <td class="hide-narrow mono" style={{ overflowWrap: 'anywhere' }}>
                        {s.file}
                      </td>
                    </tr>
                  );
                })}
              </tbody>
            </table>
          </div>
        </Section>
      )}
    </>
  );
}

// ---------------------------------------------------------------------------------------------
// one scenario

type NetBody =
  | { action: 'block' | 'unblock'; machines: [string, string] }
  | { action: 'partition'; groups: string[][] }
  | { action: 'heal' };

/** "web,db | cache" → [["web", "db"], ["cache"]]: groups split on `|`, machines on commas or spaces. */
export function parseGroups(text: string): string[][] {
  return text
    .split('|')
    .map((g) => g.split(/[\s,]+/).filter(Boolean))
    .filter((g) => g.length > 0);
}

/** A mistake caught here, shown like the daemon's own errors (code, message, hint). */
const badInput = (message: string, hint?: string): ApiError => new ApiError(0, 'BAD_INPUT', message, hint);

function checkGroups(groups: string[][], machines: string[]): void {
  const known = `its machines: ${machines.join(', ')}`;
  if (groups.length < 2)
    throw badInput('a partition needs at least two groups', 'separate the groups with |, e.g. "a,b | c"');
  const seen = new Set<string>();
  for (const m of groups.flat()) {
    if (!machines.includes(m)) throw badInput(`no machine ${JSON.stringify(m)} in this scenario`, known);
    if (seen.has(m)) throw badInput(`machine ${m} is in two groups`, 'name each machine once');
    seen.add(m);
  }
}

const samePair = (p: [string, string], a: string, b: string): boolean =>
  (p[0] === a && p[1] === b) || (p[0] === b && p[1] === a);

function ScenarioPage({ name }: { name: string }) {
  const path = `/scenarios/${enc(name)}`;
  const status = usePoll(() => api<ScenarioStatus>('GET', path), POLL_MS, [path]);
  const s = status.data?.name === name ? status.data : undefined;
  const act = useScenarioActions(path, status.reload);

  if (!s) {
    return (
      <>
        <p>
          <a href={href('scenarios')}>← Scenarios</a>
        </p>
        <h1>Scenario {name}</h1>
        <ErrorBox error={status.error} />
        {!status.error && <p class="muted">loading…</p>}
      </>
    );
  }

  return (
    <>
      <p>
        <a href={href('scenarios')}>← Scenarios</a>
      </p>
      <div class="row">
        <h1 style={{ margin: 0 }}>Scenario {s.name}</h1>
        <State state={s.state} />
        {s.reason && <span class="muted">{s.reason}</span>}
      </div>
      <p class="muted mono" style={{ overflowWrap: 'anywhere' }}>
        {s.file}
      </p>
      {/* a failed poll keeps the last status shown, with the error above it */}
      <ErrorBox error={status.error} />

      <Section title="Network">
        <ScenarioGraph status={s} />
        <p class="muted" data-testid="graph-legend">
          Rounded bars are networks (name and subnet); boxes are machines, bordered by state (green running, amber
          starting or paused, red anything else), with their address on each network; a coloured line joins a machine to
          each network it is on. A <span style={{ color: '#b3261e', fontWeight: 600 }}>red dashed line marked ✕</span>{' '}
          is a blocked pair: traffic between the two machines is dropped both ways (as the kernel has it now). A
          partition is just a set of blocked pairs: every pair across two groups.
        </p>
      </Section>

      <MachinesSection s={s} />
      <SnapshotSection s={s} act={act} />
      <FaultsSection s={s} act={act} />
      <DownSection s={s} act={act} />
    </>
  );
}

/** The page's actions, and what they leave to show; every action re-reads the status when it ends, failed or not. */
function useScenarioActions(path: string, reload: () => void) {
  // the last snapshot/reset this page ran, with its trace
  const [last, setLast] = useState<{ title: string; trace: Trace } | null>(null);
  const [snapName, setSnapName] = useState('');
  const [resetTo, setResetTo] = useState(''); // '' = the latest
  const [netKind, setNetKind] = useState(''); // which network button is busy
  const snapshot = useAction(async (snap: string) => {
    try {
      const r = await api<{ name: string; trace: Trace }>('POST', `${path}/snapshot`, { name: snap });
      setLast({ title: `snapshot ${r.name}`, trace: r.trace });
      setSnapName('');
      setResetTo(''); // back to "latest", which is now this one
    } finally {
      reload();
    }
  });
  const reset = useAction(async (to: string) => {
    try {
      const r = await api<{ snapshot: string; trace: Trace }>('POST', `${path}/reset`, { to });
      setLast({ title: `reset to ${r.snapshot}`, trace: r.trace });
    } finally {
      reload();
    }
  });
  const net = useAction(async (kind: string, body: () => NetBody) => {
    setNetKind(kind);
    try {
      await api('POST', `${path}/net`, body()); // body() may throw a BAD_INPUT found here
    } finally {
      reload();
    }
  });
  const down = useAction(async () => {
    await api('DELETE', path);
    go('scenarios');
  });
  const busyAny = snapshot.busy || reset.busy || net.busy || down.busy;
  return { last, snapName, setSnapName, resetTo, setResetTo, netKind, snapshot, reset, net, down, busyAny };
}

type Actions = ReturnType<typeof useScenarioActions>;

function MachinesSection({ s }: { s: ScenarioStatus }) {
  return (
    <Section title="Machines">
      <div class="table-wrap">
        <table data-testid="scenario-machines">
          <thead>
            <tr>
              <th>Machine</th>
              <th>State</th>
              <th>Hostname</th>
              <th>Addresses</th>
              <th>Machine page</th>
            </tr>
          </thead>
          <tbody>
            {s.machines.map((m) => (
              <tr data-machine-row={m.machine}>
                <td>{m.machine}</td>
                <td>
                  <State state={m.state} />
                  {m.reason && <div class="muted">{m.reason}</div>}
                </td>
                <td class="mono">{m.hostname}</td>
                <td class="mono">
                  {m.addresses.map((x) => (
                    <div>
                      {x.address} <span class="muted">({x.network})</span>
                    </div>
                  ))}
                </td>
                <td>
                  <a href={href('machines', m.sandbox)}>{m.sandbox}</a>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </Section>
  );
}

/** What the dashboard says of a scenario's standby (README, "Resets that do not wait for a boot"). */
function standbyText(s: ScenarioStatus): string {
  const st = s.standby;
  if (!st) return s.standbyWanted ? 'Standby: none yet (a snapshot raises one)' : 'Standby: off';
  const took = st.raiseMs === null ? '' : `, raised in ${ms(st.raiseMs)}`;
  const swap = st.state === 'ready' ? ': the next reset to it swaps it in' : '';
  return `Standby: ${st.state} (of ${st.snapshot}${took})${st.reason ? ` — ${st.reason}` : ''}${swap}`;
}

function SnapshotSection({ s, act }: { s: ScenarioStatus; act: Actions }) {
  const { last, snapName, setSnapName, resetTo, setResetTo, snapshot, reset, busyAny } = act;
  // the snapshots come oldest first; the select lists them newest first
  const latest = s.snapshots.at(-1);
  const chosenSnap = resetTo && s.snapshots.includes(resetTo) ? resetTo : latest;
  return (
    <Section title="Snapshot and reset">
      <form
        class="row"
        onSubmit={(e) => {
          e.preventDefault();
          if (snapName.trim() && !busyAny) void snapshot.run(snapName.trim());
        }}
      >
        <label>
          Snapshot name
          <input
            value={snapName}
            onInput={(e) => setSnapName((e.target as HTMLInputElement).value)}
            placeholder="base"
            autoComplete="off"
          />
        </label>
        <span style={{ alignSelf: 'end' }}>
          <Button
            onClick={() => void snapshot.run(snapName.trim())}
            busy={snapshot.busy}
            disabled={!snapName.trim() || busyAny}
          >
            Snapshot
          </Button>
        </span>
      </form>
      <ErrorBox error={snapshot.error} />

      <div class="row">
        <label>
          Reset to
          <select
            value={chosenSnap ?? ''}
            onChange={(e) => setResetTo((e.target as HTMLSelectElement).value)}
            disabled={!latest}
          >
            {!latest && <option value="">no snapshot yet</option>}
            {[...s.snapshots].reverse().map((n) => (
              <option value={n}>{n === latest ? `${n} (latest)` : n}</option>
            ))}
          </select>
        </label>
        <span style={{ alignSelf: 'end' }}>
          <Button
            onClick={() => chosenSnap && void reset.run(chosenSnap)}
            busy={reset.busy}
            disabled={!chosenSnap || busyAny}
            kind="primary"
          >
            Reset
          </Button>
        </span>
      </div>
      <ErrorBox error={reset.error} />
      <p class="muted" data-testid="scenario-standby">
        {standbyText(s)}
      </p>

      {last && (
        <div data-testid="scenario-last-trace">
          <h3 style={{ fontSize: '14px', margin: '10px 0 6px' }}>
            Last {last.title}: {last.trace.status}
            {last.trace.error && <span class="muted"> ({last.trace.error})</span>}
          </h3>
          <Waterfall trace={last.trace} />
        </div>
      )}
    </Section>
  );
}

/** Block or unblock a pair, partition into groups, heal; and the pairs blocked now. */
function FaultsSection({ s, act }: { s: ScenarioStatus; act: Actions }) {
  const { net, netKind, busyAny } = act;
  const [pickA, setPickA] = useState('');
  const [pickB, setPickB] = useState('');
  const [groupsText, setGroupsText] = useState('');
  const names = s.machines.map((m) => m.machine);
  const a = pickA && names.includes(pickA) ? pickA : (names[0] ?? '');
  const b = pickB && names.includes(pickB) ? pickB : (names.find((n) => n !== a) ?? '');
  const twoPicked = a !== '' && b !== '' && a !== b;
  const pairBlocked = s.blocked.some((p) => samePair(p, a, b));
  const pair = (action: 'block' | 'unblock') => (): NetBody => {
    if (!twoPicked) throw badInput('pick two different machines');
    return { action, machines: [a, b] };
  };
  const partitionBody = (): NetBody => {
    const groups = parseGroups(groupsText);
    checkGroups(groups, names);
    return { action: 'partition', groups };
  };
  const example =
    names.length >= 2
      ? `${names.slice(0, Math.ceil(names.length / 2)).join(',')} | ${names.slice(Math.ceil(names.length / 2)).join(',')}`
      : 'a,b | c';
  return (
    <Section title="Network faults">
      <div class="row">
        <label>
          Machine A
          <select value={a} onChange={(e) => setPickA((e.target as HTMLSelectElement).value)}>
            {names.map((n) => (
              <option value={n}>{n}</option>
            ))}
          </select>
        </label>
        <label>
          Machine B
          <select value={b} onChange={(e) => setPickB((e.target as HTMLSelectElement).value)}>
            {names.map((n) => (
              <option value={n}>{n}</option>
            ))}
          </select>
        </label>
        <span style={{ alignSelf: 'end', display: 'flex', gap: '8px', alignItems: 'center' }}>
          <Button
            onClick={() => void net.run('block', pair('block'))}
            busy={net.busy && netKind === 'block'}
            disabled={busyAny || !twoPicked}
          >
            Block
          </Button>
          <Button
            onClick={() => void net.run('unblock', pair('unblock'))}
            busy={net.busy && netKind === 'unblock'}
            disabled={busyAny || !twoPicked}
          >
            Unblock
          </Button>
          <span class="muted" data-testid="pair-state">
            {!twoPicked ? 'pick two different machines' : pairBlocked ? 'now blocked' : 'now open'}
          </span>
        </span>
      </div>

      <form
        class="row"
        onSubmit={(e) => {
          e.preventDefault();
          if (!busyAny) void net.run('partition', partitionBody);
        }}
      >
        <label style={{ flex: '1 1 260px' }}>
          Partition groups
          <input
            value={groupsText}
            onInput={(e) => setGroupsText((e.target as HTMLInputElement).value)}
            placeholder={example}
            autoComplete="off"
            aria-describedby="partition-help"
          />
        </label>
        <span style={{ alignSelf: 'end', display: 'flex', gap: '8px' }}>
          <Button
            onClick={() => void net.run('partition', partitionBody)}
            busy={net.busy && netKind === 'partition'}
            disabled={busyAny || !groupsText.trim()}
          >
            Partition
          </Button>
          <Button
            onClick={() => void net.run('heal', () => ({ action: 'heal' }))}
            busy={net.busy && netKind === 'heal'}
            disabled={busyAny}
          >
            Heal
          </Button>
        </span>
      </form>
      <p class="muted" id="partition-help">
        Groups separated by <code>|</code>, machines by commas (e.g. <code>{example}</code>): every pair across groups
        is blocked, on top of what is already blocked; machines not named keep their links. Heal unblocks every pair.
      </p>
      <ErrorBox error={net.error} />

      <h3 style={{ fontSize: '14px', margin: '10px 0 6px' }}>Blocked now</h3>
      {s.blocked.length === 0 ? (
        <p class="muted" data-testid="blocked-none">
          No pair is blocked.
        </p>
      ) : (
        <ul data-testid="blocked-list" style={{ margin: 0, paddingLeft: '18px' }}>
          {s.blocked.map(([x, y]) => (
            <li data-blocked-item={[x, y].sort().join('|')} style={{ marginBottom: '4px' }}>
              {x} ✕ {y}{' '}
              <Button
                onClick={() => void net.run(`unblock ${x} ${y}`, () => ({ action: 'unblock', machines: [x, y] }))}
                busy={net.busy && netKind === `unblock ${x} ${y}`}
                disabled={busyAny}
                label={`Unblock ${x} and ${y}`}
              >
                Unblock
              </Button>
            </li>
          ))}
        </ul>
      )}
    </Section>
  );
}

function DownSection({ s, act }: { s: ScenarioStatus; act: Actions }) {
  const { down, busyAny } = act;
  const [confirmDown, setConfirmDown] = useState(false);
  return (
    <Section title="Down">
      <div class="row">
        <span class="muted">Removes every machine, snapshot, bridge and namespace of {s.name}.</span>
        {!confirmDown ? (
          <Button onClick={() => setConfirmDown(true)} kind="danger" disabled={busyAny}>
            Down
          </Button>
        ) : (
          <>
            <strong>Take {s.name} down?</strong>
            <Button onClick={() => void down.run()} kind="danger" busy={down.busy} disabled={busyAny}>
              Confirm down
            </Button>
            <Button onClick={() => setConfirmDown(false)} disabled={down.busy}>
              Cancel
            </Button>
          </>
        )}
      </div>
      <ErrorBox error={down.error} />
    </Section>
  );
}
