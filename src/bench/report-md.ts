import { compareLines, fitLines, formatPhases, headline, rungRows } from './report-text.js';
import type { BenchSummary } from './summary.js';

const esc = (s: string): string => s.replace(/\|/g, '\\|');
const row = (cells: string[]): string => `| ${cells.map(esc).join(' | ')} |`;

/** summary.md: the per-rung table with the baselines beside it, the fit, the comparison, the phases. */
export function renderMarkdown(s: BenchSummary): string {
  const { headers, rows } = rungRows(s);
  const out = [`# snaplab bench: ${s.workload}`, '', `${headline(s)}; started ${s.startedAt}`, ''];
  out.push(row(headers), row(headers.map(() => '---')), ...rows.map(row), '');
  out.push(...fitLines(s).map((l) => `- ${l}`), '');
  if (s.compare) {
    const [title, ...rest] = compareLines(s);
    out.push(`## ${title!.replace(/:$/, '')}`, '');
    out.push(
      row(['concurrency', 'A /s (reps)', 'B /s (reps)', 'overlap', 'verdict']),
      row(['---', '---', '---', '---', '---']),
    );
    for (const r of s.compare.rungs) {
      out.push(
        row([
          String(r.concurrency),
          `${r.a.throughput} (${r.a.throughputReps.join(', ')})`,
          `${r.b.throughput} (${r.b.throughputReps.join(', ')})`,
          r.overlap ? 'yes' : 'no',
          r.verdict,
        ]),
      );
    }
    out.push('', ...rest.slice(-1).map((l) => l.trim()), '');
  }
  const withPhases = s.rungs.filter((r) => Object.keys(r.phasesMs).length);
  if (withPhases.length) {
    out.push('## Phase medians (ms)', '', row(['concurrency', 'phases']), row(['---', '---']));
    for (const r of withPhases) out.push(row([`${r.concurrency}${s.compare ? ' (A)' : ''}`, formatPhases(r.phasesMs)]));
    for (const r of s.compare?.rungs ?? [])
      if (Object.keys(r.b.phasesMs).length) out.push(row([`${r.concurrency} (B)`, formatPhases(r.b.phasesMs)]));
    out.push('');
  }
  for (const note of s.notes ?? []) out.push(`> ${note}`, '');
  return `${out.join('\n').trimEnd()}\n`;
}
