/**
 * Streamed execs and background processes. `GET /sandboxes/{id}/exec` (WebSocket) starts a command
 * from its first message and streams it; every such command is also a process with an id, so a
 * client that lost its connection reattaches at `GET /sandboxes/{id}/processes/{pid}/attach?offset=N`
 * and misses nothing the ring still holds (a gap is reported when it does not). See docs/api.md
 * for the frames. A gateway passes these to the sandbox's node, its WebSockets joined byte for
 * byte (sandbox-calls.ts).
 */
import type { FastifyInstance } from 'fastify';
import type { WebSocket } from 'ws';
import { Type } from 'typebox';
import { SnaplabError } from '../errors.js';
import { constants } from 'node:os';
import type { Daemon, ProcessSpec } from './daemon.js';
import { servedBy, socketServedBy, type SandboxCalls } from './sandbox-calls.js';
import type { Caller } from './keys.js';
import type { Chunk, Process } from './processes.js';
import { toSnaplab } from './http-errors.js';
import { IdParams, ProcessBody, errors } from './schemas.js';
import { streamBody } from './routes-files.js';
import { failureMeans, handledElsewhere } from '../cleanup.js';

const STREAM_BYTE = { stdout: 1, stderr: 2 } as const;
// a reader is sent no more while this much waits in its socket (it stays below the ring's 1 MiB)
const HIGH = 512 << 10;
const LOW = 128 << 10;
/** how long a reader that does not read may hold a command's output */
const HOLD_MAX_MS = 30_000;

/** A signal by number or name (`TERM`, `SIGTERM`), from Node's own table. */
export function signalNumber(s: unknown): number {
  const named =
    constants.signals[`SIG${String(s).replace(/^SIG/i, '').toUpperCase()}` as keyof typeof constants.signals];
  const n = typeof s === 'number' ? s : (named ?? Number(s));
  if (!Number.isInteger(n) || n < 0 || n > 64)
    throw new SnaplabError(
      'BAD_INPUT',
      `unknown signal ${JSON.stringify(s)}`,
      'give a number or a name such as TERM, INT, KILL, HUP',
    );
  return n;
}

const send = (ws: WebSocket, msg: Record<string, unknown>): void => {
  if (ws.readyState === ws.OPEN) ws.send(JSON.stringify(msg));
};

function exitMessage(p: Process): Record<string, unknown> {
  const i = p.info();
  return { type: 'exit', process: p.id, result: i.result, error: i.error, end: i.output.end };
}

/**
 * Send a process's output from `offset` on to a socket, then its exit. A socket that does not keep
 * up is sent no more until its queue has drained below LOW, and the command's output is held at
 * its source meanwhile, so the reader misses nothing; it continues from the ring (a gap only if the
 * ring moved past it before the hold took: output of a command nobody was reading).
 */
function pump(p: Process, ws: WebSocket, offset: number, onExitSent?: () => void): void {
  let next = offset;
  let waiting = false;
  let poll: NodeJS.Timeout | undefined;
  const sendChunk = (c: Chunk): void => {
    if (c.offset + c.data.length <= next) return;
    const data = c.offset < next ? c.data.subarray(next - c.offset) : c.data;
    ws.send(Buffer.concat([Buffer.of(STREAM_BYTE[c.stream]), data]));
    next = c.offset + c.data.length;
  };
  const catchUp = (): void => {
    const { chunks, gap } = p.ring.from(next);
    if (gap) {
      send(ws, { type: 'gap', from: gap.from, to: gap.to });
      next = gap.to;
    }
    for (const c of chunks) sendChunk(c);
  };
  const resume = (): void => {
    if (poll) clearInterval(poll);
    poll = undefined;
    if (waiting) p.hold(false);
    waiting = false;
  };
  const onChunk = (c: Chunk): void => {
    if (waiting || ws.readyState !== ws.OPEN) return;
    if (ws.bufferedAmount > HIGH) {
      // hold the command's output at its source until this reader has caught up
      waiting = true;
      p.hold(true);
      const since = Date.now();
      poll = setInterval(() => {
        if (ws.readyState !== ws.OPEN) return resume();
        // a reader that reads nothing for this long lets go of the command: it may reattach from its offset
        if (Date.now() - since > HOLD_MAX_MS) {
          resume();
          return void ws.close(1008, 'reader too slow: reattach from your offset');
        }
        if (ws.bufferedAmount > LOW) return;
        resume();
        catchUp();
        if (p.ended) finish();
      }, 20);
      return;
    }
    if (c.offset > next) catchUp();
    else sendChunk(c);
  };
  const finish = (): void => {
    if (waiting || ws.readyState !== ws.OPEN) return;
    catchUp();
    send(ws, exitMessage(p));
    onExitSent?.();
    ws.close(1000, 'exited');
  };
  const detach = (): void => {
    resume();
    p.off('chunk', onChunk);
    p.off('exit', finish);
  };
  if (ws.readyState !== ws.OPEN) return;
  catchUp();
  if (p.ended) {
    finish();
    return;
  }
  p.on('chunk', onChunk);
  p.once('exit', finish);
  ws.once('close', detach);
}

