/** One machine: overview, a terminal, its files, its snapshots, its operations. */
import { lazy, Suspense } from 'preact/compat';
import { useEffect, useState } from 'preact/hooks';
import { ApiError, api, enc, raw, shownState, subscribe, type EgressUsage, type Sandbox } from '../api';
import { Button, ErrorBox, Section, State } from '../components';
import { age, bytes } from '../format';
import { go, href, useAction, usePoll } from '../hooks';
import { TraceList } from './operations';

const TerminalView = lazy(() => import('../terminal'));

const TABS: [string, string][] = [
  ['overview', 'Overview'],
  ['terminal', 'Terminal'],
  ['files', 'Files'],
  ['snapshots', 'Snapshots'],
  ['operations', 'Operations'],
];

function Overview({ box, reload }: { box: Sandbox; reload: () => void }) {
  const act = useAction(async (what: 'pause' | 'resume' | 'stop' | 'start' | 'destroy') => {
    if (what === 'destroy') {
      if (!confirm(`Destroy ${box.name}? Its filesystem is removed.`)) return;
      await api('DELETE', `/sandboxes/${enc(box.id)}`);
      go('machines');
      return;
    }
    await api('POST', `/sandboxes/${enc(box.id)}/${what}`);
    reload();
  });
  const rows: [string, unknown][] = [
    ['id', box.id],
    ['image', box.image],
    ['driver', box.driver],
    ['storage', box.storage],
    ['init', box.init],
    ['memory limit', box.limits.memoryBytes ? bytes(box.limits.memoryBytes) : 'none'],
    ['pids limit', box.limits.pids ?? 'none'],
    ['cpus', box.limits.cpus ?? 'all'],
    ['disk cap', box.limits.diskBytes ? bytes(box.limits.diskBytes) : 'none'],
    ['created', `${new Date(box.createdAt).toLocaleString()} (${age(box.createdAt)} ago)`],
    ['expires', box.expiresAt ? new Date(box.expiresAt).toLocaleString() : 'never'],
    ['on timeout', box.onTimeout],
    ['owner', box.owner ?? '—'],
    ['from', box.origin ?? '—'],
    // a dead or stopped machine's last pid is no longer its own
    ['host pid', (box.state === 'running' || box.state === 'paused') && box.pid ? box.pid : '—'],
  ];
  return (
    <Section
      title="Overview"
      actions={
        <>
          {box.state === 'running' && (
            <>
              <Button busy={act.busy} onClick={() => void act.run('pause')}>
                Pause
              </Button>
              <Button busy={act.busy} onClick={() => void act.run('stop')}>
                Stop
              </Button>
            </>
          )}
          {box.state === 'paused' && (
            <Button busy={act.busy} onClick={() => void act.run('resume')}>
              Resume
            </Button>
          )}
          {box.stopped && (
            <Button busy={act.busy} onClick={() => void act.run('start')}>
              Start
            </Button>
          )}
          <Button kind="danger" busy={act.busy} onClick={() => void act.run('destroy')}>
            Destroy
          </Button>
        </>
      }
    >
      <ErrorBox error={act.error} />
      <dl class="grid">
        {rows.map(([k, v]) => (
          <div>
            <dt>{k}</dt>
            <dd class={k === 'id' ? 'mono' : ''}>{String(v)}</dd>
          </div>
        ))}
        <div>
          <dt>labels</dt>
          <dd>
            {Object.entries(box.labels).map(([k, v]) => (
              <span class="label">
                {k}={v}
              </span>
            ))}
            {!Object.keys(box.labels).length && '—'}
          </dd>
        </div>
        <div>
          <dt>metadata</dt>
          <dd>
            {Object.entries(box.metadata).map(([k, v]) => (
              <span class="label">
                {k}={v}
              </span>
            ))}
            {!Object.keys(box.metadata).length && '—'}
          </dd>
        </div>
      </dl>
      <Egress box={box} />
    </Section>
  );
}

/** Its outbound network: none, or its address, lists and counters (read every 5 s). */
function Egress({ box }: { box: Sandbox }) {
  const u = usePoll(
    () => (box.egress ? api<EgressUsage>('GET', `/sandboxes/${enc(box.id)}/egress`) : Promise.resolve(undefined)),
    5000,
    [box.id],
  );
  const list = (xs: string[], none: string): string => (xs.length ? xs.join(', ') : none);
  if (!box.egress)
    return (
      <dl class="grid egress">
        <div>
          <dt>egress</dt>
          <dd>none (loopback only)</dd>
        </div>
      </dl>
    );
  const e = u.data ?? { ...box.egress, bytesOut: undefined, connections: undefined, denied: undefined };
  const rows: [string, string][] = [
    ['egress from', e.address],
    ['allow', list(e.allow, 'anything not denied')],
    ['deny', list(e.deny, 'the host, private and link-local networks')],
    ['sent out', e.bytesOut === undefined ? '…' : bytes(e.bytesOut)],
    ['connections', e.connections === undefined ? '…' : `${e.connections} let through, ${e.denied} refused`],
  ];
  return (
    <dl class="grid egress">
      {rows.map(([k, v]) => (
        <div>
          <dt>{k}</dt>
          <dd class={k === 'egress from' ? 'mono' : ''}>{v}</dd>
        </div>
      ))}
    </dl>
  );
}

