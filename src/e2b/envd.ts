/**
 * envd's process service (spec/envd/process/process.proto) over Connect, and `GET /health`:
 * Start streams a command's events (start, data, keepalive, end), Connect reattaches to a running
 * one, List, SendSignal, SendInput and CloseStdin act on one by pid. The sandbox is the one named
 * by `E2b-Sandbox-Id`, checked against its access token (state.ts).
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { SandboxApi } from '../sdk/api.js';
import {
  ConnectError,
  deadlineOf,
  keepaliveMs,
  openStream,
  parseJson,
  readBody,
  sendUnaryError,
  unenvelope,
  type ServerStream,
} from './connect.js';
import { keptOf } from './listing.js';
import type { Proc, ProcessConfig, ProcessEvent } from './processes.js';
import { EnvdUnavailable, FROM_MEMORY, sendError, type E2bState } from './state.js';
import { absolute, registerFiles } from './files.js';
import type { EnvdUser } from './users.js';
import { registerWatches } from './watch.js';

interface StartRequest {
  process?: { cmd?: unknown; args?: unknown; envs?: unknown; cwd?: unknown };
  pty?: unknown;
  tag?: unknown;
  stdin?: unknown;
}

interface Selector {
  process?: { pid?: unknown; tag?: unknown };
}

/** A sandbox's own variables, as envd's /envs gives them: every command's and every code interpreter kernel's. */
export const sandboxEnvs = (box: SandboxApi): Record<string, string> => {
  const { templateID, envs } = keptOf(box.metadata ?? {});
  return { E2B_SANDBOX: 'true', E2B_SANDBOX_ID: box.id, E2B_TEMPLATE_ID: templateID, ...envs };
};

/**
 * The process config of a Start, checked; the sandbox's envVars under the command's own. As envd,
 * a command runs in its user's home unless told (a user the machine's /etc/passwd does not name:
 * the sandbox's default working directory). `shown`: the config as sent, which List gives back (as
 * envd's does), not what it ran with.
 */
function configOf(box: SandboxApi, m: StartRequest, user: EnvdUser): { config: ProcessConfig; shown: ProcessConfig } {
  const p = m.process ?? {};
  if (typeof p.cmd !== 'string' || !p.cmd) throw new ConnectError('invalid_argument', 'process.cmd is required');
  const args = Array.isArray(p.args) ? p.args.map(String) : [];
  // values as text, as the daemon's routes take them (a client that sends a number means its digits)
  const own =
    typeof p.envs === 'object' && p.envs !== null
      ? Object.fromEntries(Object.entries(p.envs).map(([k, v]) => [k, typeof v === 'string' ? v : String(v)]))
      : {};
  // as envd: the user's own HOME, USER and LOGNAME (a login shell reads its profile from HOME)
  const who: Record<string, string> =
    user.name && user.home ? { HOME: user.home, USER: user.name, LOGNAME: user.name } : {};
  const envs = { ...who, ...sandboxEnvs(box), ...own };
  // as envd: `~` and a relative cwd are under the user's home
  const cwd = typeof p.cwd === 'string' && p.cwd ? absolute(p.cwd, user) : user.home;
  return {
    config: { cmd: p.cmd, args, envs, ...(cwd ? { cwd } : {}) },
    shown: { cmd: p.cmd, args, envs: own, ...(typeof p.cwd === 'string' && p.cwd ? { cwd: p.cwd } : {}) },
  };
}

/** A PTY's size (`{size: {cols, rows}}`), or undefined for none. */
function sizeOf(pty: unknown): { cols: number; rows: number } | undefined {
  if (pty === undefined || pty === null) return undefined;
  const size = (pty as { size?: { cols?: unknown; rows?: unknown } }).size ?? {};
  const cols = Number(size.cols ?? 80);
  const rows = Number(size.rows ?? 24);
  if (!Number.isInteger(cols) || !Number.isInteger(rows) || cols < 1 || rows < 1 || cols > 4096 || rows > 4096)
    throw new ConnectError('invalid_argument', 'pty.size must be whole cols and rows from 1 to 4096');
  return { cols, rows };
}

/** A client this far behind a command's output has it held at its source until it has read it all. */
const HOLD_AT = 4 << 20;
/** Where output cannot be held (a VM raised before protocol 1.7), a client this far behind is let go. */
const DROP_AT = 64 << 20;

/**
 * Send a process's events on a stream, with keepalives; the stream ends with the process. The
 * stream is opened by its first event (`open`), so that a start refused before it (the sandbox
 * gone or paused) is still an HTTP status. A client that reads slower than the command writes
 * holds its output at the machine (the command waits on a full pipe, as under envd) rather than
 * in the daemon's memory; where that cannot be (or a hold does not take), it is let go 64 MiB
 * behind (the command runs on, to be reattached by Connect).
 */
