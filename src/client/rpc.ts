/**
 * The client side of `/rpc`: one WebSocket, opened on first use and again after it closes, that
 * carries one-shot execs and pool runs as numbered calls (docs/api.md). A call whose connection
 * closes before its answer fails with DAEMON_UNREACHABLE; the daemon killed its command.
 */
import type WebSocket from 'ws';
import { SnaplabError, type ErrorCode } from '../errors.js';
import type { Http } from './http.js';

interface Pending {
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
}

export class Rpc {
  private ws: Promise<{ ws: WebSocket; pending: Map<number, Pending> }> | undefined;
  private next = 1;

  constructor(private readonly http: Http) {}

  /** The socket and the calls waiting on it (each connection its own: an old one's close fails only its calls). */
  private open(): Promise<{ ws: WebSocket; pending: Map<number, Pending> }> {
    if (this.ws !== undefined) return this.ws;
    const opening = this.http.socket('/rpc').then((ws) => {
      const pending = new Map<number, Pending>();
      ws.on('message', (data) => {
        let m: {
          id: number;
          result?: unknown;
          error?: { code: ErrorCode; message: string; hint?: string; limit?: string };
        };
        try {
          m = JSON.parse(String(data));
        } catch {
          return; // not an answer
        }
        const p = pending.get(m.id);
        if (!p) return;
        pending.delete(m.id);
        if (m.error) {
          const e = new SnaplabError(m.error.code, m.error.message, m.error.hint);
          if (m.error.limit) (e as SnaplabError & { limit?: string }).limit = m.error.limit;
          p.reject(e);
        } else p.resolve(m.result);
      });
      ws.on('close', () => {
        if (this.ws === opening) this.ws = undefined;
        const lost = [...pending.values()];
        pending.clear();
        for (const p of lost)
          p.reject(
            new SnaplabError(
              'DAEMON_UNREACHABLE',
              'the connection to the daemon closed before the answer',
              'its command was killed; try again',
            ),
          );
      });
      ws.on('error', () => {});
      return { ws, pending };
    });
    this.ws = opening;
    opening.catch(() => {
      if (this.ws === opening) this.ws = undefined;
    });
    return opening;
  }

  async call<T>(body: Record<string, unknown>): Promise<T> {
    const { ws, pending } = await this.open();
    const id = this.next++;
    return new Promise<T>((resolve, reject) => {
      pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
      ws.send(JSON.stringify({ ...body, id }));
    });
  }

  close(): void {
    void this.ws?.then(
      ({ ws }) => ws.close(),
      () => undefined,
    );
    this.ws = undefined;
  }
}
