/**
 * E2B's sandbox lifecycle options (`lifecycle` of `Sandbox.create`, docs/e2b.md) through a real
 * `snaplab serve --e2b-listen`, driven by E2B's own SDK: a timeout that pauses without the
 * memory (`keepMemory: false`) is the Lab API's stop on timeout (paused to E2B, envd 502, a
 * connect boots it afresh on its files); `autoResume` wakes a sandbox its timeout paused when an
 * envd call comes for it (its processes as they were, one resume however many calls come at once),
 * and a sandbox without it stays paused; getInfo says what was asked.
 */
import { Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cli, e2bHome, e2bInitStart as initStart, eventsOf, until, type E2bHome } from './daemon-helpers.js';

let h: E2bHome;

beforeAll(async () => {
  h = await e2bHome('e2blife');
}, 120_000);

afterAll(() => h?.close());

/** `snaplab ls --json`'s view of a sandbox: what the daemon made of it, not the front. */
function daemonView(id: string): { state: string; stopped?: boolean } | undefined {
  return (JSON.parse(cli(h.home, ['ls', '--json']).out) as { id: string; state: string; stopped?: boolean }[]).find(
    (b) => b.id === id,
  );
}

const pausedNow = async (sbx: Sandbox): Promise<boolean> => (await sbx.getInfo()).state === 'paused';

/** What the daemon told of a sandbox's lifecycle (its commands' ends left out), `enough` as eventsOf's. */
async function lifeOf(id: string, enough?: (types: string[]) => boolean): Promise<string[]> {
  const types = (es: { type: string }[]): string[] => es.map((e) => e.type).filter((t) => !t.startsWith('process.'));
  return types(await eventsOf(h.d.url, h.key, id, enough && ((es) => enough(types(es)))));
}

describe('onTimeout pause without its memory', () => {
  it('stops it at its timeout: paused to E2B, envd 502; connect boots it afresh on its files (201)', async () => {
    const sbx = await Sandbox.create({ lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } });
    try {
      expect((await sbx.getInfo()).lifecycle).toEqual({ onTimeout: 'pause', autoResume: false });
      await sbx.files.write('/root/kept.txt', 'before the timeout');
      const bg = await sbx.commands.run('sleep 4321', { background: true });
      const init = await initStart(sbx);
      // a short timeout once all is in place (a loaded host takes seconds for the above); the
      // timeout's action is the create's
      await sbx.setTimeout(2000);
      await until('paused at its timeout', () => pausedNow(sbx), 30_000);
      // the daemon stopped it (its files kept, nothing runs), not paused it with its memory
      expect(daemonView(sbx.sandboxId)).toMatchObject({ state: 'dead', stopped: true });
      expect((await sbx.getInfo()).lifecycle).toEqual({ onTimeout: 'pause', autoResume: false });
      // (isRunning is GET /health with the sandbox's token: false only for a 502)
      expect(await sbx.isRunning()).toBe(false);
      expect(await lifeOf(sbx.sandboxId, (ts) => ts.includes('stopped'))).toEqual([
        'created',
        'ready',
        'timeout',
        'stopped',
      ]);
      const res = await fetch(`${h.d.e2bUrl}/sandboxes/${sbx.sandboxId}/connect`, {
        method: 'POST',
        headers: { 'X-API-Key': h.key, 'content-type': 'application/json' },
        body: JSON.stringify({ timeout: 300 }),
      });
      expect(res.status).toBe(201);
      expect((await sbx.getInfo()).state).toBe('running');
      expect(await sbx.files.read('/root/kept.txt')).toBe('before the timeout');
      expect((await sbx.commands.list()).map((p) => p.pid)).not.toContain(bg.pid);
      expect((await sbx.commands.run('ps -o args')).stdout).not.toContain('sleep 4321');
      expect(await initStart(sbx)).not.toBe(init);
    } finally {
      await sbx.kill();
    }
  }, 120_000);
});