function pipe(open: () => ServerStream, ref: { p?: Proc }, req: FastifyRequest): (e: ProcessEvent) => void {
  const every = keepaliveMs(req.headers['keepalive-ping-interval']);
  let stream: ServerStream | undefined;
  let timer: NodeJS.Timeout | undefined;
  let holding = false;
  const release = (): void => {
    if (!holding) return;
    holding = false;
    ref.p?.hold(false);
  };
  const listen = (e: ProcessEvent): void => {
    if (!stream) {
      stream = open();
      const s = stream;
      timer = setInterval(() => s.send({ event: { keepalive: {} } }), every);
      timer.unref();
      stream.onClose(() => {
        if (timer) clearInterval(timer);
        ref.p?.listeners.delete(listen);
        release();
      });
    }
    if ('end' in e && ref.p?.cut) {
      // no end is known (Proc.cut): the stream is cut, as envd's is with its machine
      if (timer) clearInterval(timer);
      stream.drop();
      return;
    }
    stream.send({ event: e });
    const p = ref.p;
    if (p && !holding && p.holdable && stream.unread > HOLD_AT) {
      holding = true;
      p.hold(true);
      stream.onDrain(release);
    } else if (stream.unread > DROP_AT) {
      // no hold here, or one that did not take (an agent that ignores it): let the client go
      stream.drop();
    }
    if ('end' in e) {
      if (timer) clearInterval(timer);
      stream.end(
        ref.p?.timedOut ? new ConnectError('deadline_exceeded', 'the command ran past its timeout') : undefined,
      );
    }
  };
  return listen;
}

