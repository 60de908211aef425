/**
 * E2B's `pause({ keepMemory: false })` (the latest `e2b` SDK; 2.14 has no such option) through a
 * real `snaplab serve --e2b-listen`: the files are kept, the processes are not (a fresh boot, a
 * new PID 1), the sandbox is paused meanwhile (envd answers 502, its access token is kept), and a
 * connect starts it again (201 resumed).
 */
import { Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cli, e2bHome, e2bInitStart as initStart, type E2bHome } from './daemon-helpers.js';

let h: E2bHome;

beforeAll(async () => {
  h = await e2bHome('e2bstop');
}, 120_000);

afterAll(() => h?.close());

describe('pause with keepMemory false', () => {
  it('keeps files only: connect boots it afresh (201), the file is there, the background command is not', async () => {
    const sbx = await Sandbox.create();
    try {
      await sbx.files.write('/root/kept.txt', 'before the pause');
      const bg = await sbx.commands.run('sleep 4321', { background: true });
      const init = await initStart(sbx);
      expect(await sbx.pause({ keepMemory: false })).toBe(true);
      // paused to E2B's callers meanwhile, once only; envd is not there (502: not running)
      expect(await Sandbox.pause(sbx.sandboxId, { keepMemory: false })).toBe(false);
      expect((await sbx.getInfo()).state).toBe('paused');
      const paused = await Sandbox.list({ query: { state: ['paused'] } }).nextItems();
      expect(paused.map((x) => x.sandboxId)).toEqual([sbx.sandboxId]);
      expect(await sbx.isRunning()).toBe(false);
      // (isRunning is GET /health through the sandbox URL with its token: 502 says not running)
      // an envd call is a 502 too, which the SDK reads as its TimeoutError (not running)
      await expect(sbx.files.read('/root/kept.txt')).rejects.toThrow(/likely due to sandbox timeout/);
      // connect starts it: 201 (resumed), as for a sandbox paused with its memory
      const res = await fetch(`${h.d.e2bUrl}/sandboxes/${sbx.sandboxId}/connect`, {
        method: 'POST',
        headers: { 'X-API-Key': h.key, 'content-type': 'application/json' },
        body: JSON.stringify({ timeout: 300 }),
      });
      expect(res.status).toBe(201);
      const back = await Sandbox.connect(sbx.sandboxId);
      expect((await back.getInfo()).state).toBe('running');
      // its access token is kept: the handle made before the pause drives it still
      expect(await sbx.files.read('/root/kept.txt')).toBe('before the pause');
      expect((await back.commands.list()).map((p) => p.pid)).not.toContain(bg.pid);
      expect((await back.commands.run('ps -o args')).stdout).not.toContain('sleep 4321');
      expect(await initStart(back)).not.toBe(init);
      // and it pauses with its memory as any other
      expect(await back.pause()).toBe(true);
      expect((await Sandbox.connect(sbx.sandboxId)).sandboxId).toBe(sbx.sandboxId);
    } finally {
      await sbx.kill();
    }
    expect(JSON.parse(cli(h.home, ['ls', '--json']).out)).toEqual([]);
  }, 120_000);
});
