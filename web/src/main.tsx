/** The dashboard's shell: who the caller is (a key is asked for once on TCP), the navigation, the pages. */
import { Component, render, type ComponentChildren } from 'preact';
import { useState } from 'preact/hooks';
import { ApiError, adoptLinkKey, api, key, setKey } from './api';
import { ErrorBox } from './components';
import { href, usePoll, useRoute } from './hooks';
import { MachinesPage } from './pages/machines';
import { MachinePage } from './pages/machine';
import { OperationsPage } from './pages/operations';
import { PoolsPage } from './pages/pools';
import { ScenariosPage } from './pages/scenarios';
import { BenchPage } from './pages/bench';
import './style.css';

interface Who {
  key: string;
  scopes: string[];
}

const NAV: [string, string][] = [
  ['machines', 'Machines'],
  ['operations', 'Operations'],
  ['pools', 'Pools'],
  ['scenarios', 'Scenarios'],
  ['bench', 'Bench'],
];

function Login({ error, onKey }: { error: unknown; onKey: () => void }) {
  const [text, setText] = useState('');
  const [remember, setRemember] = useState(false);
  const wrong = error instanceof ApiError && error.status === 401 && key() !== null;
  return (
    <main class="login">
      <form
        class="card"
        onSubmit={(e) => {
          e.preventDefault();
          setKey(text.trim(), remember);
          onKey();
        }}
      >
        <h1>snaplab</h1>
        <p>
          This daemon asks for an API key (<code>snaplab key create NAME</code> prints one). Through{' '}
          <code>snaplab ui</code>, open the URL it printed instead: its token is only good while that{' '}
          <code>snaplab ui</code> runs.
        </p>
        {wrong && <ErrorBox error={error} />}
        <label>
          API key
          <input
            type="password"
            autoComplete="off"
            value={text}
            onInput={(e) => setText((e.target as HTMLInputElement).value)}
            required
            // biome-ignore lint/a11y/noAutofocus: the sign-in page holds this one field and nothing else to read first
            autoFocus
          />
        </label>
        <label class="inline">
          <input
            type="checkbox"
            checked={remember}
            onChange={(e) => setRemember((e.target as HTMLInputElement).checked)}
          />{' '}
          remember in this browser
        </label>
        <button type="submit" class="primary">
          Sign in
        </button>
      </form>
    </main>
  );
}

/** A page that throws while drawing shows the error, not a blank window. */
class Boundary extends Component<{ children: ComponentChildren }, { error: unknown }> {
  state = { error: undefined as unknown };
  componentDidCatch(error: unknown): void {
    this.setState({ error });
  }
  render() {
    if (!this.state.error) return this.props.children;
    return (
      <main class="page">
        <ErrorBox error={this.state.error} />
        <button
          type="button"
          onClick={() => {
            this.setState({ error: undefined });
            location.hash = '#/machines';
          }}
        >
          Back to machines
        </button>
      </main>
    );
  }
}

function App() {
  const route = useRoute();
  const who = usePoll(() => api<Who>('GET', '/whoami'));
  if (who.error instanceof ApiError && who.error.status === 401) return <Login error={who.error} onKey={who.reload} />;
  if (!who.data) return <main class="page">{who.error ? <ErrorBox error={who.error} /> : <p>connecting…</p>}</main>;
  const [page = 'machines', ...rest] = route;
  let body: ComponentChildren;
  if (page === 'machines' && rest[0]) body = <MachinePage id={rest[0]} tab={rest[1] ?? 'overview'} />;
  else if (page === 'machines') body = <MachinesPage />;
  else if (page === 'operations') body = <OperationsPage id={rest[0]} />;
  else if (page === 'pools') body = <PoolsPage />;
  else if (page === 'scenarios') body = <ScenariosPage name={rest[0]} />;
  else if (page === 'bench') body = <BenchPage name={rest[0]} />;
  else
    body = (
      <p>
        No page {page}. <a href={href('machines')}>Machines</a>
      </p>
    );
  return (
    <>
      <header class="top">
        <a class="brand" href={href('machines')}>
          snaplab
        </a>
        <nav aria-label="pages">
          {NAV.map(([id, label]) => (
            <a href={href(id)} aria-current={page === id ? 'page' : undefined}>
              {label}
            </a>
          ))}
        </nav>
        <span class="who" title={`scopes: ${who.data.scopes.join(', ')}`}>
          {who.data.key === 'local' ? 'local (Unix socket)' : `key ${who.data.key}`}
          {who.data.key !== 'local' && (
            <button
              type="button"
              class="link"
              onClick={() => {
                setKey(null);
                who.reload();
              }}
            >
              sign out
            </button>
          )}
        </span>
      </header>
      <main class="page">{body}</main>
    </>
  );
}

void adoptLinkKey().finally(() =>
  render(
    <Boundary>
      <App />
    </Boundary>,
    document.getElementById('app')!,
  ),
);