/** What a client sends: binary frames are stdin; text frames are {type: eof|signal|resize}. `held`: what came before. */
function control(p: Process, ws: WebSocket, held: [Buffer, boolean][] = []): void {
  const onMessage = (data: Buffer, isBinary: boolean): void => {
    const h = p.handle;
    if (!h || p.ended) return;
    try {
      if (isBinary) {
        if (!h.write(data as Buffer)) {
          ws.pause();
          // never rejects: it resolves when the input drains or the connection to the agent is gone
          void h.drained().then(() => ws.resume());
        }
        return;
      }
      const m = JSON.parse(String(data)) as { type?: string; signal?: unknown; cols?: number; rows?: number };
      if (m.type === 'eof') h.end();
      else if (m.type === 'signal') h.kill(signalNumber(m.signal));
      else if (m.type === 'resize' && Number.isInteger(m.cols) && Number.isInteger(m.rows)) h.resize(m.cols!, m.rows!);
      else
        throw new SnaplabError(
          'BAD_INPUT',
          `unknown message ${JSON.stringify(m.type)}`,
          'send binary frames for stdin, or {"type": "eof" | "signal" | "resize"}',
        );
    } catch (e) {
      send(ws, { type: 'error', error: toSnaplab(e).toJSON() });
    }
  };
  for (const [data, isBinary] of held) onMessage(data, isBinary);
  ws.on('message', onMessage);
}

/**
 * A socket's messages from its first on: the first (the start message) as JSON, and whatever
 * came after it while the command was being started, held until `control` takes them (stdin sent
 * right behind the start message must not be lost).
 */
function startMessage(ws: WebSocket): { first: Promise<unknown>; take(): [Buffer, boolean][] } {
  const later: [Buffer, boolean][] = [];
  let first: ((v: [Buffer, boolean]) => void) | undefined;
  const got = new Promise<[Buffer, boolean]>((resolve) => (first = resolve));
  const onMessage = (data: Buffer, isBinary: boolean): void => {
    if (first) {
      first([data, isBinary]);
      first = undefined;
    } else later.push([data, isBinary]);
  };
  ws.on('message', onMessage);
  const parsed = new Promise<unknown>((resolve, reject) => {
    const timer = setTimeout(
      () =>
        reject(
          new SnaplabError('TIMEOUT', 'no start message within 30 s', 'send {"type": "start", "argv": [...]} first'),
        ),
      30_000,
    );
    timer.unref();
    ws.once('close', () => {
      clearTimeout(timer);
      reject(new SnaplabError('ABORTED', 'closed before it started'));
    });
    void got.then(([data, isBinary]) => {
      clearTimeout(timer);
      try {
        if (isBinary) throw new Error('binary');
        resolve(JSON.parse(String(data)));
      } catch (e) {
        reject(
          new SnaplabError(
            'BAD_INPUT',
            'the first message must be JSON: {"type": "start", "argv": [...]}',
            'see docs/api.md, streaming exec',
            { cause: e },
          ),
        );
      }
    });
  });
  const take = (): [Buffer, boolean][] => {
    ws.off('message', onMessage);
    return later.splice(0);
  };
  return { first: parsed, take };
}

