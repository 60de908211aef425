import { spawn } from 'node:child_process';
import { constants, existsSync } from 'node:fs';
import { access, stat } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { SnaplabError } from '../errors.js';
import tools from './tools.json' with { type: 'json' };

export interface RunResult {
  stdout: string;
  stderr: string;
  code: number;
}

export interface RunOptions {
  /** do not throw on a non-zero exit; return the code */
  allowFail?: boolean;
  input?: string | Buffer;
  timeoutMs?: number;
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  /** an abort kills the command (SIGKILL) and rejects with the signal's reason */
  signal?: AbortSignal;
}

/**
 * Run a host command to completion (mount, btrfs, tar, ...). A missing binary or a non-zero exit
 * becomes HOST_COMMAND_FAILED carrying the command's stderr, so the user sees what the tool said.
 */
export function run(cmd: string, args: string[], opts: RunOptions = {}): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, {
      stdio: [opts.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
      env: opts.env ?? process.env,
      cwd: opts.cwd,
      timeout: opts.timeoutMs,
      killSignal: 'SIGKILL',
      signal: opts.signal,
    });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout!.on('data', (b: Buffer) => out.push(b));
    child.stderr!.on('data', (b: Buffer) => err.push(b));
    if (opts.input !== undefined) child.stdin!.end(opts.input);
    child.on('error', (e: NodeJS.ErrnoException) => {
      if (opts.signal?.aborted) return reject(opts.signal.reason);
      reject(spawnError(cmd, e, opts.cwd));
    });
    child.on('close', (code, signal) => {
      const res = {
        stdout: Buffer.concat(out).toString(),
        stderr: Buffer.concat(err).toString(),
        code: code ?? 128 + (signal ? 9 : 0),
      };
      if (res.code !== 0 && !opts.allowFail) {
        const what = signal ? `killed by ${signal}` : `exited ${res.code}`;
        reject(
          new SnaplabError(
            'HOST_COMMAND_FAILED',
            `${cmd} ${args.join(' ')} ${what}: ${res.stderr.trim() || res.stdout.trim()}`,
          ),
        );
      } else resolve(res);
    });
  });
}

/**
 * A command that could not be started. Not installed (ENOENT): MISSING_TOOL, naming its Debian
 * package from the one list (tools.json) and what needs it; it was HOST_COMMAND_FAILED with
 * "spawn nft ENOENT", a 500 to the API's callers (an E2B create with internet access on a host
 * without nftables).
 */
export function spawnError(cmd: string, e: NodeJS.ErrnoException, cwd?: string): SnaplabError {
  // (spawn says ENOENT for a working directory that is not there too)
  if (e.code !== 'ENOENT' || (cwd !== undefined && !existsSync(cwd)))
    return new SnaplabError('HOST_COMMAND_FAILED', `${cmd}: ${e.message}`, undefined, { cause: e });
  return missingTool(cmd, e);
}

/**
 * Unless `cmd` is on PATH, MISSING_TOOL (as spawnError): asked before a change it would be needed
 * to finish or undo, so that its absence leaves nothing half made.
 */
export async function requireTool(cmd: string): Promise<void> {
  if (!(await which(cmd))) throw missingTool(cmd);
}

function missingTool(cmd: string, cause?: Error): SnaplabError {
  const tool = (tools as { program?: string; package: string; why: string }[]).find((t) => t.program === basename(cmd));
  return new SnaplabError(
    'MISSING_TOOL',
    tool ? `${cmd} is not installed (${tool.why})` : `${cmd} is not installed`,
    tool
      ? `apt-get install ${tool.package} (\`snaplab doctor\` names what else is missing)`
      : `install the package that provides ${cmd}`,
    cause ? { cause } : undefined,
  );
}

/** Is an executable on PATH? Looked up in-process: spawning a shell for it costs milliseconds. */
export async function which(cmd: string): Promise<string | undefined> {
  const dirs = cmd.includes('/')
    ? ['']
    : (process.env.PATH || '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin').split(':');
  for (const dir of dirs) {
    const p = dir ? join(dir, cmd) : cmd;
    try {
      await access(p, constants.X_OK);
      if ((await stat(p)).isFile()) return p;
    } catch {
      /* not here */
    }
  }
  return undefined;
}
