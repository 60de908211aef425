import { spawn } from 'node:child_process';
import { expect, it } from 'vitest';
import { processStartTime, waitGone } from '../../host/procs.js';
import { me, ownerAlive } from './owner.js';

it('an owner is alive while the same pid has the same start time', async () => {
  expect(await ownerAlive(me('create'))).toBe(true);
  const child = spawn('sleep', ['30'], { stdio: 'ignore' });
  const pid = child.pid!;
  const start = (await processStartTime(pid))!;
  expect(await ownerAlive({ pid, start, op: 'hold' })).toBe(true);
  // the same pid started at another time is another process (a reuse of the pid)
  expect(await ownerAlive({ pid, start: start + 1, op: 'hold' })).toBe(false);
  // owners carried over from the old reason text: the pid alone, or (dead ones) nothing
  expect(await ownerAlive({ pid, start: null, op: 'remove' })).toBe(true);
  expect(await ownerAlive({ pid: null, start: null, op: 'create' })).toBe(false);
  expect(await ownerAlive(null)).toBe(false);
  child.kill('SIGKILL');
  expect(await waitGone(pid, 2000)).toBe(true);
  expect(await ownerAlive({ pid, start, op: 'hold' })).toBe(false);
});
