import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, expect, it, vi } from 'vitest';
import { openDb } from '../store/db.js';
import { testRecord } from '../store/test-record.js';
import { Store } from '../store/store.js';
import { Lab } from '../sdk/lab.js';
import { pidThere, processStartTime } from '../host/procs.js';
import { Daemon, FULL_CHECK_EVERY } from './daemon.js';

// The daemon's tick over records only (stopped sandboxes: no machine behind them, so gc and the
// check pass leave them be); `store` is another process's connection to the same state.db.
const STOPPED = 'stopped (snaplab stop); its filesystem is kept: `snaplab start` runs it again';
let home: string;
let store: Store;
let daemon: Daemon | undefined;
beforeEach(() => {
  home = mkdtempSync(join(tmpdir(), 'snaplab-tick-'));
  store = new Store(openDb(home));
});
afterEach(() => {
  daemon?.close();
  daemon = undefined;
  store.db.close();
  rmSync(home, { recursive: true, force: true });
});

function put(id: string, at: number, expiresAt: number | null = null, reason = STOPPED): void {
  const r = testRecord(id, { reason, createdAt: at });
  expect(store.insertSandbox(r)).toBe(true);
  const timeoutS = expiresAt === null ? null : 60;
  store.putMeta({ id, labels: {}, metadata: {}, owner: null, timeoutS, onTimeout: 'kill', expiresAt });
}

/** A daemon on `home` whose tick runs when the test says; how many sandboxes each of its reads gave. */
async function started(): Promise<{ d: Daemon; reads: { complete: boolean; n: number; removed: string[] }[] }> {
  const lab = await Lab.open({ home, keepsTime: true });
  const reads: { complete: boolean; n: number; removed: string[] }[] = [];
  const changes = lab.changes.bind(lab);
  vi.spyOn(lab, 'changes').mockImplementation(async (...a) => {
    const c = await changes(...a);
    reads.push({ complete: c.complete, n: c.sandboxes.length, removed: c.removed });
    return c;
  });
  vi.spyOn(lab, 'list');
  daemon = new Daemon(lab, { tickMs: 3_600_000 });
  await daemon.start();
  return { d: daemon, reads };
}

const told = (d: Daemon, after: number): string[] =>
  d.events.after(after).map((e) => `${e.type} ${e.name ?? e.sandbox}`);

it('a tick reads what changed since the last, not every record; a restart reads on from where the log got to', async () => {
  store.db.transaction(() => {
    for (let i = 0; i < 300; i++) put(`s${String(i).padStart(3, '0')}`, 1000 + i);
  })();
  const { d, reads } = await started();
  // the first pass of a log with no place in the changes reads them all (and tells of them)
  expect(reads).toEqual([{ complete: true, n: 300, removed: [] }]);
  const mark = d.events.after(0).at(-1)!.id;
  await d.tick();
  expect(reads[1]).toEqual({ complete: false, n: 0, removed: [] });
  // changed behind the daemon's back: one paused, one removed, one made
  store.db.prepare("UPDATE sandboxes SET state = 'paused', reason = NULL WHERE id = 's010'").run();
  store.deleteSandbox('s020');
  put('t000', 5000);
  await d.tick();
  expect(reads[2]).toEqual({ complete: false, n: 2, removed: ['s020'] });
  expect(told(d, mark)).toEqual(['paused n-s010', 'created n-t000', 'exited n-t000', 'destroyed n-s020']);
  // the ticks read the changes only: never the whole list
  expect(d.lab.list).not.toHaveBeenCalled();
  const before = d.events.after(0).at(-1)!.id;
  d.close();
  daemon = undefined;

  // while no daemon runs: one more removed; the next start reads that alone, and what its gc
  // found (the paused one has no machine: dead)
  store.deleteSandbox('s030');
  const again = await started();
  expect(again.reads).toEqual([{ complete: false, n: 1, removed: ['s030'] }]);
  expect(told(again.d, before)).toEqual(['exited n-s010', 'destroyed n-s030']);
});

it('a timeout still ends its sandbox when due, read by its end; one not due is left', async () => {
  // (dead by itself, not stopped: a stopped one's clock stands still)
  put('a', 1000, null, 'its init process is gone');
  put('b', 1001, Date.now() + 3_600_000, 'its init process is gone');
  const { d, reads } = await started();
  const mark = d.events.after(0).at(-1)?.id ?? 0;
  // its clock set by another process (a CLI's `timeout`): due now
  store.putMeta({
    id: 'a',
    labels: {},
    metadata: {},
    owner: null,
    timeoutS: 1,
    onTimeout: 'kill',
    expiresAt: Date.now() - 1,
  });
  await d.tick();
  // (the meta row is no record change: nothing was read for it but the due timeout)
  expect(reads.at(-1)).toEqual({ complete: false, n: 0, removed: [] });
  for (let i = 0; i < 100 && store.getSandbox('a'); i++) await new Promise((r) => setTimeout(r, 50));
  expect(store.getSandbox('a')).toBeUndefined();
  expect(store.getSandbox('b')).toBeDefined();
  expect(told(d, mark)).toEqual(['timeout n-a', 'destroyed n-a']);
});

