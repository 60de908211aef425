import type { Command } from 'commander';
import { SnaplabError } from '../errors.js';
import type { Lab } from '../sdk/lab.js';
import type { Sandbox } from '../sdk/sandbox.js';
import type { Forward } from '../lab/io/ports.js';
import { isScenario, withLab, type CommonOptions } from './common.js';
import { EXIT_EXEC_FAILURE, printJson } from './output.js';

/** The forwards a target asks for: MACHINE with ports given, or a SCENARIO's declared `ports:`. */
async function planFor(
  lab: Lab,
  target: string,
  ports: string[],
): Promise<{ box: Sandbox; local: number; remote: number }[]> {
  const { parsePortSpec } = await import('../lab/io/port-spec.js');
  if (isScenario(lab, target)) {
    if (ports.length)
      throw new SnaplabError(
        'BAD_INPUT',
        `${target} is a scenario: its ports come from its file`,
        `forward one machine's port with \`snaplab port-forward ${target}/MACHINE ${ports.join(' ')}\``,
      );
    const sc = lab.scenario(target);
    const plan = [];
    for (const m of sc.spec.machines) for (const p of m.ports ?? []) plan.push({ box: await sc.machine(m.name), ...p });
    if (!plan.length)
      throw new SnaplabError(
        'BAD_INPUT',
        `scenario ${target} declares no ports`,
        'add `ports: ["8080:80"]` to a machine in its file, or forward one: snaplab port-forward SCENARIO/MACHINE 8080:80',
      );
    return plan;
  }
  if (!ports.length)
    throw new SnaplabError(
      'BAD_INPUT',
      'no port given',
      `e.g. \`snaplab port-forward ${target} 8080:80\` (LOCAL:REMOTE; :80 picks a free local port)`,
    );
  const box = await lab.get(target);
  box.close();
  return ports.map((p) => ({ box, ...parsePortSpec(p) }));
}

/** `port-forward`'s status when its machine was removed (as a command whose peer went away). */
const EXIT_FORWARD_GONE = 1;

/**
 * Holds the forwards until SIGINT/SIGTERM (or a machine's end), printing one line each as
 * kubectl port-forward does. Shared by `port-forward` and `up --ports`.
 */
export async function holdForwards(lab: Lab, target: string, ports: string[], json: boolean): Promise<number> {
  const { closeForwards } = await import('../lab/io/ports.js');
  const plan = await planFor(lab, target, ports);
  const forwards: Forward[] = [];
  // one line per failed connection, and the same one once per second at most (50 refused at once are one line)
  let last = '';
  let lastAt = 0;
  const onError = (e: unknown): void => {
    const err = e as SnaplabError;
    const line = `snaplab: port-forward: ${err.message}${err.hint ? ` (${err.hint})` : ''}\n`;
    if (line === last && Date.now() - lastAt < 1000) return;
    last = line;
    lastAt = Date.now();
    process.stderr.write(line);
  };
  try {
    for (const p of plan) forwards.push(await p.box.forwardPort(p, onError));
  } catch (e) {
    await closeForwards(forwards);
    throw e;
  }
  // a scenario machine's sandbox is SCENARIO.MACHINE; people address it as SCENARIO/MACHINE
  const shown = (name: string): string => name.replace('.', '/');
  if (json)
    printJson(forwards.map((f) => ({ machine: shown(f.machine), local: `127.0.0.1:${f.local}`, remote: f.remote })));
  else
    for (const f of forwards)
      process.stdout.write(`Forwarding from 127.0.0.1:${f.local} -> ${shown(f.machine)}:${f.remote}\n`);
  // until ^C, or until a machine is removed: then the forward says so and ends non-zero
  const gone = await new Promise<string | null>((resolve) => {
    process.once('SIGINT', () => resolve(null));
    process.once('SIGTERM', () => resolve(null));
    for (const f of forwards) void f.ended.then(resolve);
  });
  await closeForwards(forwards);
  if (gone === null) return 0;
  process.stderr.write(
    `error[SANDBOX_NOT_FOUND]: ${shown(gone)}: the forward ends\nhint: forward another machine's port, or raise it again\n`,
  );
  return EXIT_FORWARD_GONE;
}

export function registerPorts(program: Command): void {
  program
    .command('port-forward <target> [ports...]')
    .description(
      "forward 127.0.0.1 ports into a machine ([LOCAL:]REMOTE...), or a scenario's declared ports, until Ctrl-C",
    )
    .option('--json', 'the forwards as JSON once listening; errors as JSON')
    .addHelpText(
      'after',
      '\nListens on 127.0.0.1 only. Each connection is made from inside the machine (its own network, or VM) to REMOTE.\nExamples:\n  snaplab port-forward web 8080:80\n  snaplab port-forward lab            every `ports:` of scenario lab\n  snaplab port-forward lab/db :5432   any free local port',
    )
    .action((target: string, ports: string[], o: CommonOptions) =>
      withLab(o, (lab) => holdForwards(lab, target, ports, !!o.json)),
    );

  program
    .command('proxy <machine> <port>')
    .description("a stdio stream to a TCP port inside a machine (for ssh's ProxyCommand)")
    .option('--json', 'errors as JSON')
    .action((machine: string, port: string, o: CommonOptions) =>
      withLab(
        o,
        async (lab) => {
          const { parsePortSpec } = await import('../lab/io/port-spec.js');
          const { MACHINE_AGENT_PATH } = await import('../drivers/driver.js');
          const remote = parsePortSpec(port).remote;
          const box = await lab.get(machine);
          try {
            // ssh's ProxyCommand: snaplab's key is given again to a machine that lacks it (a reset,
            // a restore or a swap to a snapshot taken before `inventory` or `ssh-config` gave it);
            // native/cli.c's fast path does the same
            const { homeKey } = await import('../lab/io/ssh.js');
            const key = remote === 22 ? homeKey(lab.home) : undefined;
            // an agent older than protocol 1.4 (a machine raised before an upgrade) lacks the flag
            const authorize = key && (await box.agentConnection()).speaks(4) ? ['--authorize', key] : [];
            const r = await box.exec([MACHINE_AGENT_PATH, 'connect', ...authorize, String(remote)], {
              stdin: process.stdin,
              onStdout: (b) => process.stdout.write(b),
              onStderr: (b) => process.stderr.write(b),
            });
            return r.exitCode;
          } finally {
            box.close();
            process.stdin.destroy();
          }
        },
        EXIT_EXEC_FAILURE,
      ),
    );
}
