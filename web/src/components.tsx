import type { ComponentChildren } from 'preact';
import { ApiError } from './api';

/** An error as the CLI prints it: code, message, hint. */
export function ErrorBox({ error }: { error: unknown }) {
  if (!error) return null;
  const e = error instanceof ApiError ? error : undefined;
  return (
    <div class="error" role="alert">
      <strong>{e ? `error[${e.code}]` : 'error'}</strong>: {error instanceof Error ? error.message : String(error)}
      {e?.hint && <div class="hint">hint: {e.hint}</div>}
    </div>
  );
}

export function Button({
  onClick,
  busy,
  children,
  kind,
  disabled,
  label,
}: {
  onClick: () => void;
  busy?: boolean;
  children: ComponentChildren;
  kind?: 'danger' | 'primary';
  disabled?: boolean;
  label?: string;
}) {
  return (
    <button
      type="button"
      class={kind ?? ''}
      onClick={onClick}
      disabled={busy || disabled}
      aria-busy={busy ? 'true' : undefined}
      aria-label={label}
    >
      {children}
      {busy && '…'}
    </button>
  );
}

export function State({ state }: { state: string }) {
  return <span class={`state state-${state}`}>{state}</span>;
}

export function Section({
  title,
  children,
  actions,
}: {
  title: string;
  children: ComponentChildren;
  actions?: ComponentChildren;
}) {
  return (
    <section class="card">
      <header class="card-head">
        <h2>{title}</h2>
        {actions && <div class="actions">{actions}</div>}
      </header>
      {children}
    </section>
  );
}
