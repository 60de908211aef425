// biome-ignore-all lint/a11y/useSemanticElements: each row is a CSS grid that lines its bar up with the axis above; a <table> would lay it out as table cells, so the ARIA table roles carry the semantics
// biome-ignore-all lint/a11y/useFocusableInteractive: the rows are read, not operated: nothing in them takes focus
/**
 * An operation's phases on one time axis, as `snaplab trace` prints them: one row per phase
 * (nested phases indented), its bar from start to end, its duration; then the time no top-level
 * phase covered (unattributed), so the bars never claim more than was measured.
 */
import type { Trace } from './api';
import { ms } from './format';

function ticks(total: number): number[] {
  if (!(total > 0)) return [0];
  const raw = total / 5;
  const step =
    [1, 2, 5].map((m) => m * 10 ** Math.floor(Math.log10(raw))).find((s) => s >= raw) ??
    10 ** Math.ceil(Math.log10(raw));
  const out: number[] = [];
  for (let t = 0; t <= total + 1e-9; t += step) out.push(t);
  return out;
}

export function Waterfall({ trace }: { trace: Trace }) {
  const total = Math.max(trace.totalMs, ...trace.phases.map((p) => p.endMs), 0.001);
  const pct = (x: number): string => `${Math.max(0, Math.min(100, (x / total) * 100))}%`;
  const width = (a: number, b: number): string => `${Math.max(0, ((b - a) / total) * 100)}%`;
  return (
    <div
      class="wf"
      role="table"
      aria-label={`phases of ${trace.kind} ${trace.target ?? ''}`}
      data-testid="waterfall"
      data-total={trace.totalMs}
    >
      <div class="wf-axis" aria-hidden="true">
        <span />
        <div class="wf-ticks">
          {ticks(total).map((t) => (
            <span style={{ left: pct(t) }}>{ms(t)}</span>
          ))}
        </div>
        <span />
      </div>
      {trace.phases.map((p) => (
        <div
          class={`wf-row${p.depth > 0 ? ' nested' : ''}`}
          role="row"
          data-phase={p.name}
          data-start={p.startMs}
          data-end={p.endMs}
          data-depth={p.depth}
        >
          <span class="wf-name" role="cell" style={{ paddingLeft: `${p.depth * 14}px` }} title={p.name}>
            {p.name}
          </span>
          <div class="wf-track" role="cell" aria-label={`${ms(p.startMs)} to ${ms(p.endMs)}`}>
            <div class="wf-bar" style={{ left: pct(p.startMs), width: width(p.startMs, p.endMs) }} />
          </div>
          <span class="wf-ms" role="cell">
            {ms(p.endMs - p.startMs)}
          </span>
        </div>
      ))}
      <div class="wf-row unattributed" role="row" data-unattributed={trace.unattributedMs}>
        <span class="wf-name muted" role="cell" title="time inside the operation that no top-level phase covers">
          unattributed
        </span>
        <div class="wf-track" role="cell">
          <div class="wf-bar" style={{ left: '0%', width: width(0, trace.unattributedMs) }} />
        </div>
        <span class="wf-ms" role="cell">
          {ms(trace.unattributedMs)}
        </span>
      </div>
      <div class="wf-row" role="row">
        <strong class="wf-name" role="cell">
          total
        </strong>
        <span role="cell" />
        <strong class="wf-ms" role="cell">
          {ms(trace.totalMs)}
        </strong>
      </div>
    </div>
  );
}

/** A failed operation's error, with its code and hint when it had them. */
export function TraceError({ trace }: { trace: Trace }) {
  if (trace.status !== 'error') return null;
  return (
    <div class="error" role="alert">
      <strong>{trace.errorCode ? `error[${trace.errorCode}]` : 'error'}</strong>: {trace.error}
      {trace.errorHint && <div class="hint">hint: {trace.errorHint}</div>}
    </div>
  );
}
