import { readFile } from 'node:fs/promises';
import type { AgentClient } from '../../agent/client.js';
import { SnaplabError } from '../../errors.js';
import type { SandboxRecord } from '../../store/records.js';
import type { Trace } from '../../timing/trace.js';
import type { LabContext } from '../context.js';
import type { PoolRunner } from './runner.js';
import { execIn, type ExecOptions, type ExecResult } from '../io/sandbox-ops.js';
import { noted } from '../../cleanup.js';

export interface PutFile {
  /** a path on the host, or the content itself */
  from: string | Buffer;
  /** absolute path inside the sandbox */
  to: string;
  mode?: number;
}

export interface RunSpec extends ExecOptions {
  put?: PutFile[];
}

export interface RunOutcome extends ExecResult {
  sandbox: string;
  /** the sandbox came from a paused standby */
  hit: boolean;
  /** it went back to its pool after a clean check (false: destroyed) */
  recycled: boolean;
  /** why it was not recycled, when it was dirty */
  dirt: string[];
}

/**
 * What an image's config (OCI/docker: Env, WorkingDir, User, Entrypoint, Cmd) makes of a run:
 * with no argv, its Entrypoint + Cmd run, as `docker run IMAGE` would; its Env is the base of the
 * environment the caller's adds to; its WorkingDir and User apply unless the caller gives them.
 */
export function withImageConfig(
  ctx: LabContext,
  image: string,
  argv: string[],
  spec: RunSpec,
): { argv: string[]; spec: RunSpec } {
  const config = ctx.store.getImage(image)?.config;
  if (!config) {
    if (argv.length === 0)
      throw new SnaplabError(
        'BAD_INPUT',
        `no command given, and image ${image} has no Entrypoint or Cmd`,
        'put the command after --, e.g. `snaplab run -- echo hi`',
      );
    return { argv, spec };
  }
  const own = Array.isArray(spec.env) ? spec.env : Object.entries(spec.env ?? {}).map(([k, v]) => `${k}=${v}`);
  const cmd = argv.length ? argv : [...(config.entrypoint ?? []), ...(config.cmd ?? [])];
  if (cmd.length === 0)
    throw new SnaplabError(
      'BAD_INPUT',
      `no command given, and image ${image} has no Entrypoint or Cmd`,
      'put the command after --',
    );
  return {
    argv: cmd,
    spec: { ...spec, env: [...config.env, ...own], cwd: spec.cwd ?? config.workingDir, user: spec.user ?? config.user },
  };
}

/** Parse `LOCAL:REMOTE` (the CLI's --put). */
export function parsePut(spec: string): PutFile {
  const i = spec.lastIndexOf(':');
  const from = spec.slice(0, i);
  const to = spec.slice(i + 1);
  if (i <= 0 || !to.startsWith('/')) {
    throw new SnaplabError(
      'BAD_INPUT',
      `invalid --put ${JSON.stringify(spec)}`,
      'write it as LOCAL:REMOTE with an absolute REMOTE path, e.g. --put ./job.sh:/root/job.sh',
    );
  }
  return { from, to };
}

async function putFiles(agent: AgentClient, files: PutFile[]): Promise<void> {
  for (const f of files) {
    const data =
      typeof f.from === 'string'
        ? await readFile(f.from).catch((e: NodeJS.ErrnoException) => {
            throw new SnaplabError(
              'BAD_INPUT',
              `cannot read ${f.from}: ${e.code ?? e.message}`,
              'give a readable local file for --put',
              { cause: e },
            );
          })
        : f.from;
    await agent.putFile(f.to, data, f.mode ?? 0o644);
  }
}

/**
 * One execution in a fresh sandbox from a pool: take a standby (or raise one on a miss), copy
 * the files in, run argv, and give the sandbox back (recycled only when provably clean).
 */
export async function runInPool(
  ctx: LabContext,
  runner: PoolRunner,
  argv: string[],
  spec: RunSpec,
  trace: Trace,
): Promise<RunOutcome> {
  const taken = await trace.phase('take', () => runner.take(trace));
  let result: ExecResult;
  try {
    if (spec.put?.length) await trace.phase('put files', () => putFiles(taken.agent, spec.put!));
    result = await trace.phase('exec', () => execIn(ctx, taken.record, taken.agent, argv, spec));
  } catch (e) {
    await trace.phase('release', () => runner.release(taken, trace)).catch(noted(`release ${taken.record.name}`));
    throw e;
  }
  // files put into in-memory directories are taken out again, so that the run can stay clean
  const scratch = (spec.put ?? [])
    .map((f) => f.to)
    .filter((p) => /^\/(run|dev\/shm)\/[^/]/.test(p) && !p.startsWith('/run/snaplab'));
  if (scratch.length)
    await trace.phase('remove put files', () => execIn(ctx, taken.record, taken.agent, ['rm', '-f', '--', ...scratch]));
  const back = await trace.phase('release', () => runner.release(taken, trace));
  return { ...result, sandbox: taken.record.name, hit: taken.hit, recycled: back.recycled, dirt: back.reasons };
}

/** Run in a sandbox made just for this (no pool): raise, put, exec, destroy. */
export async function runOnce(
  ctx: LabContext,
  raise: () => Promise<{ record: SandboxRecord; agent: AgentClient }>,
  destroy: (r: SandboxRecord, a: AgentClient) => Promise<void>,
  argv: string[],
  spec: RunSpec,
  trace: Trace,
): Promise<RunOutcome> {
  const { record, agent } = await trace.phase('raise', raise);
  try {
    if (spec.put?.length) await trace.phase('put files', () => putFiles(agent, spec.put!));
    const r = await trace.phase('exec', () => execIn(ctx, record, agent, argv, spec));
    return { ...r, sandbox: record.name, hit: false, recycled: false, dirt: [] };
  } finally {
    await trace.phase('destroy', () => destroy(record, agent));
  }
}
