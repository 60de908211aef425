/** Every stored trace; one of them as a waterfall. */
import { useState } from 'preact/hooks';
import { api, enc, type Trace } from '../api';
import { ErrorBox, Section, State } from '../components';
import { ms } from '../format';
import { href, usePoll } from '../hooks';
import { TraceError, Waterfall } from '../waterfall';

export function TraceView({ id }: { id: string }) {
  const t = usePoll(() => api<Trace>('GET', `/traces/${enc(id)}`), 0, [id]);
  if (t.error) return <ErrorBox error={t.error} />;
  if (!t.data) return <p>loading…</p>;
  const tr = t.data;
  return (
    <Section title={`${tr.kind} ${tr.target ?? ''}`} actions={<State state={tr.status} />}>
      <p class="muted mono">
        {tr.id} · {new Date(tr.startedAt).toISOString()} · {ms(tr.totalMs)}
      </p>
      <TraceError trace={tr} />
      <Waterfall trace={tr} />
    </Section>
  );
}

/** A table of traces (newest first); `target` narrows it to one machine's (asked of the daemon). */
export function TraceList({ target, limit = 200 }: { target?: string; limit?: number }) {
  const [kind, setKind] = useState('');
  const [status, setStatus] = useState('');
  const list = usePoll(
    () => api<Trace[]>('GET', `/traces?limit=${limit}${target ? `&target=${enc(target)}` : ''}`),
    5000,
    [limit, target],
  );
  const all = list.data ?? [];
  const kinds = [...new Set(all.map((t) => t.kind))].sort();
  const shown = all.filter((t) => (!kind || t.kind === kind) && (!status || t.status === status));
  return (
    <>
      <div class="row">
        <label class="inline">
          kind
          <select value={kind} onChange={(e) => setKind((e.target as HTMLSelectElement).value)}>
            <option value="">all</option>
            {kinds.map((k) => (
              <option value={k}>{k}</option>
            ))}
          </select>
        </label>
        <label class="inline">
          status
          <select value={status} onChange={(e) => setStatus((e.target as HTMLSelectElement).value)}>
            <option value="">all</option>
            <option value="ok">ok</option>
            <option value="error">error</option>
          </select>
        </label>
        <span class="muted">
          {shown.length} of {all.length}
        </span>
      </div>
      <ErrorBox error={list.error} />
      <div class="table-wrap">
        <table>
          <thead>
            <tr>
              <th>operation</th>
              <th>kind</th>
              <th>target</th>
              <th class="num">total</th>
              <th class="num">unattributed</th>
              <th>status</th>
              <th class="hide-narrow">when</th>
            </tr>
          </thead>
          <tbody>
            {shown.map((t) => (
              <tr data-trace={t.id}>
                <td class="mono">
                  <a href={href('operations', t.id)}>{t.id}</a>
                </td>
                <td>{t.kind}</td>
                <td>{t.target}</td>
                <td class="num">{ms(t.totalMs)}</td>
                <td class="num">{ms(t.unattributedMs)}</td>
                <td>
                  <State state={t.status} />
                  {t.status === 'error' && <span class="muted"> {t.errorCode ?? ''}</span>}
                </td>
                <td class="hide-narrow">{new Date(t.startedAt).toLocaleString()}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
      {list.data && !all.length && (
        <p class="muted">No operations yet: every create, snapshot, restore, reset and rm is traced.</p>
      )}
    </>
  );
}

export function OperationsPage({ id }: { id?: string }) {
  return (
    <>
      <h1>Operations</h1>
      {id && <TraceView id={id} />}
      <Section title="Recent operations">
        <TraceList />
      </Section>
    </>
  );
}
