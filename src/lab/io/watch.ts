/**
 * Watching a directory of a machine: `snaplab-agent watch` (native/watch.c, inotify inside the
 * machine) run as a command of its own through the sandbox's `spawn`, embedded or remote alike,
 * its JSON lines read as events. The watch holds once the watcher says it started; closing it
 * kills the watcher (its whole process group), which leaves nothing running in the machine.
 */
import { StringDecoder } from 'node:string_decoder';
import { MACHINE_AGENT_PATH } from '../../drivers/driver.js';
import { handledElsewhere } from '../../cleanup.js';
import { SnaplabError } from '../../errors.js';
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
/** The longest line the watcher prints (a name is at most PATH_MAX, 4096 bytes, escaped) */
const MAX_LINE = 64 << 10;
const TYPES = new Set<string>(['create', 'write', 'remove', 'rename', 'chmod']);

/** A line of the watcher's: 'start', an event, or undefined when it is neither. */
function eventOf(line: string): WatchEvent | 'start' | undefined {
  try {
    const e = JSON.parse(line) as { type?: unknown; name?: unknown };
    if (e.type === 'start') return 'start';
    if (typeof e.type === 'string' && TYPES.has(e.type) && typeof e.name === 'string')
      return { type: e.type as WatchEventType, name: e.name };
  } catch {
    // said by the caller
  }
  return undefined;
}

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
  let garbled: SnaplabError | undefined;
  const errors: Buffer[] = [];
  let proc: Awaited<ReturnType<Spawner>> | undefined;
  const p = await spawn([MACHINE_AGENT_PATH, 'watch', ...(opts.recursive ? ['--recursive'] : []), '--', path], {
    user: opts.user,
    detached: true,
    onStdout: (chunk) => {
      if (garbled) return;
      const all = (partial + decoder.write(chunk)).split('\n');
      partial = all.pop() ?? '';
      // the machine's side is not trusted: a line that is not an event ends the watch, never this process
      const events = all.map(eventOf);
      if (partial.length > MAX_LINE || events.includes(undefined)) {
        garbled = new SnaplabError(
          'AGENT_PROTOCOL',
          `watch ${path}: the watcher said what is not an event`,
          'watch again',
        );
        proc?.kill(SIGTERM); // (else once spawn returns, below)
      }
      for (const e of events)
        if (e === 'start') started();
        else if (e && !garbled) onEvent(e);
    },
    onStderr: (b) => void (errors.length < 64 && errors.push(b)),
  });
  proc = p;
  if (garbled) p.kill(SIGTERM);
  let closing = false;
  const done = p.result.then((r) => {
    if (garbled) throw garbled;
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
