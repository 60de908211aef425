/**
 * The E2B front in the daemon's process (src/server/keyed-lab.ts): driven by E2B's SDK against a
 * real `snaplab serve --e2b-listen`, it asks nothing of the daemon's HTTP API, and each call is held
 * to what the daemon's routes hold a key to: its scope, its exec quota, its stream limit, its
 * removal (calls refused, its running commands ended).
 */
import { AuthenticationError, Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cli, e2bHome, until, type E2bHome } from './daemon-helpers.js';

let h: E2bHome;

beforeAll(async () => {
  // two streams a key: the limit case below meets it
  h = await e2bHome('e2bkeyed', ['--max-streams-per-key', '2']);
}, 120_000);

afterAll(async () => {
  await h?.close();
});

/** A key made now (the daemon runs: it finds keys as each call comes). */
function keyOf(name: string, ...opts: string[]): string {
  const r = cli(h.home, ['key', 'create', name, '--e2b', ...opts]);
  if (r.code !== 0) throw new Error(`key create: ${r.err}`);
  return r.out.trim();
}

/** Does a command run in it now (not refused by a quota or a limit)? */
function runs(sbx: Sandbox): Promise<boolean> {
  return sbx.commands.run('echo ok').then(
    (r) => r.stdout === 'ok\n',
    () => false,
  );
}

describe('the front on the daemon in-process', () => {
  it("asks nothing of the daemon's HTTP API: create, commands, files and kill log no request of the key there", async () => {
    // the daemon logs each request of its API with its key; the front's own lines say front=e2b
    const asked = (): number =>
      h.d
        .log()
        .split('\n')
        .filter((l) => l.includes(' key=agent') && !l.endsWith(' front=e2b')).length;
    const before = asked();
    const sbx = await Sandbox.create();
    expect((await sbx.commands.run('echo hi')).stdout).toBe('hi\n');
    await sbx.files.write('/tmp/probe.txt', 'x');
    expect(await sbx.files.read('/tmp/probe.txt')).toBe('x');
    await sbx.kill();
    // each of the front's lines names the key that acted, a create and an envd call as a kill
    await until('the front logged the kill', () =>
      /DELETE \/sandboxes\/\S+ 204 \S+ms key=agent front=e2b/.test(h.d.log()),
    );
    expect(h.d.log()).toMatch(/POST \/v2\/sandboxes 201 \S+ms key=agent front=e2b/);
    // a Start's line carries its phases: the sandbox found, its user known, its pid (ms from its start)
    expect(h.d.log()).toMatch(
      /POST \/process\.Process\/Start 200 \S+ms key=agent phases=sandbox:[\d.]+,user:[\d.]+,pid:[\d.]+ front=e2b/,
    );
    expect(asked()).toBe(before);
    // and nothing of it is left (the kill went through the daemon's own call)
    const ls = JSON.parse(cli(h.home, ['ls', '--json']).out) as { id: string }[];
    expect(ls.some((b) => b.id === sbx.sandboxId)).toBe(false);
  });

  it('a key with the read scope only lists, and may not create (403, no exec scope)', async () => {
    const reader = keyOf('reader', '--scope', 'read');
    expect(await Sandbox.list({ apiKey: reader }).nextItems()).toEqual([]);
    await expect(Sandbox.create({ apiKey: reader })).rejects.toThrow(/no exec scope/);
  });

  it("a key's exec quota holds its commands: one running, a second is refused (429) until it ends", async () => {
    const apiKey = keyOf('single', '--max-execs', '1');
    const sbx = await Sandbox.create({ apiKey });
    try {
      const bg = await sbx.commands.run('sleep 60', { background: true });
      await expect(sbx.commands.run('true')).rejects.toThrow(/concurrent execs/);
      await bg.kill();
      await until('the quota is free again', () => runs(sbx));
    } finally {
      await sbx.kill();
    }
  });

  it("a key's commands count in its stream limit (--max-streams-per-key), with its streams on the TCP API: a third is refused (429)", async () => {
    const apiKey = keyOf('streams');
    const sbx = await Sandbox.create({ apiKey });
    // one of the key's streams on the daemon's TCP API (its event stream): the same count
    const events = new AbortController();
    const stream = await fetch(`${h.d.url}/events?token=${apiKey}`, { signal: events.signal });
    expect(stream.status).toBe(200);
    try {
      const one = await sbx.commands.run('sleep 60', { background: true });
      await expect(sbx.commands.run('true')).rejects.toThrow(/streams open/);
      events.abort();
      await until('the event stream is let go', () => runs(sbx));
      const two = await sbx.commands.run('sleep 60', { background: true });
      await expect(sbx.commands.run('true')).rejects.toThrow(/streams open/);
      await one.kill();
      await two.kill();
      await until('the streams are let go', () => runs(sbx));
    } finally {
      await sbx.kill();
    }
  });

  it('a key removed: its calls are refused (401) and its running commands end', async () => {
    const apiKey = keyOf('leaving');
    const sbx = await Sandbox.create({ apiKey });
    try {
      const bg = await sbx.commands.run('sleep 600', { background: true });
      const ended = bg.wait().then(
        () => 'exited',
        (e: unknown) => e,
      );
      expect(cli(h.home, ['key', 'rm', 'leaving']).code).toBe(0);
      await expect(Sandbox.getInfo(sbx.sandboxId, { apiKey })).rejects.toBeInstanceOf(AuthenticationError);
      // the daemon's check pass (every few seconds) ends the streams of removed keys
      expect(await ended).toBeInstanceOf(Error);
      const ps = cli(h.home, ['exec', sbx.sandboxId, '--', 'sh', '-c', 'ps -o args']);
      expect(ps.out).not.toContain('sleep 600');
    } finally {
      cli(h.home, ['rm', sbx.sandboxId]);
    }
  });
});
