import { SnaplabError } from '../errors.js';

/** Exit code for snaplab's own failures; `exec` and `run` use 125 so they cannot be mistaken for the command's. */
export const EXIT_USAGE = 2;
export const EXIT_EXEC_FAILURE = 125;

export function printJson(v: unknown): void {
  process.stdout.write(`${JSON.stringify(v, null, 2)}\n`);
}

/** A plain text table with padded columns. */
export function table(headers: string[], rows: (string | number | null | undefined)[][]): string {
  const cells = [headers, ...rows.map((r) => r.map((c) => (c === null || c === undefined ? '-' : String(c))))];
  const widths = headers.map((_, i) => Math.max(...cells.map((r) => (r[i] ?? '').length)));
  return cells.map((r) => r.map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i]!))).join('  ')).join('\n');
}

export function printTable(headers: string[], rows: (string | number | null | undefined)[][]): void {
  process.stdout.write(`${table(headers, rows)}\n`);
}

/** Print an error the way users should see it: code, message, hint; a stack only for bugs. */
export function reportError(e: unknown, json: boolean): void {
  if (e instanceof SnaplabError) {
    const op = (e as SnaplabError & { operationId?: string }).operationId;
    if (json) {
      process.stderr.write(`${JSON.stringify({ error: { ...e.toJSON(), ...(op ? { operation: op } : {}) } })}\n`);
    } else {
      process.stderr.write(`error[${e.code}]: ${e.message}\n`);
      if (e.hint) process.stderr.write(`hint: ${e.hint}\n`);
      if (op) process.stderr.write(`trace: snaplab trace ${op}\n`);
    }
    return;
  }
  const err = e as Error;
  process.stderr.write(
    `error[INTERNAL]: ${err?.message ?? String(e)}\n${err?.stack ?? ''}\nhint: this is a bug in snaplab; please report it with the output above\n`,
  );
}

export function ms(n: number): string {
  return n >= 100 ? `${n.toFixed(0)} ms` : `${n.toFixed(1)} ms`;
}
