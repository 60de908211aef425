import { spawn, spawnSync } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import { expect, it } from 'vitest';
import {
  descendants,
  fdLimit,
  killTree,
  liveness,
  parseStat,
  pidAlive,
  processStartTime,
  readStat,
  sameProcess,
  waitGone,
} from './procs.js';

it('parses stat lines whose comm holds spaces and parentheses', () => {
  const fields = Array.from({ length: 50 }, (_, i) => String(i + 3));
  fields[0] = 'S';
  fields[1] = '77';
  fields[19] = '123456';
  const st = parseStat(`42 (a (b) c) ${fields.join(' ')}`);
  expect(st).toEqual({ pid: 42, comm: 'a (b) c', state: 'S', ppid: 77, startTime: 123456 });
});

it('tells a live process from a dead one and from a reuse of its pid', async () => {
  const child = spawn('sleep', ['30'], { stdio: 'ignore' });
  const pid = child.pid!;
  expect(await pidAlive(pid)).toBe(true);
  const start = await processStartTime(pid);
  expect(start).toBeGreaterThan(0);
  expect(await sameProcess(pid, start!)).toBe(true);
  expect(await sameProcess(pid, start! + 1)).toBe(false);
  expect(await waitGone(pid, 50)).toBe(false);
  child.kill('SIGKILL');
  expect(await waitGone(pid, 2000)).toBe(true);
  expect(await processStartTime(2 ** 22 + 1)).toBeUndefined();
});

it('kills a process tree', async () => {
  const child = spawn('sh', ['-c', 'sleep 30 & sleep 30 & wait'], { stdio: 'ignore' });
  await expect.poll(() => descendants(child.pid!)).toHaveLength(2);
  const kids = await descendants(child.pid!);
  expect(await killTree(child.pid!, 200)).toBe(true);
  for (const p of [child.pid!, ...kids]) expect(await pidAlive(p)).toBe(false);
});

it('a /proc that cannot be read (EMFILE) says nothing of a process: unknown, never gone', async () => {
  const child = spawn('sleep', ['30'], { stdio: 'ignore' });
  const pid = child.pid!;
  const start = (await processStartTime(pid))!;
  const held: number[] = [];
  // a soft limit of 256 for the while (given back after), so that filling the table is cheap
  const { soft, hard } = fdLimit();
  const setSoft = (n: number): void => {
    const r = spawnSync('prlimit', ['--pid', String(process.pid), `--nofile=${n}:${hard}`]);
    expect(r.status, r.stderr.toString()).toBe(0);
  };
  setSoft(256);
  try {
    // this process's descriptors, all taken (the daemon under a connection flood was so)
    for (;;) {
      try {
        held.push(openSync('/dev/null', 'r'));
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === 'EMFILE') break;
        throw e;
      }
    }
    expect(await liveness(pid, start)).toMatchObject({ state: 'unknown', cause: { code: 'HOST_UNREADABLE' } });
    expect(await pidAlive(pid)).toBe(true);
    expect(await sameProcess(pid, start)).toBe(true);
    await expect(readStat(pid)).rejects.toMatchObject({ code: 'HOST_UNREADABLE', cause: { code: 'EMFILE' } });
  } finally {
    for (const fd of held) closeSync(fd);
    setSoft(soft);
  }
  expect(await liveness(pid, start)).toEqual({ state: 'alive' });
  child.kill('SIGKILL');
  expect(await waitGone(pid, 2000)).toBe(true);
  expect(await liveness(pid, start)).toEqual({ state: 'gone' });
});