function refuse(ws: WebSocket, e: unknown): void {
  send(ws, { type: 'error', fatal: true, error: toSnaplab(e).toJSON() });
  ws.close(1008, toSnaplab(e).code);
}

/** A start message's fields, checked as the REST body's schema checks them. */
function processSpec(m: Record<string, unknown>): ProcessSpec {
  const bad = (what: string): never => {
    throw new SnaplabError('BAD_INPUT', `invalid ${what} in the start message`, 'see docs/api.md, streaming exec');
  };
  const str = (v: unknown, what: string): string | undefined =>
    v === undefined ? undefined : typeof v === 'string' ? v : bad(what);
  const env =
    m.env === undefined
      ? undefined
      : typeof m.env === 'object' && m.env && Object.values(m.env).every((v) => typeof v === 'string')
        ? (m.env as Record<string, string>)
        : bad('env');
  const timeoutMs =
    m.timeoutMs === undefined
      ? undefined
      : Number.isSafeInteger(m.timeoutMs) && (m.timeoutMs as number) >= 0
        ? (m.timeoutMs as number)
        : bad('timeoutMs');
  const t = m.tty as { cols?: unknown; rows?: unknown } | undefined;
  const size = (v: unknown): boolean => Number.isInteger(v) && (v as number) >= 1 && (v as number) <= 65535;
  const tty =
    t === undefined
      ? undefined
      : typeof t === 'object' && size(t.cols) && size(t.rows)
        ? { cols: t.cols as number, rows: t.rows as number }
        : bad('tty');
  const tag = str(m.tag, 'tag');
  if (m.waitOutput !== undefined && typeof m.waitOutput !== 'boolean') bad('waitOutput');
  if (tag !== undefined && [...tag].length > 1024) bad('tag (at most 1024 characters)');
  return {
    argv: m.argv as string[],
    tag,
    env,
    cwd: str(m.cwd, 'cwd'),
    user: str(m.user, 'user'),
    timeoutMs,
    tty,
    stdin: m.stdin === true,
    waitOutput: m.waitOutput === true,
    keep: m.keep === true,
  };
}

const ProcParams = Type.Object({ id: Type.String(), pid: Type.String() });

const tags = ['processes'];
const info = Type.Object({}, { additionalProperties: true });

/** An offset of the process's output, refused past its end: nothing would ever be sent from there. */
function within(p: Process, offset: number): number {
  if (offset > p.ring.total)
    throw new SnaplabError(
      'BAD_INPUT',
      `offset ${offset} is past the end of process ${p.id}'s output (${p.ring.total} bytes)`,
      'ask from an offset you were given (`next`, `output.end`, or the bytes received)',
    );
  return offset;
}

/** A process of a sandbox the caller may see (else not found). */
async function procOf(d: Daemon, caller: Caller, id: string, pid: string): Promise<Process> {
  const box = await d.find(id, caller);
  // one a previous daemon started is found in its machine the first time (kept.ts)
  if (!d.processes.has(box.id, pid) && (box.state === 'running' || box.state === 'paused'))
    await d.processesOf(await d.sandbox(box.id, caller));
  return d.processes.get(box.id, pid);
}

export async function streamRoutes(app: FastifyInstance, s: SandboxCalls): Promise<void> {
  execStreamRoute(app, s);
  attachRoute(app, s);
  processRoutes(app, s);
  outputRoute(app, s);
  processInputRoutes(app, s);
}