interface Entry {
  name: string;
  path: string;
  type: string;
  size: number;
  mode: string;
  uid: number;
  gid: number;
  mtime: string | number;
  target?: string;
}

const parent = (p: string): string => p.replace(/\/[^/]+\/?$/, '') || '/';
const join = (dir: string, name: string): string => `${dir.replace(/\/$/, '')}/${name}`;

function Files({ box }: { box: Sandbox }) {
  const [dir, setDir] = useState('/root');
  const ls = usePoll(() => api<Entry[]>('GET', `/sandboxes/${enc(box.id)}/files/list?path=${enc(dir)}`), 0, [
    box.id,
    dir,
  ]);
  // a download goes through fetch, so it carries the key (a plain link could not on TCP)
  const download = useAction(async (e: Entry) => {
    const res = await raw('GET', `/sandboxes/${enc(box.id)}/files?path=${enc(e.path)}`);
    const url = URL.createObjectURL(await res.blob());
    const a = Object.assign(document.createElement('a'), { href: url, download: e.name });
    a.click();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
  });
  const upload = useAction(async (files: File[]) => {
    for (const f of files) await raw('PUT', `/sandboxes/${enc(box.id)}/files?path=${enc(join(dir, f.name))}`, f);
    ls.reload();
  });
  const remove = useAction(async (e: Entry) => {
    if (!confirm(`Remove ${e.path}${e.type === 'dir' ? ' and everything in it' : ''}?`)) return;
    await api('DELETE', `/sandboxes/${enc(box.id)}/files?path=${enc(e.path)}&recursive=true`);
    ls.reload();
  });
  return (
    <Section title="Files">
      <form
        class="row"
        onSubmit={(e) => {
          e.preventDefault();
          setDir(((e.target as HTMLFormElement).elements.namedItem('path') as HTMLInputElement).value || '/');
        }}
      >
        <label class="inline">
          directory <input name="path" value={dir} key={dir} class="mono" />
        </label>
        <button type="submit">Open</button>
        {dir !== '/' && (
          <button type="button" onClick={() => setDir(parent(dir))}>
            Up
          </button>
        )}
        <label class="inline">
          upload here{' '}
          <input
            type="file"
            multiple
            onChange={(e) => {
              const input = e.target as HTMLInputElement;
              const f = input.files ? [...input.files] : [];
              input.value = ''; // the same file chosen again is another upload
              if (f.length) void upload.run(f);
            }}
          />
        </label>
        {upload.busy && <span>uploading…</span>}
      </form>
      <ErrorBox error={ls.error ?? download.error ?? upload.error ?? remove.error} />
      <div class="table-wrap">
        <table data-testid="files">
          <thead>
            <tr>
              <th>name</th>
              <th>type</th>
              <th class="num">size</th>
              <th>mode</th>
              <th class="hide-narrow">owner</th>
              <th class="hide-narrow">modified</th>
              <th />
            </tr>
          </thead>
          <tbody>
            {(ls.data ?? []).map((e) => (
              <tr data-file={e.name}>
                <td class="mono">
                  {e.type === 'dir' ? (
                    <button type="button" class="link" onClick={() => setDir(e.path)}>
                      {e.name}/
                    </button>
                  ) : (
                    e.name
                  )}
                  {e.target && <span class="muted"> → {e.target}</span>}
                </td>
                <td>{e.type}</td>
                <td class="num">{e.type === 'file' ? bytes(e.size) : ''}</td>
                <td class="mono">{e.mode}</td>
                <td class="hide-narrow">
                  {e.uid}:{e.gid}
                </td>
                <td class="hide-narrow">
                  {new Date(typeof e.mtime === 'number' ? e.mtime * 1000 : e.mtime).toLocaleString()}
                </td>
                <td>
                  {e.type === 'file' && (
                    <button type="button" onClick={() => void download.run(e)} aria-label={`download ${e.name}`}>
                      Download
                    </button>
                  )}
                  <button type="button" onClick={() => void remove.run(e)} aria-label={`remove ${e.name}`}>
                    Remove
                  </button>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
      {ls.data && !ls.data.length && <p class="muted">empty</p>}
    </Section>
  );
}

interface Snap {
  name: string;
  id: string;
  sandbox: string;
  image: string;
  storage: string;
  kind: string;
  createdAt: string;
}

function Snapshots({ box }: { box: Sandbox }) {
  const snaps = usePoll(() => api<Snap[]>('GET', '/snapshots'), 0, [box.id]);
  const [name, setName] = useState('');
  const take = useAction(async () => {
    await api('POST', `/sandboxes/${enc(box.id)}/snapshots`, {
      name: name.trim() || `${box.name}-${new Date().toISOString().replace(/[-:T]/g, '').slice(0, 14)}`,
    });
    setName('');
    snaps.reload();
  });
  const restore = useAction(async (s: Snap) => {
    const b = await api<Sandbox>('POST', '/sandboxes', { snapshot: s.name });
    go('machines', b.id);
  });
  const remove = useAction(async (s: Snap) => {
    if (!confirm(`Remove snapshot ${s.name}?`)) return;
    await api('DELETE', `/snapshots/${enc(s.name)}`);
    snaps.reload();
  });
  const mine = (snaps.data ?? []).filter((s) => s.sandbox === box.id || s.sandbox === box.name);
  return (
    <Section title="Snapshots">
      <form
        class="row"
        onSubmit={(e) => {
          e.preventDefault();
          void take.run();
        }}
      >
        <label class="inline">
          name{' '}
          <input value={name} placeholder="(dated)" onInput={(e) => setName((e.target as HTMLInputElement).value)} />
        </label>
        <button type="submit" class="primary" disabled={take.busy}>
          {take.busy ? 'Taking…' : 'Take snapshot'}
        </button>
      </form>
      <ErrorBox error={snaps.error ?? take.error ?? restore.error ?? remove.error} />
      <table data-testid="snapshots">
        <thead>
          <tr>
            <th>name</th>
            <th>kind</th>
            <th>storage</th>
            <th>taken</th>
            <th />
          </tr>
        </thead>
        <tbody>
          {mine.map((s) => (
            <tr data-snapshot={s.name}>
              <td>{s.name}</td>
              <td>{s.kind}</td>
              <td>{s.storage}</td>
              <td>{new Date(s.createdAt).toLocaleString()}</td>
              <td>
                <button
                  type="button"
                  onClick={() => void restore.run(s)}
                  disabled={restore.busy}
                  aria-label={`restore ${s.name}`}
                >
                  Restore as new machine
                </button>
                <button type="button" onClick={() => void remove.run(s)} aria-label={`remove snapshot ${s.name}`}>
                  Remove
                </button>
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {snaps.data && !mine.length && <p class="muted">No snapshots of this machine.</p>}
    </Section>
  );
}

export function MachinePage({ id, tab }: { id: string; tab: string }) {
  const box = usePoll(() => api<Sandbox>('GET', `/sandboxes/${enc(id)}`), 0, [id]);
  // its own events keep the page current (paused, resumed, exited, destroyed)
  useEffect(
    () =>
      subscribe((e) => {
        if (e.sandbox === box.data?.id || e.name === id) box.reload();
      }),
    [id, box.data?.id],
  );
  const gone = box.error instanceof ApiError && box.error.code === 'SANDBOX_NOT_FOUND';
  if ((box.error && !box.data) || gone)
    return (
      <>
        <h1>
          {box.data?.name ?? id}
          {gone && ' (gone)'}
        </h1>
        <ErrorBox error={box.error} />
        <a href={href('machines')}>all machines</a>
      </>
    );
  if (!box.data) return <p>loading…</p>;
  const b = box.data;
  return (
    <>
      <h1>
        {b.name} <State state={shownState(b)} />
      </h1>
      {b.reason && <p class="muted">{b.reason}</p>}
      <ErrorBox error={box.error} />
      <nav class="tabs" aria-label="machine">
        {TABS.map(([t, label]) => (
          <a href={href('machines', id, t)} aria-current={tab === t ? 'page' : undefined}>
            {label}
          </a>
        ))}
      </nav>
      {tab === 'overview' && <Overview box={b} reload={box.reload} />}
      {tab === 'terminal' &&
        (b.state === 'running' ? (
          <Suspense fallback={<p>loading the terminal…</p>}>
            <TerminalView id={b.id} />
          </Suspense>
        ) : (
          <p class="muted">The machine is {b.state}: a terminal needs it running.</p>
        ))}
      {tab === 'files' && <Files box={b} />}
      {tab === 'snapshots' && <Snapshots box={b} />}
      {tab === 'operations' && (
        <Section title="Operations">
          <TraceList target={b.name} />
        </Section>
      )}
    </>
  );
}
