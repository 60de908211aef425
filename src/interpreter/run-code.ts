/**
 * One execution in a sandbox's code interpreter (its default Python context), read whole: what a
 * front that answers once (the MCP server's run_code) needs. The E2B front streams the same
 * server's lines to its client as they come instead (e2b/interpreter.ts).
 */
import { request } from 'node:http';
import type { Socket } from 'node:net';
import { createInterface } from 'node:readline';
import { SnaplabError } from '../errors.js';
import type { SandboxApi } from '../sdk/api.js';
import { tunnel, type Interpreters } from './server.js';

/** A result of the execution: its MIME bundle as the server gives it (`text`, `png` as base64, …). */
export type CodeResult = Record<string, unknown> & { is_main_result?: boolean; text?: string; png?: string };

export interface Execution {
  stdout: string;
  stderr: string;
  results: CodeResult[];
  error: { name: string; value: string; traceback: string } | null;
  executionCount: number | null;
  /** the kernel died while it ran */
  crashed: boolean;
}

interface Line {
  type: string;
  text?: string;
  name?: string;
  value?: string;
  traceback?: string;
  execution_count?: number;
}

function collect(into: Execution, l: Line & CodeResult): void {
  if (l.type === 'stdout') into.stdout += l.text ?? '';
  else if (l.type === 'stderr') into.stderr += l.text ?? '';
  else if (l.type === 'result') {
    const { type: _, ...bundle } = l;
    into.results.push(bundle);
  } else if (l.type === 'error')
    into.error = { name: l.name ?? '', value: l.value ?? '', traceback: l.traceback ?? '' };
  else if (l.type === 'number_of_executions') into.executionCount = l.execution_count ?? null;
  else if (l.type === 'unexpected_end_of_execution') into.crashed = true;
}

/**
 * Run `code` in the sandbox's interpreter (started first if it is not running); the kernel is
 * interrupted (its state kept) when `timeoutMs` passes, and TIMEOUT is thrown.
 */
export async function runCode(
  box: SandboxApi,
  interpreters: Interpreters,
  code: string,
  opts: { timeoutMs?: number } = {},
): Promise<Execution> {
  await interpreters.ensure(box);
  const conn = await tunnel(box);
  const body = Buffer.from(JSON.stringify({ code }));
  const out: Execution = { stdout: '', stderr: '', results: [], error: null, executionCount: null, crashed: false };
  const timer = opts.timeoutMs ? setTimeout(() => conn.destroy(timedOut(opts.timeoutMs!)), opts.timeoutMs) : undefined;
  try {
    await new Promise<void>((resolve, reject) => {
      const req = request({
        method: 'POST',
        path: '/execute',
        headers: { 'content-type': 'application/json', 'content-length': body.length, connection: 'close' },
        createConnection: () => conn as unknown as Socket,
      });
      req.on('error', (e) => reject(failed(box, e)));
      req.on('response', (res) => {
        if (res.statusCode !== 200) {
          res.resume();
          return reject(failed(box, new Error(`the server answered ${res.statusCode}`)));
        }
        const lines = createInterface({ input: res });
        // what comes from inside the machine is checked: its root may answer in the server's place
        lines.on('line', (t) => {
          if (!t) return;
          const line = parseLine(t);
          if (line) collect(out, line);
          else reject(failed(box, new Error(`the server sent a line that is not an object: ${t.slice(0, 80)}`)));
        });
        lines.once('close', resolve);
        res.once('error', (e) => reject(failed(box, e)));
      });
      conn.once('error', (e) => reject(e instanceof SnaplabError ? e : failed(box, e)));
      req.end(body);
    });
  } catch (e) {
    if (!(e instanceof SnaplabError && e.code === 'TIMEOUT')) interpreters.forget(box.id); // probed again next time
    throw e;
  } finally {
    clearTimeout(timer);
    conn.destroy();
  }
  return out;
}

function parseLine(t: string): (Line & CodeResult) | undefined {
  try {
    const v = JSON.parse(t) as unknown;
    return v !== null && typeof v === 'object' && !Array.isArray(v) && typeof (v as Line).type === 'string'
      ? (v as Line & CodeResult)
      : undefined;
  } catch {
    return undefined;
  }
}

const timedOut = (ms: number): SnaplabError =>
  new SnaplabError(
    'TIMEOUT',
    `the code ran past ${ms} ms: the kernel was interrupted, its state kept`,
    'give a longer timeout, or run less at once',
  );

const failed = (box: SandboxApi, e: Error): SnaplabError =>
  new SnaplabError('AGENT_ERROR', `the code interpreter in ${box.id}: ${e.message}`, 'try again', { cause: e });
