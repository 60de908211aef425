/** A real `snaplab serve` process for the daemon tests: on a Unix socket and on 127.0.0.1. */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
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

/** Remove everything a test made in a home (its sandboxes, the built-in image, what gc finds), then the home. */
export function removeHome(home: string): void {
  // what a failed test left: its pools and snapshots too
  const listed = (args: string[]): string[] => {
    const r = cli(home, [...args, '--json']);
    return r.code === 0 ? (JSON.parse(r.out) as { name: string }[]).map((x) => x.name) : [];
  };
  for (const p of listed(['pool', 'ls'])) cli(home, ['pool', 'rm', p]);
  cli(home, ['rm', '--all']);
  for (const s of listed(['snapshot', 'ls'])) cli(home, ['snapshot', 'rm', s]);
  cli(home, ['image', 'rm', '--force', 'busybox']);
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
