import { createConnection, type Socket } from 'node:net';
import { SnaplabError } from '../../errors.js';
import type { Trace } from '../../timing/trace.js';
import { deadline } from '../../timing/deadline.js';

interface Pending {
  resolve(v: unknown): void;
  reject(e: Error): void;
  command: string;
}

/**
 * A QMP client (QEMU's JSON machine protocol): the greeting, `qmp_capabilities`, then
 * `execute` with ids. QMP errors become SnaplabErrors naming the command and QEMU's words; each
 * call can be timed into a trace.
 */
export class QmpClient {
  private readonly pending = new Map<string, Pending>();
  private readonly events: { event: string; data: unknown }[] = [];
  private buf = '';
  private next = 1;

  private constructor(private readonly socket: Socket) {
    socket.setEncoding('utf8');
    socket.on('data', (d: string) => this.onData(d));
    socket.on('close', () => {
      for (const p of this.pending.values())
        p.reject(
          new SnaplabError(
            'VM_ERROR',
            `QMP connection closed during ${p.command}`,
            'the VM process exited: see its log',
          ),
        );
      this.pending.clear();
    });
    socket.on('error', () => undefined);
  }

  /** Connect (retrying until QEMU has made the socket), read the greeting, negotiate capabilities. */
  static async connect(path: string, timeoutMs = 10_000): Promise<QmpClient> {
    const end = Date.now() + timeoutMs;
    for (;;) {
      try {
        const socket = await new Promise<Socket>((resolve, reject) => {
          const s = createConnection(path);
          s.once('connect', () => resolve(s));
          s.once('error', reject);
        });
        const qmp = new QmpClient(socket);
        await qmp.greeting(Math.max(100, end - Date.now()));
        await qmp.execute('qmp_capabilities');
        return qmp;
      } catch (e) {
        if (Date.now() > end)
          throw new SnaplabError(
            'VM_ERROR',
            `no QMP at ${path}: ${(e as Error).message}`,
            'the VM did not start: see its log',
            { cause: e },
          );
        await new Promise((r) => setTimeout(r, 20));
      }
    }
  }

  private greetingSeen = false;
  private greetingWaiters: (() => void)[] = [];

  private greeting(timeoutMs: number): Promise<void> {
    if (this.greetingSeen) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const t = deadline(timeoutMs, () => reject(new Error('no QMP greeting')));
      this.greetingWaiters.push(() => {
        t.clear();
        resolve();
      });
    });
  }

  private onData(d: string): void {
    this.buf += d;
    let nl: number;
    while ((nl = this.buf.indexOf('\n')) >= 0) {
      const line = this.buf.slice(0, nl).trim();
      this.buf = this.buf.slice(nl + 1);
      if (!line) continue;
      let msg: Record<string, unknown>;
      try {
        msg = JSON.parse(line) as Record<string, unknown>;
      } catch {
        continue;
      }
      if ('QMP' in msg) {
        this.greetingSeen = true;
        for (const w of this.greetingWaiters.splice(0)) w();
      } else if ('event' in msg) {
        this.events.push({ event: String(msg.event), data: msg.data });
      } else if ('id' in msg) {
        const p = this.pending.get(String(msg.id));
        if (!p) continue;
        this.pending.delete(String(msg.id));
        if ('error' in msg) {
          const err = msg.error as { class?: string; desc?: string };
          p.reject(
            new SnaplabError(
              'VM_ERROR',
              `QMP ${p.command}: ${err.desc ?? 'error'} (${err.class ?? '?'})`,
              'see the VM log',
            ),
          );
        } else p.resolve(msg.return);
      }
    }
  }

  /** Run one QMP command; with a trace, the call is a phase named `qmp COMMAND`. */
  execute<T = unknown>(command: string, args?: Record<string, unknown>, trace?: Trace): Promise<T> {
    const call = (): Promise<T> =>
      new Promise<T>((resolve, reject) => {
        if (this.socket.destroyed || !this.socket.writable) {
          reject(
            new SnaplabError(
              'VM_ERROR',
              `QMP connection closed before ${command}`,
              'the VM process exited: see its log',
            ),
          );
          return;
        }
        const id = String(this.next++);
        this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject, command });
        this.socket.write(
          `${JSON.stringify(args ? { execute: command, arguments: args, id } : { execute: command, id })}\n`,
        );
      });
    return trace ? trace.phase(`qmp ${command}`, call) : call();
  }

  /** Poll `query-migrate` until the migration completes or fails. */
  async waitMigration(timeoutMs: number): Promise<Record<string, unknown>> {
    const end = Date.now() + timeoutMs;
    const started = Date.now();
    for (;;) {
      const st = await this.execute<Record<string, unknown>>('query-migrate');
      if (st.status === 'completed') return st;
      // no status at all a second in: the migration never started (its stream could not be opened)
      if (st.status === undefined && Date.now() - started > 1000) {
        throw new SnaplabError(
          'VM_ERROR',
          'the migration did not start: its stream could not be read or written',
          "check the snapshot's memory file",
        );
      }
      if (st.status === 'failed' || st.status === 'cancelled') {
        throw new SnaplabError(
          'VM_ERROR',
          `migration ${String(st.status)}: ${String(st['error-desc'] ?? '')}`,
          'see the VM log',
        );
      }
      if (Date.now() > end)
        throw new SnaplabError(
          'TIMEOUT',
          `migration still ${String(st.status)} after ${timeoutMs} ms`,
          'see the VM log',
        );
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  close(): void {
    this.socket.destroy();
  }
}
