/**
 * Watching a directory of a machine: `snaplab-agent watch` (native/watch.c, inotify inside the
 * machine) run as a command of its own through the sandbox's `spawn`, embedded or remote alike,
 * its JSON lines read as events. The watch holds once the watcher says it started; closing it
 * kills the watcher (its whole process group), which leaves nothing running in the machine.
 */
import { StringDecoder } from 'node:string_decoder';
import { MACHINE_AGENT_PATH } from '../../drivers/driver.js';
import { handledElsewhere } from '../../cleanup.js';
import { fileError } from './files.js';
import type { ExecOptions } from './sandbox-ops.js';

/** What changed, as E2B's envd names it. */
export type WatchEventType = 'create' | 'write' | 'remove' | 'rename' | 'chmod';

export interface WatchEvent {
  type: WatchEventType;
  /** the path that changed, relative to the watched directory ("." for the directory itself) */
  name: string;
}

export interface WatchOptions {
  /** every directory below it too, those made after the watch started included; default false */
  recursive?: boolean;
  /** watch as this user (default root): what it may read is what it sees */
  user?: string;
}

export interface WatchHandle {
  /** settles when the watch ends: resolved once closed or once the directory itself is gone; rejected on an error */
  readonly done: Promise<void>;
  /** end the watch (its watcher killed); resolves once it has ended */
  close(): Promise<void>;
}

/** The part of a sandbox a watch needs: starting a command on a connection of its own. */
export type Spawner = (
  argv: string[],
  opts: ExecOptions & { detached?: boolean },
) => Promise<{ kill(signal: number): void; result: Promise<{ exitCode: number }> }>;

const SIGTERM = 15;

/** Watch `path` in the machine `spawn` starts commands in; resolves once the watch holds. */
export async function watchWith(
  spawn: Spawner,
  path: string,
  opts: WatchOptions,
  onEvent: (e: WatchEvent) => void,
): Promise<WatchHandle> {
  let started: () => void = () => {};
  const start = new Promise<void>((resolve) => (started = resolve));
  const decoder = new StringDecoder('utf8');
  let partial = '';
  const errors: Buffer[] = [];
  const lines = (chunk: Buffer): void => {
    const all = (partial + decoder.write(chunk)).split('\n');
    partial = all.pop() ?? '';
    for (const line of all) {
      const e = JSON.parse(line) as { type: WatchEventType | 'start'; name: string };
      if (e.type === 'start') started();
      else onEvent({ type: e.type, name: e.name });
    }
  };
  const argv = [MACHINE_AGENT_PATH, 'watch', ...(opts.recursive ? ['--recursive'] : []), '--', path];
  const p = await spawn(argv, { user: opts.user, detached: true, onStdout: lines, onStderr: (b) => errors.push(b) });
  let closing = false;
  const done = p.result.then((r) => {
    if (r.exitCode !== 0 && !closing) throw fileError(Buffer.concat(errors).toString(), r.exitCode, `watch ${path}`);
  });
  done.catch(handledElsewhere); // the caller's to await (a watch that fails before it starts rejects below)
  await Promise.race([start, done]);
  return {
    done,
    close: async () => {
      closing = true;
      p.kill(SIGTERM);
      await done;
    },
  };
}
