/**
 * What envd ≥ 0.6 brings to the E2B front (docs/e2b.md, "envd versions"), driven by E2B's own SDK
 * (both pinned versions) against a real `snaplab serve --e2b-listen`: the advertised version, file
 * metadata kept as `user.e2b.*` extended attributes (checked from outside through the Lab API),
 * and the watch options (includeEntry, allowNetworkMounts).
 */
import { connect } from 'node:net';
import * as latest from 'e2b';
import * as oldest from 'e2b-v2-14';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Lab } from '../src/sdk/lab.js';
import type { LabApi } from '../src/sdk/api.js';
import { e2bHome, until, type E2bHome } from './daemon-helpers.js';

let h: E2bHome;
let lab: LabApi;

beforeAll(async () => {
  h = await e2bHome('e2benvd');
  lab = await Lab.open({ home: h.home });
}, 120_000);

afterAll(async () => {
  lab?.close();
  await h?.close();
});

/** A file's extended attributes as the Lab API sees them: not through the front. */
async function xattrsOf(id: string, path: string): Promise<Record<string, string> | undefined> {
  return (await (await lab.get(id)).files.stat(path)).xattrs;
}

type Sdk = typeof latest;

describe.each([
  ['e2b@2.51.0', latest, true],
  ['e2b@2.14.1', oldest as unknown as Sdk, false],
] as const)('with %s', (_label, sdk: Sdk, modern: boolean) => {
  const { Sandbox } = sdk;
  let sbx: latest.Sandbox;
  beforeAll(async () => {
    sbx = await Sandbox.create({ timeoutMs: 600_000 });
  }, 60_000);
  afterAll(async () => {
    await sbx?.kill();
  });

  it('create and connect advertise envd 0.6.4', async () => {
    const info = await fetch(`${h.d.e2bUrl}/sandboxes/${sbx.sandboxId}`, { headers: { 'X-API-Key': h.key } });
    expect(((await info.json()) as { envdVersion: string }).envdVersion).toBe('0.6.4');
    const again = await Sandbox.connect(sbx.sandboxId);
    expect((again as unknown as { envdApi: { version: string } }).envdApi.version).toBe('0.6.4');
  });

  it.runIf(modern)(
    'files.write with metadata: kept as user.e2b.* xattrs, told by write, getInfo and list',
    async () => {
      const w = await sbx.files.write('/srv/m/a.txt', 'one', { metadata: { Author: 'ann', 'x-tag': 'a b=c' } });
      // keys lowercased, as envd's (they travel as header names)
      const metadata = { author: 'ann', 'x-tag': 'a b=c' };
      expect(w.metadata).toEqual(metadata);
      expect(await xattrsOf(sbx.sandboxId, '/srv/m/a.txt')).toEqual({
        'user.e2b.author': 'ann',
        'user.e2b.x-tag': 'a b=c',
      });
      expect((await sbx.files.getInfo('/srv/m/a.txt')).metadata).toEqual(metadata);
      expect((await sbx.files.list('/srv/m')).map((e) => e.metadata)).toEqual([metadata]);
      // many files in one upload get the same metadata
      const many = await sbx.files.write(
        [
          { path: '/srv/m/b.txt', data: 'b' },
          { path: '/srv/m/c.txt', data: 'c' },
        ],
        { metadata: { k: 'v' } },
      );
      expect(many.map((f) => f.metadata)).toEqual([{ k: 'v' }, { k: 'v' }]);
      // two files for one path in one upload: the first written, then refused (as envd)
      await expect(
        sbx.files.write([
          { path: '/srv/m/d.txt', data: 'first' },
          { path: '/srv/m/d.txt', data: 'second' },
        ]),
      ).rejects.toThrow(/multiple files to the same path '\/srv\/m\/d.txt'/);
      expect(await sbx.files.read('/srv/m/d.txt')).toBe('first');
      expect(await xattrsOf(sbx.sandboxId, '/srv/m/c.txt')).toEqual({ 'user.e2b.k': 'v' });
      // an upload replaces the metadata whole: none sent, none kept (as envd's)
      const plain = await sbx.files.write('/srv/m/a.txt', 'two');
      expect(plain.metadata).toBeUndefined();
      expect((await sbx.files.getInfo('/srv/m/a.txt')).metadata).toBeUndefined();
      expect(await xattrsOf(sbx.sandboxId, '/srv/m/a.txt')).toBeUndefined();
      // a stream upload (octet-stream) carries it too
      const stream = new Blob(['streamed']).stream();
      await sbx.files.write('/srv/m/s.txt', stream, { metadata: { via: 'octet' } });
      expect((await sbx.files.getInfo('/srv/m/s.txt')).metadata).toEqual({ via: 'octet' });
    },
  );

  it.runIf(modern)(
    'metadata over envd caps is refused with 400 (InvalidArgumentError), the file untouched',
    async () => {
      const big = Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`k${i}`, 'v'.repeat(250)]));
      await expect(sbx.files.write('/srv/m/big.txt', 'x', { metadata: big })).rejects.toBeInstanceOf(
        sdk.InvalidArgumentError,
      );
      await expect(lab.get(sbx.sandboxId).then((b) => b.files.stat('/srv/m/big.txt'))).rejects.toMatchObject({
        code: 'FILE_NOT_FOUND',
      });
    },
  );

  it('a file with metadata reads as any other (the old SDK ignores the field it does not know)', async () => {
    await (await lab.get(sbx.sandboxId)).files.write('/srv/old/f.txt', 'made', { xattrs: { 'user.e2b.by': 'lab' } });
    const info = await sbx.files.getInfo('/srv/old/f.txt');
    expect(info.name).toBe('f.txt');
    expect((info as { metadata?: unknown }).metadata).toEqual(modern ? { by: 'lab' } : undefined);
    expect((await sbx.files.list('/srv/old')).map((e) => e.name)).toEqual(['f.txt']);
  });

  it.runIf(modern)(
    'watchDir includeEntry: a create or write carries its entry (metadata too), a remove none',
    async () => {
      expect(await sbx.files.makeDir('/srv/w')).toBe(true);
      const seen: latest.FilesystemEvent[] = [];
      const h = await sbx.files.watchDir('/srv/w', (e) => void seen.push(e), {
        includeEntry: true,
        allowNetworkMounts: true,
      });
      await sbx.files.write('/srv/w/a.txt', 'hello', { metadata: { who: 'w' } });
      // the entry is read when the event is: a remove before it (a loaded host) leaves none to read
      await until('the create', () => seen.some((e) => e.type === 'create'));
      await sbx.files.remove('/srv/w/a.txt');
      await until('the remove', () => seen.some((e) => e.type === 'remove'));
      await h.stop();
      const told = seen.map((e) => [e.type, e.name, e.entry?.name, e.entry?.size, e.entry?.metadata]);
      expect(told[0]).toEqual(['create', 'a.txt', 'a.txt', 5, { who: 'w' }]);
      expect(told).toContainEqual(['remove', 'a.txt', undefined, undefined, undefined]);
      // without includeEntry, none
      const bare: latest.FilesystemEvent[] = [];
      const h2 = await sbx.files.watchDir('/srv/w', (e) => void bare.push(e));
      await sbx.files.write('/srv/w/b.txt', 'b');
      await until('the write', () => bare.some((e) => e.type === 'write'));
      await h2.stop();
      expect(bare.every((e) => e.entry === undefined)).toBe(true);
    },
  );

  it.runIf(modern)('the watcher trio takes includeEntry too', async () => {
    const connected = await fetch(`${h.d.e2bUrl}/sandboxes/${sbx.sandboxId}/connect`, {
      method: 'POST',
      headers: { 'X-API-Key': h.key, 'content-type': 'application/json' },
      body: JSON.stringify({ timeout: 600 }),
    });
    const token = ((await connected.json()) as { envdAccessToken: string }).envdAccessToken;
    const call = async (method: string, body: unknown): Promise<Record<string, unknown>> => {
      const r = await fetch(`${h.d.e2bUrl}/filesystem.Filesystem/${method}`, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          'E2b-Sandbox-Id': sbx.sandboxId,
          'E2b-Sandbox-Port': '49983',
          'X-Access-Token': token,
        },
        body: JSON.stringify(body),
      });
      expect(r.status).toBe(200);
      return (await r.json()) as Record<string, unknown>;
    };
    expect(await sbx.files.makeDir('/srv/t')).toBe(true);
    const { watcherId } = await call('CreateWatcher', { path: '/srv/t', include_entry: true });
    await sbx.files.write('/srv/t/x.txt', 'xyz');
    const events: { type: string; entry?: { name: string; size: string } }[] = [];
    await until('the write event', async () => {
      events.push(...((await call('GetWatcherEvents', { watcherId })).events as typeof events));
      return events.some((e) => e.type === 'EVENT_TYPE_WRITE');
    });
    expect(events.find((e) => e.type === 'EVENT_TYPE_WRITE')?.entry).toMatchObject({ name: 'x.txt', size: '3' });
    await call('RemoveWatcher', { watcherId });
  });
});

