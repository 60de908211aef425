import type { TraceSummary } from './trace.js';

const fmt = (ms: number): string => (ms >= 100 ? ms.toFixed(0) : ms >= 10 ? ms.toFixed(1) : ms.toFixed(2));

/** Render a trace as a text waterfall: one row per phase, a bar placed on the operation's timeline. */
export function renderWaterfall(t: TraceSummary, width = 40): string {
  const total = Math.max(t.totalMs, 1e-6);
  const nameWidth = Math.max(12, ...t.phases.map((p) => p.name.length + p.depth * 2)) + 1;
  const lines = [
    `${t.kind} ${t.target ?? ''}  ${t.id}  total ${fmt(t.totalMs)} ms  ${t.status}${t.error ? `: ${t.error}` : ''}`,
  ];
  lines.push(`${'phase'.padEnd(nameWidth)} ${'start'.padStart(8)} ${'ms'.padStart(8)}  timeline`);
  for (const p of t.phases) {
    const a = Math.floor((p.startMs / total) * width);
    const b = Math.max(a + 1, Math.round((p.endMs / total) * width));
    const bar = ' '.repeat(a) + '█'.repeat(Math.min(b, width) - a);
    const name = `${'  '.repeat(p.depth)}${p.name}`.padEnd(nameWidth);
    // a best-effort step that failed (a mark, src/cleanup.ts): what it said instead of a bar
    if (p.failed !== undefined)
      lines.push(`${name} ${fmt(p.startMs).padStart(8)} ${'failed'.padStart(8)}  ${p.failed}`);
    else
      lines.push(
        `${name} ${fmt(p.startMs).padStart(8)} ${fmt(p.endMs - p.startMs).padStart(8)}  |${bar.padEnd(width)}|`,
      );
  }
  lines.push(`${'(unattributed)'.padEnd(nameWidth)} ${''.padStart(8)} ${fmt(t.unattributedMs).padStart(8)}`);
  return lines.join('\n');
}