function execStreamRoute(app: FastifyInstance, s: SandboxCalls): void {
  app.get(
    '/sandboxes/:id/exec',
    {
      websocket: true,
      schema: {
        hide: true,
        tags,
        summary:
          'Streaming exec (WebSocket): first message {type:"start", argv, tty?, stdin?, env?, cwd?, user?, timeoutMs?, waitOutput?, tag?, keep?, onDisconnect?: "keep"|"kill"}',
        params: IdParams,
      },
    },
    socketServedBy(s, (d) => (ws, req) => {
      void (async () => {
        let p: Process | undefined;
        let onDisconnect = 'keep';
        let closed = false;
        ws.once('close', d.track(req.caller, ws));
        // registered first: a client gone while the command starts still has it killed
        ws.once('close', () => {
          closed = true;
          if (onDisconnect === 'kill' && p && !p.ended) p.handle?.kill(9);
        });
        const start = startMessage(ws);
        try {
          const m = (await start.first) as { type?: string; onDisconnect?: string } & Record<string, unknown>;
          if (
            m.type !== 'start' ||
            !Array.isArray(m.argv) ||
            !m.argv.length ||
            m.argv.some((a) => typeof a !== 'string')
          ) {
            throw new SnaplabError(
              'BAD_INPUT',
              'the first message must be {"type": "start", "argv": ["cmd", ...]}',
              'see docs/api.md, streaming exec',
            );
          }
          onDisconnect = m.onDisconnect === 'kill' ? 'kill' : 'keep';
          const box = await d.sandbox((req.params as { id: string }).id, req.caller);
          p = await d.startProcess(req.caller, box, processSpec(m));
        } catch (e) {
          return refuse(ws, e);
        }
        if (closed) {
          if (onDisconnect === 'kill') p.handle?.kill(9);
          return;
        }
        control(p, ws, start.take());
        const proc = p;
        send(ws, { type: 'started', process: proc.id, pid: await proc.handle!.pid.catch(failureMeans(null)) });
        // its reader has had the end: kept a little for a late attach, not the full ten minutes
        pump(proc, ws, 0, () => (proc.keepMs = 30_000));
      })();
    }),
  );
}

function attachRoute(app: FastifyInstance, s: SandboxCalls): void {
  app.get(
    '/sandboxes/:id/processes/:pid/attach',
    {
      websocket: true,
      schema: {
        hide: true,
        tags,
        summary: 'Reattach (WebSocket) from output offset N: what the ring holds after N, then live',
        params: ProcParams,
        querystring: Type.Object({
          offset: Type.Optional(Type.Integer({ minimum: 0 })),
          token: Type.Optional(Type.String()),
        }),
      },
    },
    socketServedBy(s, (d) => (ws, req) => {
      // what the client sends while its process is looked up is kept for it, in order
      const held: [Buffer, boolean][] = [];
      const early = (data: Buffer, isBinary: boolean): void => void held.push([data, isBinary]);
      ws.on('message', early);
      void (async () => {
        try {
          const { id, pid } = req.params as { id: string; pid: string };
          const p = await procOf(d, req.caller, id, pid);
          ws.off('message', early);
          ws.once('close', d.track(req.caller, ws));
          const offset = within(p, (req.query as { offset?: number }).offset ?? 0);
          send(ws, { type: 'attached', process: p.id, ...p.info() });
          control(p, ws, held);
          pump(p, ws, offset);
        } catch (e) {
          refuse(ws, e);
        }
      })();
    }),
  );
}

/** Start, list and get background processes. */
function processRoutes(app: FastifyInstance, s: SandboxCalls): void {
  app.post(
    '/sandboxes/:id/processes',
    {
      schema: {
        tags,
        summary: 'Start a command in the background; it outlives the request, its output kept in a ring',
        params: IdParams,
        body: ProcessBody,
        response: { 201: info, ...errors },
      },
    },
    servedBy(s, (d) => async (req, reply) => {
      const box = await d.sandbox((req.params as { id: string }).id, req.caller);
      // kept by the machine's agent unless asked not to: it outlives this daemon (kept.ts)
      const body = req.body as ProcessSpec;
      const p = await d.startProcess(req.caller, box, { ...body, keep: body.keep ?? 'if-able', background: true });
      await p.handle!.pid.catch(handledElsewhere);
      return reply.status(201).send(p.info());
    }),
  );

  app.get(
    '/sandboxes/:id/processes',
    {
      schema: {
        tags,
        summary:
          'Processes the daemon runs (or ran, for 10 minutes) in this sandbox, and those a previous daemon started and the machine kept',
        params: IdParams,
        response: { 200: Type.Array(info), ...errors },
      },
    },
    servedBy(s, (d) => async (req) => {
      const box = await d.sandbox((req.params as { id: string }).id, req.caller);
      return (await d.processesOf(box)).map((p) => p.info());
    }),
  );

  app.get(
    '/sandboxes/:id/processes/:pid',
    { schema: { tags, params: ProcParams, response: { 200: info, ...errors } } },
    servedBy(s, (d) => async (req) => {
      const { id, pid } = req.params as { id: string; pid: string };
      return (await procOf(d, req.caller, id, pid)).info();
    }),
  );
}