// Found by a review: what a client that stops, floods or never reads could hold of the daemon
describe("envd's files as envd answers them, and against clients that leave, flood or never read", () => {
  let sbx: latest.Sandbox;
  let token: string;
  const headers = (): Record<string, string> => ({
    'E2b-Sandbox-Id': sbx.sandboxId,
    'E2b-Sandbox-Port': '49983',
    'X-Access-Token': token,
  });
  /** the newest pid in the sandbox's pid namespace, read from outside the front */
  const lastPid = async (): Promise<number> =>
    Number((await (await lab.get(sbx.sandboxId)).exec(['cat', '/proc/sys/kernel/ns_last_pid'])).stdout);
  beforeAll(async () => {
    sbx = await latest.Sandbox.create({ timeoutMs: 600_000 });
    token = (sbx as unknown as { envdAccessToken?: string }).envdAccessToken ?? '';
  }, 60_000);
  afterAll(async () => {
    await sbx?.kill();
  });

  it('a download abandoned before its first byte ends its read in the machine', async () => {
    await sbx.commands.run('mkfifo /tmp/fifo');
    for (let i = 0; i < 3; i++) {
      const gone = new AbortController();
      setTimeout(() => gone.abort(), 300);
      await expect(
        fetch(`${h.d.e2bUrl}/files?path=/tmp/fifo`, { headers: headers(), signal: gone.signal }),
      ).rejects.toThrow();
    }
    // each read was a `file cat` of the FIFO, blocked until a writer came: killed with its client
    const box = await lab.get(sbx.sandboxId);
    await until(
      'the reads ended',
      async () => (await box.exec(['sh', '-c', 'ps -o args | grep -c "[f]ile cat" || true'])).stdout.trim() === '0',
    );
  });

  it("as envd: ListDir follows a link to a directory (Debian's /bin), MakeDir on a file is invalid_argument", async () => {
    await sbx.commands.run('mkdir -p /tmp/real/sub && : > /tmp/real/f && ln -s /tmp/real /tmp/link');
    expect((await sbx.files.list('/tmp/link')).map((e) => [e.name, e.path]).sort()).toEqual([
      ['f', '/tmp/link/f'],
      ['sub', '/tmp/link/sub'],
    ]);
    // a file listed: invalid_argument; nothing there: not_found (as envd's ListDir)
    await expect(sbx.files.list('/tmp/real/f')).rejects.toBeInstanceOf(latest.InvalidArgumentError);
    await expect(sbx.files.list('/tmp/none')).rejects.toBeInstanceOf(latest.NotFoundError);
    expect(await sbx.files.makeDir('/tmp/real')).toBe(false);
    await expect(sbx.files.makeDir('/tmp/real/f')).rejects.toBeInstanceOf(latest.InvalidArgumentError);
  });

  it('a ListDir whose answer would be over 32 MiB is refused, its walk ended', async () => {
    // 10 000 entries with paths of ~3.5 KiB each: ~35 MiB of answer, which the daemon would hold whole
    const made = await sbx.commands.run(
      'n=$(head -c 250 /dev/zero | tr "\\0" a); p=/tmp/wide; for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14; do p=$p/$n; done; ' +
        'mkdir -p $p && cd $p && seq 10000 | xargs touch && ls | wc -l',
    );
    expect(made.stdout.trim()).toBe('10000');
    await expect(sbx.files.list('/tmp/wide', { depth: 20 })).rejects.toThrow(/over 32 MiB/);
    const box = await lab.get(sbx.sandboxId);
    await until(
      'the walk ended',
      async () => (await box.exec(['sh', '-c', 'ps -o args | grep -c "[f]ile ls" || true'])).stdout.trim() === '0',
    );
    // a depth that stops above the files is answered
    expect((await sbx.files.list('/tmp/wide', { depth: 14 })).length).toBe(14);
    await sbx.commands.run('rm -r /tmp/wide');
  });

  it("a client that stops reading a command's output holds the command, not the daemon's memory", async () => {
    const box = await lab.get(sbx.sandboxId);
    await box.files.write(
      '/tmp/flood.sh',
      'echo $$ > /tmp/flood.pid; i=0; while :; do head -c 65536 /dev/zero; i=$((i+1)); echo $i > /tmp/progress; done\n',
    );
    const message = Buffer.from(JSON.stringify({ process: { cmd: '/bin/sh', args: ['/tmp/flood.sh'], envs: {} } }));
    const head = Buffer.alloc(5);
    head.writeUInt32BE(message.length, 1);
    const body = Buffer.concat([head, message]);
    const u = new URL(h.d.e2bUrl ?? '');
    const client = connect(Number(u.port), u.hostname);
    try {
      client.write(
        `POST /process.Process/Start HTTP/1.1\r\nhost: x\r\ncontent-type: application/connect+json\r\n` +
          `e2b-sandbox-id: ${sbx.sandboxId}\r\ne2b-sandbox-port: 49983\r\nx-access-token: ${token}\r\n` +
          `content-length: ${body.length}\r\n\r\n`,
      );
      client.write(body);
      client.pause(); // and never read
      const progress = async (): Promise<number> =>
        Number((await box.exec(['sh', '-c', 'cat /tmp/progress 2>/dev/null || echo 0'])).stdout.trim());
      await until('the command started', async () => (await progress()) > 0);
      await new Promise((r) => setTimeout(r, 2000));
      const a = await progress();
      await new Promise((r) => setTimeout(r, 1000));
      const b = await progress();
      // held: it waits on a full pipe, a few MiB written (64 KiB an iteration); unheld it wrote
      // hundreds of MiB into the daemon's memory in these seconds
      expect(b).toBe(a);
      expect(b).toBeLessThan(600);
    } finally {
      client.destroy();
      // kept, it would run on after its client: ended here, and seen ended (the next test counts pids)
      await box.exec(['sh', '-c', 'kill -9 $(cat /tmp/flood.pid)']);
      await until(
        'the flood ended',
        async () =>
          (await box.exec(['sh', '-c', 'kill -0 $(cat /tmp/flood.pid) 2>/dev/null || echo gone'])).stdout.trim() ===
          'gone',
      );
    }
  });

  it("JSON bodies: the control API's at most 1 MiB, envd's token checked before its body, stdin of 900 kB sent", async () => {
    // a body of 2 MiB announced, none of it sent: the answer must come from the headers alone (read
    // before any of the body; a client still sending when the server answers and closes is a race)
    const status = (path: string, headers: string[]): Promise<string> =>
      new Promise((resolve, reject) => {
        const u = new URL(h.d.e2bUrl ?? '');
        const c = connect(Number(u.port), u.hostname);
        let got = '';
        c.on('data', (b) => {
          got += b.toString('latin1');
          const m = /^HTTP\/1\.1 (\d{3}) /.exec(got);
          if (m) {
            c.destroy();
            resolve(m[1]!);
          }
        });
        c.on('error', reject);
        c.write(
          `POST ${path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${2 << 20}\r\n` +
            `${headers.map((x) => `${x}\r\n`).join('')}\r\n`,
        );
      });
    expect(await status('/sandboxes', [`X-API-Key: ${h.key}`])).toBe('413');
    // no token: refused before the body is read (a body may be 16 MiB here)
    expect(await status('/filesystem.Filesystem/Stat', [`E2b-Sandbox-Id: ${sbx.sandboxId}`])).toBe('401');
    // SendInput carries stdin in base64 JSON: 900 kB of it is 1.2 MB of body
    const cat = await sbx.commands.run('wc -c', { background: true, stdin: true });
    await sbx.commands.sendStdin(cat.pid, 'y'.repeat(900_000));
    await sbx.commands.closeStdin(cat.pid);
    expect((await cat.wait()).stdout.trim()).toBe('900000');
  });

  it('a flood of events with includeEntry: stats wait at most 1000 at once, the rest come without entries', async () => {
    expect(await sbx.files.makeDir('/tmp/flood')).toBe(true);
    const seen: latest.FilesystemEvent[] = [];
    const w = await sbx.files.watchDir('/tmp/flood', (e) => void seen.push(e), { includeEntry: true });
    try {
      await sbx.commands.run('i=0; while [ $i -lt 2000 ]; do : > /tmp/flood/f$i; i=$((i+1)); done');
      const creates = (): latest.FilesystemEvent[] => seen.filter((e) => e.type === 'create');
      await until('every create told', () => creates().length >= 2000, 120_000);
      const withEntry = creates().filter((e) => e.entry).length;
      // one agent command a stat: 2000 in a burst would have queued ~2000 (minutes of work on a busy host)
      expect(withEntry).toBeGreaterThan(0);
      expect(withEntry).toBeLessThan(2000);
    } finally {
      await w.stop();
    }
    // nothing queued runs on after the watch: the sandbox makes (almost) no process in 2 s
    const before = await lastPid();
    await new Promise((r) => setTimeout(r, 2000));
    expect((await lastPid()) - before).toBeLessThan(20);
  }, 180_000);
});
