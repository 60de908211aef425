/**
 * A person at a terminal: `snaplab shell` and `exec -t -i` driven through a real pseudo-terminal
 * on the host (test/pty-drive.py, Python's pty module), as a terminal emulator would drive them.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SNAPLAB } from './cli-command.js';
import { startDaemon } from './daemon-helpers.js';

let home: string;
const DRIVER = join(import.meta.dirname, 'pty-drive.py');

function snaplab(args: string[]): { code: number; out: string; err: string } {
  const r = spawnSync(SNAPLAB, args, {
    env: { ...process.env, SNAPLAB_HOME: home },
    encoding: 'utf8',
    timeout: 60_000,
  });
  return { code: r.status ?? -1, out: r.stdout, err: r.stderr };
}

interface Drive {
  output: string;
  status: number;
  restored: boolean;
  wasRaw: boolean;
  waitTimedOut: boolean;
  hung: boolean;
  ps: string;
}

/** Runs snaplab ARGS on a fresh host pty through STEPS (see pty-drive.py). */
function drive(steps: unknown[], args: string[], env: Record<string, string> = {}): Drive {
  const file = join(home, `steps-${Math.random().toString(36).slice(2)}.json`);
  writeFileSync(file, JSON.stringify(steps));
  const r = spawnSync('/usr/bin/python3', [DRIVER, file, '--', SNAPLAB, ...args], {
    env: { ...process.env, SNAPLAB_HOME: home, TERM: 'xterm-256color', ...env },
    encoding: 'utf8',
    timeout: 90_000,
  });
  expect(r.status, r.stderr).toBe(0);
  return JSON.parse(r.stdout) as Drive;
}

beforeAll(() => {
  home = mkdtempSync(join(tmpdir(), 'snaplab-test-tty-'));
  expect(snaplab(['create', '--name', 't1']).code).toBe(0);
});
afterAll(() => {
  snaplab(['rm', '--all']);
  snaplab(['image', 'rm', '--force', 'busybox']);
  snaplab(['gc']);
  rmSync(home, { recursive: true, force: true });
});

describe('terminals', () => {
  it('shell: a pty inside, its size follows the local one, ^C interrupts, exit code comes back, terminal restored', () => {
    const d = drive(
      [
        ['wait', '# '],
        ['send', 'tty; stty size; echo TERM=$TERM\r'],
        ['wait', 'TERM=\\S+'],
        ['resize', 100, 40],
        ['send', 'stty size\r'],
        ['wait', '40 100'],
        ['send', 'sleep 100\r'],
        ['sleep', 0.5],
        ['send', '\u0003'],
        ['send', 'echo rc=$?\r'],
        ['wait', 'rc=\\d+'],
        ['send', 'sleep 100\r'],
        ['sleep', 0.5],
        ['send', '\u001a'], // ^Z: the shell inside stops its job
        ['wait', '[Ss]topped'],
        ['send', 'kill -9 %1\r'],
        ['sleep', 0.3],
        ['send', '\r'], // ash says a job's end at the next prompt, and only then lets exit go
        ['wait', 'Killed'],
        ['send', 'exit 7\r'],
      ],
      ['shell', 't1'],
    );
    expect({ waitTimedOut: d.waitTimedOut, hung: d.hung }, `${JSON.stringify(d.output)}\n${d.ps}`).toEqual({
      waitTimedOut: false,
      hung: false,
    });
    expect(d.output).toMatch(/\/dev\/pts\/\d+\r\n24 80\r\nTERM=xterm-256color\r\n/); // \r\n once: no local ONLCR on top
    expect(d.output).toContain('40 100');
    expect(d.output).toContain('rc=130');
    expect(d.status).toBe(7);
    expect(d.restored).toBe(true);
  });

  it('exec -t -i: ^D at the prompt ends the shell; exec -t alone has a terminal but no input', () => {
    const d = drive(
      [
        ['wait', '# '],
        ['send', 'echo in; exit 3\r'],
      ],
      ['exec', '-t', '-i', 't1', '--', 'sh'],
    );
    expect(d.output).toMatch(/in\r\n/);
    expect(d.status).toBe(3);
    const eof = drive(
      [
        ['wait', '# '],
        ['send', '\u0004'],
      ],
      ['exec', '-it', 't1', '--', 'sh'],
    );
    expect(eof.status).toBe(0);
    expect(eof.restored).toBe(true);
    // piped input on a terminal would never end: refused, as docker does
    expect(snaplab(['exec', '-t', '-i', 't1', '--', 'cat'])).toMatchObject({
      code: 125,
      err: expect.stringMatching(/BAD_INPUT\]: the input is not a terminal[\s\S]*hint: drop -t/),
    });
    const t = snaplab(['exec', '-t', 't1', '--', 'sh', '-c', 'tty && [ -t 1 ] && echo yes']);
    expect(t.code).toBe(0);
    expect(t.out).toMatch(/^\/dev\/pts\/\d+\r\nyes\r\n$/);
  });

  it('the local terminal is restored when snaplab is SIGKILLed (the Node CLI, or the command itself)', () => {
    for (const who of ['child', 'parent']) {
      // a background job is a process group of its own: the agent ends the whole session
      const d = drive(
        [
          ['wait', '# '],
          ['send', 'sleep 300 & echo up\r'],
          ['wait', 'up\r\n'],
          ['kill', who],
        ],
        ['shell', 't1'],
      );
      expect(d.wasRaw, who).toBe(true); // it was raw while the shell ran
      expect(d.restored, who).toBe(true);
      expect(d.status).toBe(-9);
    }
    // the machine's shells went with their connections, and so did the job the first left behind
    const ps = snaplab(['exec', 't1', '--', 'ps', '-o', 'comm']);
    expect(ps.out.split('\n').map((l) => l.trim())).not.toContain('sh');
    expect(ps.out).not.toContain('sleep');
  });

  it('through the daemon (SNAPLAB_HOST): the same shell, its size followed, its exit code back, the terminal restored', async () => {
    const daemon = await startDaemon(home);
    try {
      const d = drive(
        [
          ['wait', '# '],
          ['send', 'stty size\r'],
          ['wait', '\\d+ \\d+'],
          ['resize', 90, 33],
          ['send', 'stty size\r'],
          ['wait', '33 90'],
          ['send', 'exit 3\r'],
        ],
        ['shell', 't1'],
        { SNAPLAB_HOST: `unix:${daemon.socket}` },
      );
      expect({ waitTimedOut: d.waitTimedOut, hung: d.hung }, `${JSON.stringify(d.output)}\n${d.ps}`).toEqual({
        waitTimedOut: false,
        hung: false,
      });
      expect([d.status, d.restored]).toEqual([3, true]);
      expect(d.output).toContain('33 90');
    } finally {
      await daemon.stop();
    }
  });
});