it("the tick's checks find a machine's process gone at once, and a pid taken by another process at the full pass", async () => {
  // "machines" whose recorded process is a real one of this test's, and the process making a
  // pool's template (the template lives only while it does)
  const procs = Array.from({ length: 4 }, () => spawn('sleep', ['1000']));
  const end = async (i: number) => {
    procs[i]!.kill('SIGKILL');
    await new Promise((r) => procs[i]!.once('exit', r));
  };
  try {
    const [a, b, c, maker] = await Promise.all(
      procs.map(async (p) => ({ pid: p.pid!, start: (await processStartTime(p.pid!))! })),
    );
    for (const [id, p] of [
      ['reused', a!],
      ['gone', b!],
    ] as const) {
      expect(store.insertSandbox(testRecord(id, { state: 'running', pid: p.pid, pidStart: p.start }))).toBe(true);
    }
    const template = testRecord('template', { state: 'running', pid: c!.pid, pidStart: c!.start, templateOf: 'p' });
    template.owner = { pid: maker!.pid, start: maker!.start, op: 'hold' };
    expect(store.insertSandbox(template)).toBe(true);
    const { d } = await started();
    const state = (id: string) => store.getSandbox(id)?.state;
    expect([state('reused'), state('gone'), state('template')]).toEqual(['running', 'running', 'running']);
    // one process ends, and the template's maker; the other's pid now names another process
    // than the one recorded
    await end(1);
    await end(3);
    store.db.prepare('UPDATE sandboxes SET pid_start = pid_start + 1 WHERE id = ?').run('reused');
    // a check every 5 ticks (the start's tick was the first): the next one is quick, and sees the end
    for (let i = 0; i < 5; i++) await d.tick();
    expect(store.getSandbox('gone')?.reason).toMatch(/its init process is gone/);
    // a template is asked about whole in a quick pass too: its machine's process is there, its maker's is not
    expect(store.getSandbox('template')?.reason).toMatch(/the process making its pool's template exited/);
    // a quick check does not read a process that is there: until the full one (the 12th after
    // the start's, at the 60th tick after it) it stands as running
    for (let i = 5; i < 5 * FULL_CHECK_EVERY - 1; i++) await d.tick();
    expect(state('reused')).toBe('running');
    await d.tick();
    expect([state('reused'), store.getSandbox('reused')?.reason]).toEqual([
      'dead',
      expect.stringMatching(/its init process is gone/),
    ]);
    // not the machine's: the process now behind the pid was not killed with it
    expect(pidThere(a!.pid)).toBe(true);
  } finally {
    for (const p of procs) p.kill('SIGKILL');
  }
});

it('a sandbox removed by another process while a request looked it up is not kept in the cache, and not found', async () => {
  const proc = spawn('sleep', ['1000']);
  try {
    const start = (await processStartTime(proc.pid!))!;
    expect(store.insertSandbox(testRecord('r1', { state: 'running', pid: proc.pid, pidStart: start }))).toBe(true);
    const { d } = await started();
    // biome-ignore lint/complexity/useLiteralKeys: the daemon's private cache, read by this test
    const cache = d['cache'] as Map<string, unknown>;
    // the lab's checked get under way (the record read) when the CLI removes the sandbox and a
    // pass reads that removal: there is nothing cached yet for it to let go
    const get = d.lab.get.bind(d.lab);
    vi.spyOn(d.lab, 'get').mockImplementation(async (idOrName, opts) => {
      const box = await get(idOrName, opts);
      if (opts?.check !== false && box.id === 'r1') {
        store.deleteSandbox(box.id);
        await d.tick();
      }
      return box;
    });
    // the request is told what is true now (not there), and nothing of it is kept
    await expect(d.sandbox('r1')).rejects.toMatchObject({ code: 'SANDBOX_NOT_FOUND' });
    expect(cache.has('r1')).toBe(false);
    // a sandbox that stays is kept
    expect(store.insertSandbox(testRecord('r2', { state: 'running', pid: proc.pid, pidStart: start }))).toBe(true);
    vi.mocked(d.lab.get).mockImplementation(get);
    await d.tick();
    await d.sandbox('r2');
    expect(cache.has('r2')).toBe(true);
    // and one whose second look fails (the store busy, say) is kept as it was: a failed read says nothing
    expect(store.insertSandbox(testRecord('r3', { state: 'running', pid: proc.pid, pidStart: start }))).toBe(true);
    await d.tick();
    vi.mocked(d.lab.get).mockImplementation(async (idOrName, opts) => {
      if (opts?.check === false && idOrName === 'r3' && cache.has('r3')) throw new Error('database is locked');
      const box = await get(idOrName, opts);
      if (opts?.check !== false) await d.tick();
      return box;
    });
    expect((await d.sandbox('r3')).id).toBe('r3');
    expect(cache.has('r3')).toBe(true);
  } finally {
    proc.kill('SIGKILL');
  }
});
