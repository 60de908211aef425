/** A real `snaplab serve` process for the daemon tests: on a Unix socket and on 127.0.0.1. */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect } from 'vitest';
import type { LabApi } from '../src/sdk/api.js';
import { Lab } from '../src/sdk/lab.js';
import { SNAPLAB } from './cli-command.js';

export interface TestDaemon {
  proc: ChildProcess;
  socket: string;
  url: string;
  /** the E2B front's URL, when started with --e2b-listen */
  e2bUrl?: string;
  log: () => string;
  /** SIGTERM, and wait for it to exit */
  stop(): Promise<void>;
  /** SIGKILL, and wait */
  kill9(): Promise<void>;
}

export function cli(
  home: string,
  args: string[],
  input?: string,
  env: Record<string, string> = {},
): { code: number; out: string; err: string } {
  const r = spawnSync(SNAPLAB, args, {
    env: { ...process.env, SNAPLAB_HOME: home, ...env },
    input,
    encoding: 'utf8',
    timeout: 120_000,
  });
  return { code: r.status ?? -1, out: r.stdout, err: r.stderr };
}

/**
 * `snaplab ARGS` in `home`, waited for without blocking: a build or an import of minutes run with
 * spawnSync would stall the worker's event loop past vitest's 60 s RPC timeout (its "Timeout
 * calling onTaskUpdate" fails the whole run, every test green).
 */
export function cliAsync(
  home: string,
  args: string[],
  timeoutMs: number,
): Promise<{ code: number; out: string; err: string }> {
  return new Promise((resolve, reject) => {
    const p = spawn(SNAPLAB, args, {
      env: { ...process.env, SNAPLAB_HOME: home },
      timeout: timeoutMs,
      killSignal: 'SIGKILL',
    });
    let out = '';
    let err = '';
    p.stdout.on('data', (b: Buffer) => (out += b.toString()));
    p.stderr.on('data', (b: Buffer) => (err += b.toString()));
    p.once('error', reject);
    p.once('close', (code) => resolve({ code: code ?? -1, out, err }));
  });
}

/** Remove everything a test made in a home (its sandboxes, its images, what gc finds), then the home. */
export function removeHome(home: string): void {
  // what a failed test left: its pools and snapshots too
  const listed = (args: string[]): string[] => {
    const r = cli(home, [...args, '--json']);
    return r.code === 0 ? (JSON.parse(r.out) as { name: string }[]).map((x) => x.name) : [];
  };
  for (const p of listed(['pool', 'ls'])) cli(home, ['pool', 'rm', p]);
  cli(home, ['rm', '--all']);
  for (const s of listed(['snapshot', 'ls'])) cli(home, ['snapshot', 'rm', s]);
  for (const i of listed(['image', 'ls'])) cli(home, ['image', 'rm', '--force', i]);
  cli(home, ['gc']);
  rmSync(home, { recursive: true, force: true });
}

