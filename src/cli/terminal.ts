/**
 * A command on a terminal inside a machine, driven from the local one (`exec -t`, `shell`): the
 * local terminal goes raw so every key (Ctrl-C, Ctrl-Z, Ctrl-D) reaches the machine's own line
 * discipline, window size follows SIGWINCH, and the local terminal is put back however snaplab
 * ends: a normal exit, an error, SIGTERM/SIGHUP/SIGQUIT here, or (through native/cli.c, which
 * waits for this process) a SIGKILL.
 */
import { spawnSync } from 'node:child_process';
import type { SandboxApi } from '../sdk/api.js';
import type { ExecOptions } from '../lab/io/sandbox-ops.js';
import type { ExecText } from '../sdk/output.js';
import { feedInput } from '../lab/io/streams.js';

export interface TerminalOptions {
  env: string[];
  cwd?: string | undefined;
  user?: string | undefined;
  timeoutMs?: number | undefined;
  /** forward the local stdin (-i); without it the command has a terminal but no input */
  input: boolean;
}

/**
 * Raw as ssh and docker make it: libuv's raw mode keeps output post-processing (ONLCR), which
 * would turn the machine's \r\n into \r\r\n; `stty -opost` takes that off too. setRawMode(false)
 * puts back the settings libuv saved before, OPOST included.
 */
function goRaw(): void {
  process.stdin.setRawMode(true);
  spawnSync('stty', ['-opost'], { stdio: ['inherit', 'ignore', 'ignore'] });
}

const size = (): { cols: number; rows: number } => ({
  cols: process.stdout.columns || 80,
  rows: process.stdout.rows || 24,
});

/** TERM as the local terminal says it is: the program inside draws for that terminal. */
export function terminalEnv(env: string[]): string[] {
  const term = process.env.TERM;
  return term && !env.some((e) => e.startsWith('TERM=')) ? [`TERM=${term}`, ...env] : env;
}

export async function runOnTerminal(box: SandboxApi, argv: string[], o: TerminalOptions): Promise<ExecText> {
  const stdin = process.stdin;
  const raw = o.input && stdin.isTTY === true;
  // put back; a terminal taken from us meanwhile (its shell's again, after our parent was
  // killed) answers EIO, and that is no reason to crash
  stdin.on('error', () => {});
  const restore = (): void => {
    try {
      if (raw && stdin.isTTY) stdin.setRawMode(false);
    } catch {
      // nothing more to do for a terminal we no longer hold
    }
  };
  const onSignal = (sig: NodeJS.Signals): void => {
    restore();
    process.kill(process.pid, sig); // handlers removed below first: the default action now
  };
  const signals: NodeJS.Signals[] = ['SIGTERM', 'SIGHUP', 'SIGQUIT'];
  const handlers = signals.map((s) => {
    const h = (): void => {
      process.off(s, h);
      onSignal(s);
    };
    process.on(s, h);
    return [s, h] as const;
  });
  process.on('exit', restore);
  const opts: ExecOptions = {
    env: terminalEnv(o.env),
    cwd: o.cwd,
    user: o.user,
    timeoutMs: o.timeoutMs,
    tty: size(),
    stdin: o.input ? true : undefined,
    onStdout: (b) => process.stdout.write(b),
    onStderr: (b) => process.stderr.write(b),
  };
  const onResize = (): void => {
    const s = size();
    p?.resize(s.cols, s.rows);
  };
  let p: Awaited<ReturnType<SandboxApi['spawn']>> | undefined;
  try {
    p = await box.spawn(argv, opts);
    if (raw) goRaw();
    process.stdout.on('resize', onResize);
    if (o.input) feedInput(p, stdin);
    return await p.result;
  } finally {
    process.stdout.off('resize', onResize);
    restore();
    for (const [s, h] of handlers) process.off(s, h);
    process.off('exit', restore);
    if (o.input) stdin.pause();
  }
}

/**
 * The login shell of `user` (default root) in the machine: its /etc/passwd entry's shell when
 * that exists in the machine, else /bin/bash, else /bin/sh; with its home as the directory.
 */
export async function loginShell(
  box: SandboxApi,
  user: string | undefined,
): Promise<{ argv: string[]; home: string; env: string[] }> {
  const passwd = (await box.getFile('/etc/passwd').catch(() => Buffer.alloc(0))).toString('utf8');
  const want = user?.split(':')[0] ?? 'root';
  const entry = passwd
    .split('\n')
    .map((l) => l.split(':'))
    .find((f) => f.length >= 7 && (f[0] === want || f[2] === want));
  const home = entry?.[5] || (want === 'root' || want === '0' ? '/root' : '/');
  const candidates = [entry?.[6], '/bin/bash', '/bin/sh'].filter(
    (s): s is string => !!s && s.startsWith('/') && !/\/(nologin|false)$/.test(s),
  );
  let cwd = home;
  for (const shell of [...new Set(candidates)]) {
    // one cheap exec per candidate: does it run at all (the agent says not found / not executable)
    const probe = (dir: string): Promise<ExecText> => box.exec([shell, '-c', 'exit 0'], { user, cwd: dir });
    const r = await probe(cwd).catch(async (e: unknown) => {
      if (!/chdir/.test(String((e as Error).message))) throw e;
      cwd = '/'; // a home the machine does not have: start in / as login(1) does
      return probe(cwd);
    });
    if (!r.notFound && r.exitCode !== 126) {
      const name = entry?.[0] ?? want;
      return {
        argv: [shell, '-l'],
        home: cwd,
        env: [`HOME=${home}`, `SHELL=${shell}`, `USER=${name}`, `LOGNAME=${name}`],
      };
    }
  }
  const { SnaplabError } = await import('../errors.js');
  throw new SnaplabError(
    'NO_SHELL',
    `machine ${box.name} has no shell (tried ${candidates.join(', ')})`,
    'run a program directly: `snaplab exec -t -i MACHINE -- PROGRAM`',
  );
}
