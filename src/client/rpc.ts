/**
 * The client side of `/rpc`: one WebSocket, opened on first use and again after it closes, that
 * carries one-shot execs, pool runs and spawns (streamed commands) as numbered calls (docs/api.md).
 * A call whose connection closes before its end fails with DAEMON_UNREACHABLE; the daemon killed
 * its command.
 */
import type WebSocket from 'ws';
import { SnaplabError, type ErrorCode } from '../errors.js';
import type { Http } from './http.js';

type ErrorView = { code: ErrorCode; message: string; hint?: string; limit?: string };

/** A text frame of the daemon: a call's answer, or one of a spawn's events. */
export interface RpcAnswer {
  id: number;
  result?: unknown;
  error?: ErrorView;
  started?: { pid: number | null; process: string };
  gap?: { from: number; to: number };
  refused?: ErrorView;
}

/** A call waiting on the connection: its text frames, its binary frames (a spawn's), its loss. */
interface Waiting {
  /** true: the call has ended (forgotten) */
  answer(m: RpcAnswer): boolean;
  data?(kind: number, b: Buffer): void;
  lost(e: SnaplabError): void;
}

/** What a spawn is told: its events, from `started` to its end (`end` or `failed`). */
export interface SpawnEvents {
  started(pid: number): void;
  data(kind: number, b: Buffer): void;
  gap(): void;
  end(result: Record<string, unknown>): void;
  failed(e: SnaplabError): void;
}

/** A spawn's half of the connection: its input, its control calls, the socket's queue. */
export interface SpawnChannel {
  input(b: Buffer): boolean;
  control(m: Record<string, unknown>): void;
  drained(): Promise<void>;
}

const HEAD = 5;

export function errorOf(v: ErrorView): SnaplabError {
  const e = new SnaplabError(v.code, v.message, v.hint);
  if (v.limit) (e as SnaplabError & { limit?: string }).limit = v.limit;
  return e;
}

interface Conn {
  ws: WebSocket;
  calls: Map<number, Waiting>;
}

export class Rpc {
  private ws: Promise<Conn> | undefined;
  private next = 1;

  constructor(private readonly http: Http) {}

  /** The socket and the calls waiting on it (each connection its own: an old one's close fails only its calls). */
  private open(): Promise<Conn> {
    if (this.ws !== undefined) return this.ws;
    const opening = this.http.socket('/rpc').then((ws) => {
      const calls = new Map<number, Waiting>();
      ws.on('message', (data: Buffer, isBinary) => {
        if (isBinary) {
          if (data.length >= HEAD) calls.get(data.readUInt32BE(1))?.data?.(data[0]!, data.subarray(HEAD));
          return;
        }
        let m: RpcAnswer;
        try {
          m = JSON.parse(String(data));
        } catch {
          return; // not an answer
        }
        const c = calls.get(m.id);
        if (c?.answer(m)) calls.delete(m.id);
      });
      ws.on('close', () => {
        if (this.ws === opening) this.ws = undefined;
        const lost = [...calls.values()];
        calls.clear();
        for (const c of lost)
          c.lost(
            new SnaplabError(
              'DAEMON_UNREACHABLE',
              'the connection to the daemon closed before the answer',
              'its command was killed; try again',
            ),
          );
      });
      ws.on('error', () => {});
      return { ws, calls };
    });
    this.ws = opening;
    opening.catch(() => {
      if (this.ws === opening) this.ws = undefined;
    });
    return opening;
  }

  async call<T>(body: Record<string, unknown>): Promise<T> {
    const { ws, calls } = await this.open();
    const id = this.next++;
    return new Promise<T>((resolve, reject) => {
      calls.set(id, {
        answer: (m) => {
          if (m.error) reject(errorOf(m.error));
          else resolve(m.result as T);
          return true;
        },
        lost: reject,
      });
      ws.send(JSON.stringify({ ...body, id }));
    });
  }

  /**
   * Start a spawn (`{op: 'spawn', sandbox, argv, …}`): its events go to `on`; the channel sends
   * its input and control calls. Resolves once it is sent (its `started` comes as an event).
   */
  async spawn(body: Record<string, unknown>, on: SpawnEvents): Promise<SpawnChannel> {
    const { ws, calls } = await this.open();
    const id = this.next++;
    calls.set(id, {
      answer: (m) => {
        if (m.started) on.started(m.started.pid ?? 0);
        else if (m.gap) on.gap();
        // a control call refused: the command runs on
        else if (m.refused) return false;
        else if (m.error) on.failed(errorOf(m.error));
        else if (m.result) on.end(m.result as Record<string, unknown>);
        return m.error !== undefined || m.result !== undefined;
      },
      data: (kind, b) => on.data(kind, b),
      lost: (e) => on.failed(e),
    });
    ws.send(JSON.stringify({ ...body, op: 'spawn', id }));
    const open = (): boolean => ws.readyState === ws.OPEN && calls.has(id);
    return {
      input: (b) => {
        if (!open()) return true;
        const head = Buffer.allocUnsafe(HEAD);
        head[0] = 0;
        head.writeUInt32BE(id, 1);
        ws.send(Buffer.concat([head, b]));
        return ws.bufferedAmount < 4 << 20;
      },
      control: (m) => {
        if (open()) ws.send(JSON.stringify({ ...m, id }));
      },
      drained: () => drained(ws),
    };
  }

  close(): void {
    void this.ws?.then(
      ({ ws }) => ws.close(),
      () => undefined,
    );
    this.ws = undefined;
  }
}

/** Resolves once the socket holds less than 2 MiB unsent (or is closed): stdin's flow control. */
function drained(ws: WebSocket): Promise<void> {
  if (ws.readyState !== ws.OPEN || ws.bufferedAmount < 2 << 20) return Promise.resolve();
  return new Promise<void>((resolve) => {
    const t = setInterval(() => {
      if (ws.readyState !== ws.OPEN || ws.bufferedAmount < 2 << 20) {
        clearInterval(t);
        resolve();
      }
    }, 5);
  });
}