function outputRoute(app: FastifyInstance, s: SandboxCalls): void {
  app.get(
    '/sandboxes/:id/processes/:pid/output',
    {
      schema: {
        tags,
        summary:
          'Output from offset N (base64 chunks), waiting up to `wait` s for more; `next` is the offset to ask for next',
        params: ProcParams,
        querystring: Type.Object({
          offset: Type.Optional(Type.Integer({ minimum: 0 })),
          wait: Type.Optional(Type.Number({ minimum: 0, maximum: 60 })),
        }),
        response: { 200: info, ...errors },
      },
    },
    servedBy(s, (d) => async (req) => {
      const { id, pid } = req.params as { id: string; pid: string };
      const p = await procOf(d, req.caller, id, pid);
      const q = req.query as { offset?: number; wait?: number };
      const offset = within(p, q.offset ?? 0);
      if (q.wait && !p.ended && p.ring.total <= offset) {
        await new Promise<void>((resolve) => {
          const done = (): void => {
            clearTimeout(t);
            p.off('chunk', done);
            p.off('exit', done);
            resolve();
          };
          const t = setTimeout(done, q.wait! * 1000);
          p.once('chunk', done);
          p.once('exit', done);
        });
      }
      const { chunks, gap } = p.ring.from(offset);
      return {
        ...p.info(),
        gap,
        next: p.ring.total,
        chunks: chunks.map((c) => ({ stream: c.stream, offset: c.offset, data: c.data.toString('base64') })),
      };
    }),
  );
}

/** Signal, stdin, kill. */
function processInputRoutes(app: FastifyInstance, s: SandboxCalls): void {
  app.post(
    '/sandboxes/:id/processes/:pid/signal',
    {
      schema: {
        tags,
        summary: "A signal to the process's whole group",
        params: ProcParams,
        body: Type.Object({ signal: Type.Union([Type.String(), Type.Integer()]) }),
        response: { 200: info, ...errors },
      },
    },
    servedBy(s, (d) => async (req) => {
      const { id, pid } = req.params as { id: string; pid: string };
      const p = await procOf(d, req.caller, id, pid);
      if (!p.ended) p.handle?.kill(signalNumber((req.body as { signal: unknown }).signal));
      return p.info();
    }),
  );

  app.post(
    '/sandboxes/:id/processes/:pid/stdin',
    {
      schema: {
        tags,
        summary: 'Input (application/octet-stream body, streamed); `eof=true` ends it after',
        params: ProcParams,
        querystring: Type.Object({ eof: Type.Optional(Type.Boolean()) }),
        response: { 200: info, ...errors },
      },
    },
    servedBy(s, (d) => async (req) => {
      const { id, pid } = req.params as { id: string; pid: string };
      const p = await procOf(d, req.caller, id, pid);
      const h = p.handle;
      if (!h || p.ended) throw new SnaplabError('BAD_INPUT', 'the process has ended', 'start a new one');
      for await (const b of streamBody(req.body)) if (!h.write(b as Buffer)) await h.drained();
      if ((req.query as { eof?: boolean }).eof) h.end();
      return p.info();
    }),
  );

  app.delete(
    '/sandboxes/:id/processes/:pid',
    {
      schema: {
        tags,
        summary: 'Kill it (SIGKILL to its group)',
        params: ProcParams,
        response: { 200: info, ...errors },
      },
    },
    servedBy(s, (d) => async (req) => {
      const { id, pid } = req.params as { id: string; pid: string };
      const p = await procOf(d, req.caller, id, pid);
      if (!p.ended) p.handle?.kill(9);
      return p.info();
    }),
  );
}