async function start(state: E2bState, req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply | undefined> {
  // its phases on its log line: the sandbox found, its user known, its pid (the start event)
  const t0 = performance.now();
  const phases: Record<string, number> = {};
  const mark = (name: string): void => {
    phases[name] = Math.round((performance.now() - t0) * 10) / 10;
    req.phases = phases;
  };
  let stream: ServerStream | undefined;
  const open = (): ServerStream => (stream ??= openStream(reply));
  const ref: { p?: Proc } = {};
  let box: SandboxApi;
  let m: StartRequest;
  try {
    box = await state.envdSandbox(req);
    m = unenvelope(await readBody(req.body)) as StartRequest;
    mark('sandbox');
  } catch (e) {
    return streamRefused(reply, e);
  }
  try {
    const user = await state.actAs(box, req);
    mark('user');
    const spec = {
      ...configOf(box, m, user),
      tag: typeof m.tag === 'string' ? m.tag : undefined,
      user: user.name,
      shell: user.shell,
      stdin: m.stdin === true,
      timeoutMs: deadlineOf(req.headers['connect-timeout-ms']),
      tty: sizeOf(m.pty),
    };
    const listen = pipe(open, ref, req);
    // (ref.p is set as soon as the Proc is made: an end that comes early must find it)
    const p = await state.processes.start(box, spec, listen, (made) => (ref.p = made));
    mark('pid');
    // the client went away while it started: the command runs on, to its end or its timeout
    if (open().closed) p.listeners.delete(listen);
  } catch (err) {
    // the sandbox gone or paused, found by the start itself: 502, as before any stream
    const e = state.unavailable(req, err);
    if (!stream && e instanceof EnvdUnavailable) return sendError(reply, e);
    open().end(e);
  }
  return undefined;
}

/** A streaming call refused before its stream: an HTTP status Connect's client reads as the code. */
function streamRefused(reply: FastifyReply, e: unknown): FastifyReply {
  if (e instanceof EnvdUnavailable || !(e instanceof ConnectError)) return sendError(reply, e);
  return sendUnaryError(reply, e);
}

/**
 * The process a unary call or a reattach selects (by pid, or by tag): one this front does not know
 * (started before a daemon restart) is looked for in the machine (Processes.adopt).
 */
async function selected(state: E2bState, box: SandboxApi, m: Selector): Promise<Proc> {
  const pid = m.process?.pid;
  const tag = m.process?.tag;
  const find = (): Proc | undefined =>
    typeof pid === 'number'
      ? state.processes.get(box.id, pid)
      : state.processes.list(box.id).find((x) => x.spec.tag !== undefined && x.spec.tag === tag);
  let p = find();
  if (!p) {
    await state.processes.adopt(box);
    p = find();
  }
  if (!p)
    throw new ConnectError('not_found', `no process ${pid ?? tag} started through this front runs in this sandbox`);
  return p;
}

async function reattach(state: E2bState, req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply | undefined> {
  let p: Proc;
  let box: SandboxApi | undefined;
  let m: Selector = {};
  try {
    box = await state.envdSandbox(req, FROM_MEMORY);
    m = unenvelope(await readBody(req.body)) as Selector;
    p = await selected(state, box, m);
  } catch (err) {
    const e = state.unavailable(req, err);
    if (e instanceof EnvdUnavailable || !(e instanceof ConnectError)) return sendError(reply, e);
    // one that ended in the last 30 s: its start and end, as envd (≥ 0.6.12) retains them
    const ended =
      box && e.code === 'not_found' ? state.processes.ended(box.id, m.process?.pid, m.process?.tag) : undefined;
    const stream = openStream(reply);
    if (ended) {
      stream.send({ event: { start: { pid: ended.pid } } });
      stream.send({ event: { end: ended.end } });
      stream.end();
      return undefined;
    }
    // no such process: said in the stream's end, as Connect says a streaming call's error (its message kept)
    stream.end(e);
    return undefined;
  }
  let stream: ServerStream | undefined;
  const listen = pipe(() => (stream = openStream(reply)), { p }, req);
  listen({ start: { pid: p.pid } });
  // a client gone already is not kept as a listener until the command ends
  if (!stream?.closed) p.listeners.add(listen);
  return undefined;
}

/**
 * A unary call: the sandbox, the JSON message, and the answer (or its error in Connect's shape).
 * `fresh`: a call the front answers from its own memory (its process table, a watcher's queue)
 * asks for the sandbox's state first, since nothing the daemon answers would say it is gone or paused.
 */
function unary(
  state: E2bState,
  fn: (box: SandboxApi, m: Record<string, unknown>, req: FastifyRequest) => Promise<unknown>,
  opts: { fresh?: boolean } = {},
): (req: FastifyRequest, reply: FastifyReply) => Promise<FastifyReply> {
  return async (req, reply) => {
    try {
      const box = await state.envdSandbox(req, opts);
      const m = parseJson(await readBody(req.body)) as Record<string, unknown>;
      return reply.type('application/json').send(await fn(box, m, req));
    } catch (err) {
      const e = state.unavailable(req, err);
      if (e instanceof EnvdUnavailable) return sendError(reply, e);
      return sendUnaryError(reply, e);
    }
  };
}

const SIGNALS: Record<string, number> = { SIGNAL_SIGKILL: 9, SIGNAL_SIGTERM: 15 };

export type Unary = typeof unary;

export function registerEnvd(app: FastifyInstance, state: E2bState): void {
  app.get('/health', async (req, reply) => {
    // the one envd call that asks for the sandbox's state (isRunning())
    await state.envdSandbox(req, { fresh: true });
    return reply.code(204).send();
  });
  app.post('/process.Process/Start', (req, reply) => start(state, req, reply));
  app.post('/process.Process/Connect', (req, reply) => reattach(state, req, reply));
  const P = '/process.Process';
  app.post(
    `${P}/List`,
    unary(
      state,
      async (box) => {
        await state.processes.adopt(box);
        return {
          processes: state.processes.list(box.id).map((p) => ({
            config: p.spec.shown ?? p.spec.config,
            pid: p.pid,
            ...(p.spec.tag !== undefined ? { tag: p.spec.tag } : {}),
          })),
        };
      },
      FROM_MEMORY,
    ),
  );
  app.post(
    `${P}/SendSignal`,
    unary(
      state,
      async (box, m) => {
        const sig = typeof m.signal === 'number' ? m.signal : SIGNALS[String(m.signal)];
        if (!sig) throw new ConnectError('invalid_argument', 'signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM');
        (await selected(state, box, m as Selector)).handle.kill(sig);
        return {};
      },
      FROM_MEMORY,
    ),
  );
  app.post(
    `${P}/SendInput`,
    unary(
      state,
      async (box, m) => {
        const input = (m.input ?? {}) as { stdin?: unknown; pty?: unknown };
        const data = typeof input.stdin === 'string' ? input.stdin : input.pty;
        const p = await selected(state, box, m as Selector);
        if (!p.spec.stdin && !p.spec.tty)
          throw new ConnectError('failed_precondition', 'the command was started without stdin');
        if (typeof data === 'string' && !p.handle.write(Buffer.from(data, 'base64'))) await p.handle.drained();
        return {};
      },
      FROM_MEMORY,
    ),
  );
  app.post(
    `${P}/Update`,
    unary(
      state,
      async (box, m) => {
        const p = await selected(state, box, m as Selector);
        const size = sizeOf(m.pty);
        if (!p.spec.tty || !size) throw new ConnectError('failed_precondition', 'only a PTY command has a size');
        p.handle.resize(size.cols, size.rows);
        return {};
      },
      FROM_MEMORY,
    ),
  );
  app.post(
    `${P}/CloseStdin`,
    unary(
      state,
      async (box, m) => {
        (await selected(state, box, m as Selector)).handle.end();
        return {};
      },
      FROM_MEMORY,
    ),
  );
  registerFiles(app, state, unary);
  registerWatches(app, state, unary);
}