/** `wrap`: a command that runs the daemon, e.g. ['prlimit', '--nofile=1024'] (it must exec it, keeping its pid). */
export async function startDaemon(home: string, extra: string[] = [], wrap: string[] = []): Promise<TestDaemon> {
  const socket = join(home, 'daemon.sock');
  const [cmd, ...args] = [...wrap, SNAPLAB, 'serve', '--listen', '127.0.0.1:0', ...extra];
  const proc = spawn(cmd!, args, {
    env: { ...process.env, SNAPLAB_HOME: home },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let err = '';
  proc.stderr!.on('data', (b: Buffer) => (err += b.toString()));
  const line = await new Promise<string>((resolve, reject) => {
    let out = '';
    proc.stdout!.on('data', (b: Buffer) => {
      out += b.toString();
      if (out.includes('\n')) resolve(out.split('\n')[0]!);
    });
    proc.once('exit', (c) => reject(new Error(`snaplab serve exited ${c}: ${err}`)));
    setTimeout(() => reject(new Error(`snaplab serve did not start: ${err}`)), 60_000);
  });
  const { url, e2bUrl } = JSON.parse(line) as { url: string; e2bUrl?: string };
  const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
  return {
    proc,
    socket,
    url,
    e2bUrl,
    log: () => err,
    async stop() {
      proc.kill('SIGTERM');
      await exited;
    },
    async kill9() {
      proc.kill('SIGKILL');
      await exited;
    },
  };
}

/**
 * A daemon with the E2B front, and E2B's SDKs pointed at it with `key` (E2B_API_URL,
 * E2B_SANDBOX_URL, E2B_API_KEY in this process's environment: the caller puts it back after).
 */
export async function startE2bDaemon(home: string, key: string, extra: string[] = []): Promise<TestDaemon> {
  const d = await startDaemon(home, ['--e2b-listen', '127.0.0.1:0', ...extra]);
  process.env.E2B_API_URL = d.e2bUrl;
  process.env.E2B_SANDBOX_URL = d.e2bUrl;
  process.env.E2B_API_KEY = key;
  return d;
}

/** A home for E2B's SDKs and its daemon (e2bHome); `d` is replaced when a test restarts the daemon. */
export interface E2bHome {
  home: string;
  /** the key E2B's SDKs are given (E2B_API_KEY) */
  key: string;
  d: TestDaemon;
  /** stop the daemon, remove what the home holds and the home, the uplink namespace; the environment put back */
  close(): Promise<void>;
}

/**
 * A fresh home for E2B's SDKs: a key made `--e2b`; `base` as a copy of busybox (E2B's default
 * template is snaplab's built-in Debian, built on first use in minutes, as test/templates.test.ts
 * does: these tests are about the protocol; the first create makes busybox's tree); a daemon with
 * the E2B front that the SDKs are pointed at (startE2bDaemon); and the uplink of the sandboxes'
 * egress (on by default under E2B) a network namespace of the test's, never the host's network.
 * `serveArgs`: more of `snaplab serve`'s options; `before`: `snaplab` commands run before the
 * daemon starts (a pool of its templates).
 */
export async function e2bHome(tag: string, serveArgs: string[] = [], before: string[][] = []): Promise<E2bHome> {
  const saved = { ...process.env };
  const uplink = `sltest-${tag}-${process.pid}`;
  spawnSync('ip', ['netns', 'add', uplink]);
  process.env.SNAPLAB_UPLINK_NETNS = uplink;
  const home = mkdtempSync(join(tmpdir(), `snaplab-test-${tag}-`));
  const h: E2bHome = {
    home,
    key: '',
    d: undefined as unknown as TestDaemon,
    async close() {
      await h.d?.stop();
      removeHome(home);
      process.env = saved;
      spawnSync('ip', ['netns', 'del', uplink]);
    },
  };
  try {
    h.key = cli(home, ['key', 'create', 'agent', '--e2b']).out.trim();
    for (const args of [
      ['create', '--name', 'first'],
      ['rm', 'first'],
      ['image', 'import', join(home, 'images', 'busybox', 'rootfs'), '--name', 'base'],
      ...before,
    ]) {
      const r = cli(home, args);
      if (r.code !== 0) throw new Error(`snaplab ${args.join(' ')}: ${r.err}`);
    }
    h.d = await startE2bDaemon(home, h.key, serveArgs);
  } catch (e) {
    await h.close();
    throw e;
  }
  return h;
}

/** An event of a daemon's stream (GET /events), as its data line says it. */
export interface DaemonEvent {
  id: number;
  type: string;
  sandbox: string | null;
  name: string | null;
  reason: string | null;
}

/**
 * The events of one sandbox (id or name) on a daemon's stream, from the first: read until `enough`
 * says so of those read, or for `ms` at most (without `enough`: all of `ms`).
 */
export async function eventsOf(
  url: string,
  token: string,
  sandbox: string,
  enough: (read: DaemonEvent[]) => boolean = () => false,
  ms = 3000,
): Promise<DaemonEvent[]> {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), ms);
  const read: DaemonEvent[] = [];
  try {
    const res = await fetch(`${url}/events?after=0&sandbox=${encodeURIComponent(sandbox)}`, {
      headers: { authorization: `Bearer ${token}` },
      signal: ctl.signal,
    });
    const reader = res.body!.getReader();
    let text = '';
    while (!enough(read)) {
      const { value, done } = await reader.read();
      if (done) break;
      text += Buffer.from(value).toString();
      const blocks = text.split('\n\n');
      text = blocks.pop()!;
      for (const b of blocks) {
        const data = /^data: (.*)$/m.exec(b)?.[1];
        if (data) read.push(JSON.parse(data) as DaemonEvent);
      }
    }
  } catch (e) {
    // the end of `ms`: what was read is the answer
    if (!ctl.signal.aborted) throw e;
  } finally {
    clearTimeout(timer);
    ctl.abort();
  }
  return read;
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Wait until `fn` gives something truthy (checked every 100 ms), or fail naming `what`. */
export async function until<T>(
  what: string,
  fn: () => T | undefined | false | Promise<T | undefined | false>,
  ms = 20_000,
): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

/**
 * A fresh home with a daemon on it and a key of `scopes` (comma-separated), and the Lab API both
 * ways into `labs`: `embedded` on the home, `remote` through the daemon with the key. The caller
 * closes the labs and stops the daemon.
 */
export async function bothLabs(
  name: string,
  scopes: string,
  labs: Record<string, LabApi>,
): Promise<{ home: string; daemon: TestDaemon; token: string }> {
  const home = mkdtempSync(join(tmpdir(), `snaplab-test-${name}-`));
  const k = cli(home, ['key', 'create', name, '--scope', scopes]);
  expect(k.code, k.err).toBe(0);
  const token = k.out.trim();
  const daemon = await startDaemon(home);
  labs.embedded = await Lab.open({ home });
  labs.remote = await Lab.connect({ url: daemon.url, token });
  return { home, daemon, token };
}

/** The start time of an E2B sandbox's PID 1 (/proc/1/stat field 22): a fresh boot has another. */
export async function e2bInitStart(sbx: {
  commands: { run(cmd: string): Promise<{ stdout: string }> };
}): Promise<string> {
  const stat = (await sbx.commands.run('cat /proc/1/stat')).stdout;
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]!;
}
