/**
 * Reaching a service inside a machine from the host: each forwarded TCP connection is one
 * `snaplab-agent connect PORT` run in the machine by its agent (so it connects from inside the
 * machine's own network namespace, or VM), its bytes carried on that exec's stdin and stdout
 * over a connection to the agent of its own. The host listens on 127.0.0.1 only; no host or
 * machine address is routed anywhere (docs/interactive.md).
 */
import { createServer, type Server, type Socket } from 'node:net';
import { MACHINE_AGENT_PATH } from '../../drivers/driver.js';
import { SnaplabError } from '../../errors.js';
import type { SandboxRecord } from '../../store/records.js';
import type { LabContext } from '../context.js';
import type { AgentClient } from '../../agent/client.js';
import { connectAgent, spawnIn, type ExecProcess } from './sandbox-ops.js';
import { feedInput, outputTo } from './streams.js';

import type { PortSpec } from './port-spec.js';

/** Carries one accepted connection to the machine's port until either side ends. */
async function carry(
  ctx: LabContext,
  s: SandboxRecord,
  remote: number,
  sock: Socket,
  onError: (e: unknown) => void,
): Promise<void> {
  sock.pause();
  let agent: AgentClient;
  try {
    // the machine named so now: a scenario's reset (or standby swap) puts a new one under the name
    const now = ctx.store.getSandbox(s.name);
    if (!now)
      throw new SnaplabError(
        'SANDBOX_NOT_FOUND',
        `${s.name} is not there (being reset, or removed)`,
        'connect again in a moment; the forward ends if it was removed',
      );
    s = now;
    agent = await connectAgent(ctx, s);
  } catch (e) {
    sock.destroy();
    onError(e);
    return;
  }
  const a = agent;
  try {
    a.requireMinor(2, 'forward a port');
    const err: Buffer[] = [];
    let done = false;
    let inside: ExecProcess | undefined;
    // the client gone (both ways, or reset): nobody reads the rest
    const onStdout = outputTo(a, sock, () => !done && inside?.kill(9));
    inside = await spawnIn(ctx, s, a, [MACHINE_AGENT_PATH, 'connect', String(remote)], {
      stdin: true,
      onStdout,
      onStderr: (b) => err.push(b),
    });
    if (sock.destroyed) inside.kill(9); // went while the command was starting
    feedInput(inside, sock); // its end (a half-close) is the machine's side's end of stream
    sock.resume();
    const r = await inside.result;
    done = true;
    const why = Buffer.concat(err).toString().trim().split('\n')[0];
    if (r.exitCode !== 0)
      onError(
        new SnaplabError(
          'AGENT_ERROR',
          `port ${remote} in ${s.name}: ${why || `exit ${r.exitCode}`}`,
          'is something listening on that port inside the machine?',
        ),
      );
    sock.end();
  } catch (e) {
    sock.destroy();
    onError(e);
  } finally {
    await a.close();
  }
}

export interface Forward {
  machine: string;
  /** settles, with why, when the machine is removed (its name gone, and no scenario of it) */
  ended: Promise<string>;
  remote: number;
  /** the port bound on 127.0.0.1 */
  local: number;
  server: Server;
  /** connections being carried */
  open: Set<Socket>;
}

/**
 * Listens on 127.0.0.1:spec.local and forwards each connection into the machine's spec.remote,
 * many at once, for as long as the returned server is open. A local port that is taken is
 * PORT_IN_USE; errors of single connections go to onError and the forward goes on.
 */
export async function forwardPort(
  ctx: LabContext,
  s: SandboxRecord,
  spec: PortSpec,
  onError: (e: unknown) => void,
): Promise<Forward> {
  const open = new Set<Socket>();
  // allowHalfOpen: a client that ends its sending (nc -N, an HTTP/1.0 client) still reads the reply
  const server = createServer({ pauseOnConnect: true, allowHalfOpen: true }, (sock) => {
    open.add(sock);
    sock.on('close', () => open.delete(sock));
    void carry(ctx, s, spec.remote, sock, onError);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', (e: NodeJS.ErrnoException) => {
      reject(
        e.code === 'EADDRINUSE'
          ? new SnaplabError(
              'PORT_IN_USE',
              `127.0.0.1:${spec.local} is already in use on this host`,
              `pick another local port (e.g. ${spec.local + 1}:${spec.remote}), or :${spec.remote} for any free one`,
              { cause: e },
            )
          : e.code === 'EACCES'
            ? new SnaplabError(
                'BAD_INPUT',
                `cannot listen on 127.0.0.1:${spec.local}: permission denied`,
                'ports below 1024 need root; pick a port above 1023',
                { cause: e },
              )
            : e,
      );
    });
    server.listen({ host: '127.0.0.1', port: spec.local }, () => resolve());
  });
  server.on('error', onError);
  const addr = server.address();
  return {
    machine: s.name,
    ended: watchRemoval(ctx, s, server),
    remote: spec.remote,
    local: typeof addr === 'object' && addr ? addr.port : spec.local,
    server,
    open,
  };
}

/**
 * Settles when the forward's machine is removed: no record of its name, and (a scenario machine,
 * whose name is free for a moment while a reset raises it again) no scenario of it either. Looks
 * once a second while the server listens.
 */
function watchRemoval(ctx: LabContext, s: SandboxRecord, server: Server): Promise<string> {
  return new Promise((resolve) => {
    const t = setInterval(() => {
      if (!server.listening) return clearInterval(t);
      if (ctx.store.getSandbox(s.name)) return;
      if (s.scenario && ctx.store.getScenario(s.scenario)) return;
      clearInterval(t);
      resolve(`${s.name} was removed`);
    }, 1000);
    t.unref();
  });
}

/** Stops listening and ends the connections being carried (their execs end with them). */
export async function closeForwards(forwards: Forward[]): Promise<void> {
  await Promise.all(
    forwards.map(
      (f) =>
        new Promise<void>((res) => {
          f.server.close(() => res());
          for (const sock of f.open) sock.destroy();
        }),
    ),
  );
}
