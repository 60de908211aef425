/**
 * The library's contract: what every implementation of LabApi does the same (embedded, remote
 * over one daemon, remote over a cluster's gateway). Each runner calls contractSuite with its lab.
 */
import { PassThrough } from 'node:stream';
import { expect, it } from 'vitest';
import type { LabApi, SandboxApi } from '../src/sdk/api.js';
import { listCursor } from '../src/sdk/paging.js';
import { createMany, removeMany } from '../src/sdk/bulk.js';
import { noted } from '../src/cleanup.js';

/** Wait (at most 10 s) until check() holds. */
async function until(check: () => boolean): Promise<void> {
  for (const end = Date.now() + 10_000; !check(); await new Promise((r) => setTimeout(r, 50)))
    if (Date.now() > end) throw new Error('timed out waiting');
}

/**
 * `keyed`: the daemon's keyed lab (src/server/keyed-lab.ts), which serves KeyedLabApi (create, get,
 * list, pools, whoami) and all of SandboxApi: the cases that need more of LabApi are not run on it.
 */
export function contractSuite(kind: string, lab: () => LabApi): void {
  const whole = kind !== 'keyed';
  it('creates with labels, finds by them, gets by name, destroys', async () => {
    const before = Date.now();
    const box = await lab().create({ name: `c-${kind}`, labels: { suite: 'contract', kind }, timeoutS: 0 });
    expect(box.state).toBe('running');
    expect(box.labels).toEqual({ suite: 'contract', kind });
    // what ls shows, the same on every implementation
    expect([box.origin, box.init, box.hostRoot, box.expiresAt]).toEqual([null, 'agent', false, null]);
    expect(box.createdAt).toBeGreaterThanOrEqual(before - 1000);
    expect(box.createdAt).toBeLessThanOrEqual(Date.now());
    const found = await lab().list({ labels: { kind } });
    expect(found.map((b) => b.name)).toEqual([`c-${kind}`]);
    expect((await lab().get(`c-${kind}`)).id).toBe(box.id);
    await box.setLabels({ labels: { suite: 'contract', kind, extra: 'yes' } });
    expect((await lab().list({ labels: { extra: 'yes' } })).map((b) => b.name)).toEqual([`c-${kind}`]);
    await box.destroy();
    await expect(lab().get(`c-${kind}`)).rejects.toMatchObject({ code: 'SANDBOX_NOT_FOUND' });
  });

  it('in bulk: made in order under a prefix; a failure removes what the bulk made; removed all', async () => {
    const labels = { suite: 'contract', bulk: kind };
    try {
      await bulkCase(labels);
    } finally {
      for (const b of await lab().list({ labels })) await b.destroy().catch(noted('contract cleanup'));
    }
  });

  async function bulkCase(labels: Record<string, string>): Promise<void> {
    const made = await createMany(lab(), 5, { name: `m-${kind}`, labels, timeoutS: 0 }, { parallel: 3 });
    expect(made.map((b) => b.name)).toEqual([1, 2, 3, 4, 5].map((i) => `m-${kind}-${i}`));
    // one after the other: m-KIND-x-1 is made, m-KIND-x-2 is taken (m-KIND-x-3 is never begun)
    await lab().create({ name: `m-${kind}-x-2`, labels, timeoutS: 0 });
    const clash = createMany(lab(), 3, { name: `m-${kind}-x`, labels, timeoutS: 0 }, { parallel: 1 });
    await expect(clash).rejects.toMatchObject({ code: 'SANDBOX_EXISTS', message: /the 1 made were removed/ });
    const left = await lab().list({ labels });
    expect(left.map((b) => b.name).sort()).toEqual([...made.map((b) => b.name), `m-${kind}-x-2`].sort());
    expect((await removeMany(lab(), left)).sort()).toEqual(left.map((b) => b.name).sort());
    expect(await lab().list({ labels })).toEqual([]);
    await expect(createMany(lab(), 0)).rejects.toMatchObject({ code: 'BAD_INPUT', hint: /whole number/ });
    await expect(createMany(lab(), 2, {}, { parallel: Number.NaN })).rejects.toMatchObject({ code: 'BAD_INPUT' });
  }

  it("lists in pages, oldest first: limit, then after the last one's cursor; a bad cursor is BAD_INPUT", async () => {
    const made: SandboxApi[] = [];
    try {
      for (const i of [0, 1, 2]) made.push(await lab().create({ name: `p${i}-${kind}`, labels: { page: kind } }));
      const names = (l: SandboxApi[]): string[] => l.map((b) => b.name);
      // the summary form: how many the list has, by state, none of them listed
      expect(await lab().count({ labels: { page: kind } })).toEqual({ total: 3, byState: { running: 3 } });
      expect(await lab().count({ labels: { page: kind }, state: ['paused'], check: false })).toEqual({
        total: 0,
        byState: {},
      });
      const first = await lab().list({ labels: { page: kind }, limit: 2 });
      expect(names(first)).toEqual([`p0-${kind}`, `p1-${kind}`]);
      const second = await lab().list({ labels: { page: kind }, limit: 2, after: listCursor(first[1]!) });
      expect(names(second)).toEqual([`p2-${kind}`]);
      // the cursor outlives the sandbox it names
      await made[1]!.destroy();
      expect(names(await lab().list({ labels: { page: kind }, after: listCursor(first[1]!) }))).toEqual([`p2-${kind}`]);
      expect(await lab().list({ labels: { page: kind }, after: listCursor(second[0]!) })).toEqual([]);
      await expect(lab().list({ after: 'yesterday' })).rejects.toMatchObject({ code: 'BAD_INPUT' });
    } finally {
      for (const b of made) await b.destroy().catch(noted(`remove ${b.name}`, 'SANDBOX_NOT_FOUND'));
    }
  });

  it('execs: output, exit codes, env, cwd, stdin, a deadline, streaming and a live stdin', async () => {
    const box = await lab().create({ name: `x-${kind}` });
    try {
      const r = await box.exec(['sh', '-c', 'echo out; echo err >&2; pwd; echo $FOO; exit 7'], {
        env: { FOO: 'bar' },
        cwd: '/tmp',
      });
      expect([r.exitCode, r.stdout.toString(), r.stderr.toString()]).toEqual([7, 'out\n/tmp\nbar\n', 'err\n']);
      // output is text by default, bytes on request
      expect(r.stdout).toBeTypeOf('string');
      expect((await box.exec(['cat'], { stdin: Buffer.from([0, 1, 2, 255]), encoding: 'buffer' })).stdout).toEqual(
        Buffer.from([0, 1, 2, 255]),
      );
      expect((await box.exec(['printf', 'h\\303\\251'])).stdout).toBe('hé');
      expect((await box.exec(['/no/such'])).exitCode).toBe(127);
      const slow = await box.exec(['sleep', '30'], { timeoutMs: 300 });
      expect([slow.exitCode, slow.timedOut]).toEqual([124, true]);

      const seen: string[] = [];
      const streamed = await box.exec(['sh', '-c', 'for i in 1 2 3; do echo $i; done'], {
        onStdout: (b) => seen.push(b.toString()),
      });
      expect([streamed.exitCode, seen.join('')]).toEqual([0, '1\n2\n3\n']);

      const p = await box.spawn(['sh', '-c', 'read a; echo got:$a; cat'], { stdin: true });
      expect(await p.pid).toBeGreaterThan(0);
      p.write('one\n');
      p.write('two\n');
      p.end();
      const pr = await p.result;
      expect([pr.exitCode, pr.stdout.toString()]).toEqual([0, 'got:one\ntwo\n']);
      // waitOutput: its end waits for what it left in the background writing its output (and not without)
      const bg = ['sh', '-c', '(sleep 0.2; echo late) & echo early'];
      expect((await (await box.spawn(bg, { waitOutput: true })).result).stdout).toBe('early\nlate\n');
      expect((await (await box.spawn(bg)).result).stdout).toBe('early\n');

      const input = new PassThrough();
      const piped = box.exec(['wc', '-c'], { stdin: input });
      for (let i = 0; i < 64; i++) input.write(Buffer.alloc(64 << 10, i));
      input.end();
      expect((await piped).stdout.toString().trim()).toBe(String(64 * (64 << 10)));
    } finally {
      await box.destroy();
    }
  });

  it('whoami: who the lab acts for, its scopes, quotas and ceilings', async () => {
    const me = await lab().whoami();
    // the embedded lab acts for whoever opened the home; the others for their key
    expect(me.key === 'local').toBe(kind === 'embedded');
    expect(me.scopes).toEqual(expect.arrayContaining(['read', 'exec']));
    // a gateway names only the ceilings the key was made with (a node has its own defaults)
    expect(me.ceilings.egress).not.toBe(false);
    if (!kind.startsWith('gateway')) expect(me.ceilings.egress).toBe(true);
  });

  it('files: a write lands with the user.* extended attributes asked for; stat and list report them', async () => {
    const box = await lab().create({ name: `xattr-${kind}` });
    try {
      const xattrs = { 'user.e2b.author': 'ann', 'user.note': 'a=b c' };
      await box.files.write('/data/x.txt', 'one', { xattrs });
      expect((await box.files.stat('/data/x.txt')).xattrs).toEqual(xattrs);
      expect((await box.files.list('/data')).map((e) => e.xattrs)).toEqual([xattrs]);
      // an overwrite is a new file: only what it asks for; with append, added to what it has
      await box.files.write('/data/x.txt', 'two');
      expect((await box.files.stat('/data/x.txt')).xattrs).toBeUndefined();
      await box.files.write('/data/x.txt', '+', { append: true, xattrs: { 'user.a': '1' } });
      expect((await box.files.stat('/data/x.txt')).xattrs).toEqual({ 'user.a': '1' });
      expect((await box.files.read('/data/x.txt')).toString()).toBe('two+');
      await expect(box.files.write('/data/y', 'z', { xattrs: { 'trusted.x': '1' } })).rejects.toMatchObject({
        code: 'BAD_INPUT',
      });
    } finally {
      await box.destroy();
    }
  });

  it('files: write, read, stat, list, mkdir, remove, move, owner; a missing file is FILE_NOT_FOUND', async () => {
    const box = await lab().create({ name: `f-${kind}` });
    try {
      const big = Buffer.alloc(3 << 20, 7);
      expect(await box.files.write('/data/deep/big.bin', big, { mode: 0o600 })).toBe(big.length);
      expect((await box.files.read('/data/deep/big.bin')).equals(big)).toBe(true);
      expect(await box.files.stat('/data/deep/big.bin')).toMatchObject({
        type: 'file',
        size: big.length,
        mode: '0600',
        name: 'big.bin',
      });
      await box.files.mkdir('/data/sub/a/b', { parents: true });
      await box.putFile('/data/hello.txt', 'hello');
      expect((await box.getFile('/data/hello.txt')).toString()).toBe('hello');
      expect((await box.files.list('/data')).map((e) => `${e.name}:${e.type}`)).toEqual([
        'deep:dir',
        'hello.txt:file',
        'sub:dir',
      ]);
      await box.files.remove('/data/sub', { recursive: true });
      await expect(box.files.stat('/data/sub')).rejects.toMatchObject({ code: 'FILE_NOT_FOUND' });
      await expect(box.files.read('/nope')).rejects.toMatchObject({ code: 'FILE_NOT_FOUND' });
      await expect(box.files.remove('/data')).rejects.toMatchObject({
        code: 'FILE_ERROR',
        message: expect.stringMatching(/ENOTEMPTY/),
      });
      // as another user of the machine: what it makes is its own, and root's files stay root's
      await box.files.mkdir('/tmp/theirs', { user: 'nobody' });
      await box.files.write('/tmp/theirs/x', 'x', { user: 'nobody' });
      expect([(await box.files.stat('/tmp/theirs')).uid, (await box.files.stat('/tmp/theirs/x')).uid]).toEqual([
        65534, 65534,
      ]);
      await expect(box.files.write('/data/hello.txt', 'no', { user: 'nobody' })).rejects.toMatchObject({
        code: 'FILE_ERROR',
        message: expect.stringMatching(/EACCES/),
      });
      // as root, given to nobody (envd's way): the file and the directories made for it, not those there
      await box.files.write('/data/given/deep/x', 'x', { owner: 'nobody' });
      await box.files.mkdir('/data/made/a', { parents: true, owner: '65534:0' });
      await box.files.move('/data/hello.txt', '/data/moved/to/hello.txt', { parents: true, owner: 'nobody' });
      const ids = async (p: string) => {
        const st = await box.files.stat(p);
        return `${st.uid}:${st.gid}`;
      };
      const owners = await Promise.all(
        ['/data/given', '/data/given/deep/x', '/data/made', '/data/made/a', '/data/moved/to', '/data'].map(ids),
      );
      expect(owners).toEqual(['65534:65534', '65534:65534', '65534:0', '65534:0', '65534:65534', '0:0']);
      // the file moved is as it was (root's); rename(2): a file onto a directory fails, nothing changed
      expect(await ids('/data/moved/to/hello.txt')).toBe('0:0');
      await expect(box.files.move('/data/moved/to/hello.txt', '/data/made')).rejects.toMatchObject({
        code: 'FILE_ERROR',
        message: expect.stringMatching(/EISDIR/),
      });
      await expect(box.files.move('/data/nope', '/data/x')).rejects.toMatchObject({ code: 'FILE_NOT_FOUND' });
      await expect(box.files.write('/data/y', 'y', { owner: 'no-such-user' })).rejects.toMatchObject({
        code: 'USER_NOT_FOUND',
      });
      // a file replaced keeps its owner, and its permission bits unless a mode is given
      await box.files.write('/data/given/deep/x', 'again');
      expect(await ids('/data/given/deep/x')).toBe('65534:65534');
      await box.files.write('/data/run.sh', '#!/bin/sh\n', { mode: 0o750 });
      await box.files.write('/data/run.sh', '#!/bin/sh\ntrue\n');
      expect((await box.files.stat('/data/run.sh')).mode).toBe('0750');
      // a listing of levels: each directory followed by its entries, never through a link
      await box.files.remove('/data/deep', { recursive: true });
      await box.exec(['ln', '-s', '/etc', '/data/made/etc']);
      expect((await box.files.list('/data/made', { depth: 5 })).map((e) => e.path)).toEqual([
        '/data/made/a',
        '/data/made/etc',
      ]);
      expect((await box.files.list('/data', { depth: 2 })).map((e) => e.path)).toEqual([
        '/data/given',
        '/data/given/deep',
        '/data/made',
        '/data/made/a',
        '/data/made/etc',
        '/data/moved',
        '/data/moved/to',
        '/data/run.sh',
      ]);
      await expect(box.files.list('/data', { depth: 0 })).rejects.toMatchObject({ code: 'BAD_INPUT' });
      // a link: replaced by a write, or written through; stat tells where it ends
      await box.exec(['ln', '-s', 'run.sh', '/data/link']);
      expect((await box.files.stat('/data/link')).resolved).toEqual({
        path: '/data/run.sh',
        type: 'file',
        mode: '0750',
      });
      await box.files.write('/data/link', 'through', { through: true });
      expect([(await box.files.read('/data/run.sh')).toString(), (await box.files.stat('/data/link')).type]).toEqual([
        'through',
        'symlink',
      ]);
      await box.files.write('/data/link', 'replaced');
      expect([(await box.files.read('/data/run.sh')).toString(), (await box.files.stat('/data/link')).type]).toEqual([
        'through',
        'file',
      ]);
    } finally {
      await box.destroy();
    }
  });

  it("usage: a sandbox's memory, CPU time, processes and disk, and what it may use", async () => {
    const box = await lab().create({ name: `u-${kind}`, limits: { memoryBytes: 256 << 20, cpus: 1.5 } });
    try {
      await box.exec(['sh', '-c', 'i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done']);
      const u = await box.usage();
      expect(u.at).toBeGreaterThan(Date.now() - 10_000);
      expect(u.memoryBytes).toBeGreaterThan(0);
      expect(u.memoryTotalBytes).toBe(256 << 20);
      expect(u.cpus).toBe(2);
      expect(u.cpuUsec).toBeGreaterThan(0);
      expect(u.pids).toBeGreaterThanOrEqual(1);
      expect(u.diskTotalBytes).toBeGreaterThan(0);
      await box.files.write('/data/big.bin', Buffer.alloc(8 << 20, 1));
      const after = await box.usage();
      expect(after.diskUsedBytes! - (u.diskUsedBytes ?? 0)).toBeGreaterThanOrEqual(4 << 20);
      expect(after.cpuUsec).toBeGreaterThanOrEqual(u.cpuUsec);
    } finally {
      await box.destroy();
    }
  });

  it('watch: changes under a directory as they happen, recursive into new ones; close leaves no watcher', async () => {
    const box = await lab().create({ name: `w-${kind}` });
    try {
      await box.files.mkdir('/w/old', { parents: true });
      const seen: string[] = [];
      const w = await box.watch('/w', { recursive: true }, (e) => void seen.push(`${e.type} ${e.name}`));
      await box.files.write('/w/a.txt', 'one');
      await box.files.write('/w/a.txt', 'two');
      await box.exec(['sh', '-c', 'mkdir -p /w/new/deep && echo x > /w/new/deep/f && chmod 600 /w/a.txt']);
      await box.exec(['sh', '-c', 'echo y > /w/old/g; mv /w/a.txt /w/b.txt; rm /w/b.txt']);
      await until(() => seen.includes('remove b.txt'));
      // a directory made with its contents at once is seen whole (what it held when its watch began is told as made)
      const made = seen.filter((x) => x.includes(' new'));
      expect(new Set(made)).toEqual(
        new Set([
          'create new',
          'create new/deep',
          'create new/deep/f',
          ...made.filter((x) => x === 'write new/deep/f'),
        ]),
      );
      expect(seen.filter((x) => !x.includes(' new'))).toEqual([
        'create a.txt',
        'write a.txt',
        'write a.txt',
        'chmod a.txt',
        'create old/g',
        'write old/g',
        'rename a.txt',
        'create b.txt',
        'remove b.txt',
      ]);
      await w.close();
      await w.done;
      expect((await box.exec(['ps'])).stdout).not.toContain('watch');
      await expect(box.watch('/nope', {}, () => {})).rejects.toMatchObject({ code: 'FILE_NOT_FOUND' });
    } finally {
      await box.destroy();
    }
  });

  it.runIf(whole)('snapshots and restores; pauses and resumes', async () => {
    const box = await lab().create({ name: `s-${kind}` });
    await box.putFile('/root/mark', kind);
    const snap = await box.snapshot(`csnap-${kind}`);
    expect(snap.name).toBe(`csnap-${kind}`);
    expect((await lab().snapshots()).map((s) => s.name)).toContain(`csnap-${kind}`);
    await box.pause();
    await expect(box.exec(['true'])).rejects.toMatchObject({ code: 'SANDBOX_PAUSED' });
    await box.resume();
    expect((await box.exec(['true'])).exitCode).toBe(0);
    const copy = await lab().restore(`csnap-${kind}`, { name: `r-${kind}` });
    expect((await copy.getFile('/root/mark')).toString()).toBe(kind);
    expect(copy.origin).toBe(`csnap-${kind}`);
    await copy.destroy();
    await box.destroy();
    await lab().removeSnapshot(`csnap-${kind}`);
    await expect(lab().snapshot(`csnap-${kind}`)).rejects.toMatchObject({ code: 'SNAPSHOT_NOT_FOUND' });
  });

  it('a timeout is kept by the lab that can end it (a daemon), or refused with BAD_INPUT', async () => {
    const asked = Date.now();
    const made = await lab()
      .create({ name: `t-${kind}`, timeoutS: 60 })
      .catch((e: Error) => e);
    if (made instanceof Error) {
      expect(made).toMatchObject({ code: 'BAD_INPUT', message: expect.stringMatching(/needs a daemon/) });
      await expect(lab().get(`t-${kind}`)).rejects.toMatchObject({ code: 'SANDBOX_NOT_FOUND' });
      const box = await lab().create({ name: `t-${kind}` });
      await expect(box.setTimeout(30)).rejects.toMatchObject({ code: 'BAD_INPUT' });
      expect([box.timeoutS, box.expiresAt]).toEqual([0, null]);
      await box.destroy();
      return;
    }
    expect([made.timeoutS, made.onTimeout, made.owner]).toEqual([60, 'kill', expect.any(String)]);
    expect(made.expiresAt).toBeGreaterThanOrEqual(asked + 59_000);
    expect(made.expiresAt).toBeLessThanOrEqual(Date.now() + 60_000);
    // the clock stands still while it is paused, and runs again from the resume
    await made.pause();
    expect((await lab().get(`t-${kind}`)).expiresAt).toBeNull();
    const resumed = Date.now();
    await made.resume();
    expect((await lab().get(`t-${kind}`)).expiresAt).toBeGreaterThanOrEqual(resumed + 59_000);
    await made.setTimeout(0);
    expect(await lab().get(`t-${kind}`)).toMatchObject({ timeoutS: 0, expiresAt: null });
    await made.destroy();
  });

  it.runIf(whole)('pools: run in a fresh sandbox, take one for good', async () => {
    const pool = await lab().createPool({ name: `cpool-${kind}`, image: 'busybox', size: 1, limits: {} });
    const r = await pool.run(['sh', '-c', 'echo ran; touch /tmp/dirt']);
    expect([r.exitCode, r.stdout]).toEqual([0, 'ran\n']);
    expect(Buffer.isBuffer((await pool.run(['true'], { encoding: 'buffer' })).stdout)).toBe(true);
    const again = await pool.run(['ls', '/tmp']);
    expect(again.stdout.toString()).not.toContain('dirt');
    const taken = await pool.take();
    expect((await taken.exec(['echo', 'mine'])).stdout.toString()).toBe('mine\n');
    await taken.destroy();
    // a create may take a standby too, with labels of its own; the pool's image, name and limits are its own
    await expect(lab().create({ pool: `cpool-${kind}`, name: 'mine' })).rejects.toMatchObject({ code: 'BAD_INPUT' });
    const standby = await lab().create({ pool: `cpool-${kind}`, labels: { taken: kind }, timeoutS: 0 });
    expect([standby.image, standby.labels, standby.state]).toEqual(['busybox', { taken: kind }, 'running']);
    await standby.destroy();
    expect((await pool.stats()).name).toBe(`cpool-${kind}`);
    await pool.remove();
  });

  it.runIf(whole)('lists by owner and as recorded; gets as recorded; refreshes; checks; traces', async () => {
    const box = await lab().create({ name: `o-${kind}`, labels: { suite: 'owner', kind }, timeoutS: 0 });
    try {
      expect(box.pool).toBeNull();
      // its owner: the key that made it through a daemon, or none (null) on the embedded lab
      const mine = await lab().list({ owner: box.owner, labels: { kind } });
      expect(mine.map((b) => b.name)).toContain(`o-${kind}`);
      expect(await lab().list({ owner: 'no-such-key', labels: { kind } })).toEqual([]);
      const recorded = await lab().list({ check: false, labels: { suite: 'owner', kind } });
      expect(recorded.map((b) => [b.name, b.state])).toEqual([[`o-${kind}`, 'running']]);
      expect((await lab().get(`o-${kind}`, { check: false })).id).toBe(box.id);
      await expect(lab().get('no-such-box', { check: false })).rejects.toMatchObject({ code: 'SANDBOX_NOT_FOUND' });
      // another handle of the same sandbox sees a pause made through this one once refreshed
      const other = await lab().get(box.id);
      await box.pause();
      expect((await other.refresh()).state).toBe('paused');
      await box.resume();
      expect((await other.refresh()).state).toBe('running');
      // a check pass leaves a live sandbox be, and says what it removed
      const checked = await lab().check();
      expect(checked.removed.map((r) => r.id)).not.toContain(box.id);
      expect((await lab().get(box.id)).state).toBe('running');
      // its create and pause are stored traces, found by its name
      const traces = await lab().traces({ targets: [box.name, box.id], limit: 50 });
      expect(traces.map((t) => t.kind)).toEqual(expect.arrayContaining(['create', 'pause', 'resume']));
      expect(await lab().traces({ targets: [] })).toEqual([]);
      const one = await lab().trace(traces[0]!.id);
      expect(one).toMatchObject({ id: traces[0]!.id, kind: traces[0]!.kind });
      expect(await lab().trace('no-such-operation')).toBeUndefined();
    } finally {
      await box.destroy();
    }
  });

  it('a detached process: its output held at its source and released, its input live', async () => {
    const box = await lab().create({ name: `d-${kind}` });
    try {
      const seen: string[] = [];
      const p = await box.spawn(['sh', '-c', 'read a; sleep 0.3; echo got:$a'], {
        detached: true,
        stdin: true,
        onStdout: (b) => seen.push(b.toString()),
      });
      expect(p.hold).toBeTypeOf('function');
      p.hold!(true);
      p.write('x\n');
      let ended = false;
      void p.result.then(() => (ended = true));
      await new Promise((r) => setTimeout(r, 1000));
      // held: neither its output nor its end has come through
      expect([seen.join(''), ended]).toEqual(['', false]);
      p.hold!(false);
      const r = await p.result;
      expect([r.exitCode, seen.join('')]).toEqual([0, 'got:x\n']);
    } finally {
      await box.destroy();
    }
  });

  it('a kept process outlives its caller: listed with its tag, taken on again by pid, its output from then', async () => {
    const box = await lab().create({ name: `k-${kind}` });
    try {
      let early = '';
      const p = await box.spawn(['sh', '-c', 'echo early; read a; echo got:$a'], {
        keep: true,
        tag: 'job',
        stdin: true,
        detached: true,
        onStdout: (b) => void (early += b.toString()),
      });
      const pid = await p.pid;
      // its first line read before it is let go (on a loaded host the shell may not have written it
      // yet): what `since` counts below
      for (const end = Date.now() + 20_000; !early.includes('early'); await new Promise((r) => setTimeout(r, 20)))
        if (Date.now() > end) throw new Error('the kept command never wrote its first line');
      const plain = await box.spawn(['sleep', '600'], { detached: true });
      expect((await box.kept()).map((k) => [k.pid, k.tag, k.stdin, k.tty])).toEqual([[pid, 'job', true, false]]);
      // only a kept one is taken on by pid
      await expect(box.attach(await plain.pid, {})).rejects.toMatchObject({ code: 'PROCESS_NOT_FOUND' });
      // its caller lets go: it runs on (the one not kept ends)
      p.disconnect!();
      plain.disconnect!();
      await p.result.catch(noted);
      await plain.result.catch(noted);
      const kept = await box.kept();
      expect(kept.map((k) => [k.pid, k.tag, k.held])).toEqual([[pid, 'job', false]]);
      expect(kept[0]!.startedAt).toBeLessThanOrEqual(Date.now());
      let out = '';
      const again = await box.attach(pid, { onStdout: (b) => (out += b.toString()) });
      expect(await again.pid).toBe(pid);
      // its output starts after what it wrote before ("early\n")
      expect(again.since).toBe(6);
      again.write('x\n');
      const r = await again.result;
      // what it wrote while nobody held it is not replayed
      expect([r.exitCode, out]).toEqual([0, 'got:x\n']);
      expect(await box.kept()).toEqual([]);
      await expect(box.attach(pid, {})).rejects.toMatchObject({ code: 'PROCESS_NOT_FOUND' });
    } finally {
      await box.destroy();
    }
  });

  it.runIf(whole)("a pool's takes are told from its traces", async () => {
    const pool = await lab().createPool({ name: `tpool-${kind}`, image: 'busybox', size: 1, limits: {} });
    try {
      const before = await pool.takes({ since: 60_000 });
      expect(before.takes).toEqual([]);
      const taken = await pool.take();
      await taken.destroy();
      const after = await pool.takes({ since: 60_000 });
      expect(after.takes).toEqual([expect.objectContaining({ kind: 'take', hit: expect.any(Boolean) })]);
      expect(after.now).toBeGreaterThanOrEqual(after.takes[0]!.at);
      expect((await pool.takes({ after: after.next })).takes).toEqual([]);
    } finally {
      await pool.remove();
    }
  });
}