describe('autoResume', () => {
  it('refuses it where a pause does not keep the memory, or where the timeout does not pause', async () => {
    for (const body of [
      { autoPause: true, autoPauseMemory: false, autoResume: { enabled: true } },
      { autoResume: { enabled: true } },
      { autoPause: true, autoResume: { enabled: 'yes' } },
    ]) {
      const res = await fetch(`${h.d.e2bUrl}/v2/sandboxes`, {
        method: 'POST',
        headers: { 'X-API-Key': h.key, 'content-type': 'application/json' },
        body: JSON.stringify({ templateID: 'base', ...body }),
      });
      expect(res.status, JSON.stringify(body)).toBe(400);
    }
    expect(JSON.parse(cli(h.home, ['ls', '--json']).out)).toEqual([]);
  });

  it('an envd call wakes a sandbox its timeout paused, its processes as they were; without autoResume: 502', async () => {
    const sbx = await Sandbox.create({ lifecycle: { onTimeout: 'pause', autoResume: true } });
    const plain = await Sandbox.create({ lifecycle: { onTimeout: 'pause' } });
    try {
      expect((await sbx.getInfo()).lifecycle).toEqual({ onTimeout: 'pause', autoResume: true });
      expect((await plain.getInfo()).lifecycle).toEqual({ onTimeout: 'pause', autoResume: false });
      // the list says it too (the SDK's list does not read it: the API's answer)
      const list = await fetch(`${h.d.e2bUrl}/v2/sandboxes`, { headers: { 'X-API-Key': h.key } });
      const listed = (await list.json()) as { sandboxID: string; lifecycle: unknown }[];
      expect(Object.fromEntries(listed.map((x) => [x.sandboxID, x.lifecycle]))).toEqual({
        [sbx.sandboxId]: { onTimeout: 'pause', autoResume: true },
        [plain.sandboxId]: { onTimeout: 'pause', autoResume: false },
      });
      const bg = await sbx.commands.run('sleep 4321', { background: true });
      await sbx.setTimeout(2000);
      await plain.setTimeout(2000);
      await until(
        'both paused at their timeout',
        async () => (await pausedNow(sbx)) && (await pausedNow(plain)),
        30_000,
      );
      expect(daemonView(sbx.sandboxId)?.state).toBe('paused');
      // without autoResume it stays paused: envd answers 502 (the SDK's "sandbox timeout")
      await expect(plain.files.read('/etc/hostname')).rejects.toThrow(/likely due to sandbox timeout/);
      expect(await plain.isRunning()).toBe(false);
      expect(await pausedNow(plain)).toBe(true);
      // with it, calls through the same Sandbox object are served: at once, one resume for them all
      const runs = await Promise.all([1, 2, 3, 4].map((i) => sbx.commands.run(`kill -0 ${bg.pid} && echo ${i}`)));
      expect(runs.map((r) => r.stdout)).toEqual(['1\n', '2\n', '3\n', '4\n']);
      const info = await sbx.getInfo();
      expect(info.state).toBe('running');
      // the command from before the pause is the same process
      expect((await sbx.commands.list()).map((p) => p.pid)).toContain(bg.pid);
      // as E2B: woken by traffic, it runs at least five minutes (its 2 s timeout would pause it again at once)
      expect(info.endAt.getTime() - Date.now()).toBeGreaterThan(240_000);
      // (read for 3 s: a second resume would be told by now)
      expect(await lifeOf(sbx.sandboxId)).toEqual(['created', 'ready', 'timeout', 'paused', 'resumed']);
      // isRunning is traffic too (GET /health): it wakes it, as E2B's proxy does, and says true
      await sbx.setTimeout(2000);
      await until('paused again', () => pausedNow(sbx), 30_000);
      // a call without a token (to the code interpreter's port) is refused and does not wake it
      const tokenless = await fetch(`${h.d.e2bUrl}/health`, {
        headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49999' },
      });
      expect(tokenless.status).toBe(401);
      expect(await pausedNow(sbx)).toBe(true);
      expect(await sbx.isRunning()).toBe(true);
      expect((await sbx.getInfo()).state).toBe('running');
      expect((await sbx.commands.run(`kill -0 ${bg.pid} && echo alive`)).stdout).toBe('alive\n');
      // a pause of its own (with its memory) is woken the same way
      expect(await sbx.pause()).toBe(true);
      expect(await sbx.files.exists('/etc/hostname')).toBe(true);
      expect((await sbx.getInfo()).state).toBe('running');
    } finally {
      await sbx.kill();
      await plain.kill();
    }
  }, 120_000);
});
