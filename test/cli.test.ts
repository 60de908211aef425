import { spawnSync, spawn } from 'node:child_process';
import {
  closeSync,
  existsSync,
  mkdtempSync,
  openSync,
  readFileSync,
  realpathSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { once } from 'node:events';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

// End-to-end: the built CLI, as a user runs it (npm test builds first).
import { SNAPLAB } from './cli-command.js';
import { Lab } from '../src/sdk/lab.js';
import { removeMany } from '../src/sdk/bulk.js';
let home: string;

function snaplab(
  args: string[],
  opts: { input?: string; uid?: number; env?: NodeJS.ProcessEnv } = {},
): { code: number; out: string; err: string } {
  const r = spawnSync(SNAPLAB, args, {
    env: { ...process.env, SNAPLAB_HOME: home, ...opts.env },
    input: opts.input,
    encoding: 'utf8',
    uid: opts.uid,
    timeout: 60_000,
  });
  return { code: r.status ?? -1, out: r.stdout, err: r.stderr };
}

beforeAll(() => {
  home = mkdtempSync(join(tmpdir(), 'snaplab-test-cli-'));
});
afterAll(() => {
  snaplab(['rm', '--all']);
  for (const s of JSON.parse(snaplab(['snapshot', 'ls', '--json']).out || '[]') as { name: string }[])
    snaplab(['snapshot', 'rm', s.name]);
  for (const i of JSON.parse(snaplab(['image', 'ls', '--json']).out || '[]') as { name: string }[])
    snaplab(['image', 'rm', i.name]);
  snaplab(['gc']);
  rmSync(home, { recursive: true, force: true });
});

describe('snaplab CLI', () => {
  it('doctor --json says the default driver and a storage backend work', () => {
    const r = snaplab(['doctor', '--json']);
    expect(r.code).toBe(0);
    const d = JSON.parse(r.out);
    expect(d.ok).toBe(true);
    expect(d.defaultStorage).toMatch(/btrfs|overlay|dir/);
    expect(d.checks.find((c: { name: string }) => c.name === 'namespaces').ok).toBe(true);
    // the per-host limits a climb meets, each with the count of idle sandboxes it allows (src/host/limits.ts)
    const limits = d.checks.find((c: { name: string }) => c.name === 'host limits');
    expect(limits).toMatchObject({ kind: 'host', optional: true, ok: expect.any(Boolean) });
    for (const what of [
      'idle sandboxes this host allows: ',
      'kernel.pid_max=',
      'open files',
      'memory cgroup ids',
      'uid ranges',
    ])
      expect(limits.reason).toContain(what);
    if (!limits.ok) expect(limits.fix).toBeTruthy();
  });

  it('prepare fetches what VMs need ahead of time; a bad driver is an error with a hint', () => {
    const r = snaplab(['prepare', '--driver', 'qemu', '--json']);
    expect(r.code, r.err).toBe(0);
    const p = JSON.parse(r.out) as { image: string; vm: { version: string; kernel: string; initramfs: string } };
    expect(p.image).toBe('busybox');
    expect(p.vm.version).toMatch(/cloud-amd64$/);
    expect(existsSync(p.vm.kernel) && existsSync(p.vm.initramfs)).toBe(true);
    expect(p.vm.kernel.startsWith(home)).toBe(true); // cached under SNAPLAB_HOME
    const again = snaplab(['prepare', '--driver', 'qemu', '--json']);
    expect(again.err).not.toMatch(/downloading/); // from the cache
    const bad = snaplab(['prepare', '--driver', 'firecracker']);
    expect(bad.code).toBe(2);
    expect(bad.err).toMatch(/DRIVER_UNAVAILABLE[\s\S]*hint: available drivers: namespaces, qemu/);
  });

  it('create --json, exec with exit codes, snapshot, restore, trace, ls, rm', () => {
    const c = snaplab([
      'create',
      '--image',
      'busybox',
      '--name',
      'cli1',
      '--memory',
      '128M',
      '--pids',
      '256',
      '--json',
    ]);
    expect(c.code).toBe(0);
    const box = JSON.parse(c.out);
    expect(box).toMatchObject({ name: 'cli1', state: 'running', driver: 'namespaces' });
    expect(box.id).toMatch(/^[0-9a-f]{12}$/);
    expect(box.storage).toMatch(/btrfs|overlay|dir/);

    expect(snaplab(['exec', 'cli1', '--', 'sh', '-c', 'echo out; echo err >&2; exit 7'])).toMatchObject({
      code: 7,
      out: 'out\n',
      err: 'err\n',
    });
    expect(snaplab(['exec', 'cli1', '--', 'nosuch']).code).toBe(127);
    expect(snaplab(['exec', 'cli1', '--timeout', '0.3', '--', 'sleep', '5']).code).toBe(124);
    expect(snaplab(['exec', 'cli1', '--', 'sh', '-c', 'kill -KILL $$']).code).toBe(137);
    expect(snaplab(['exec', '-i', 'cli1', '--', 'cat'], { input: 'piped' }).out).toBe('piped');
    expect(
      snaplab(['exec', 'cli1', '--env', 'A=1', '--env', 'B=2', '--cwd', '/etc', '--', 'sh', '-c', 'echo $A$B $(pwd)'])
        .out,
    ).toBe('12 /etc\n');

    snaplab(['exec', 'cli1', '--', 'sh', '-c', 'echo v1 > /root/v']);
    const s = snaplab(['snapshot', 'cli1', '--name', 'cli-snap', '--json', '--trace']);
    expect(s.code).toBe(0);
    expect(JSON.parse(s.out).name).toBe('cli-snap');
    expect(s.err).toMatch(/freeze[\s\S]*snapshot storage[\s\S]*thaw[\s\S]*\(unattributed\)/);
    const listed = (
      JSON.parse(snaplab(['snapshot', 'ls', '--json']).out) as { name: string; driver: string; kind: string }[]
    ).find((x) => x.name === 'cli-snap');
    expect(listed).toMatchObject({ driver: 'namespaces', kind: 'filesystem' });
    expect(snaplab(['snapshot', 'ls']).out).toMatch(
      /^NAME\s+FROM\s+IMAGE\s+STORAGE\s+DRIVER\s+KIND\s+CREATED\ncli-snap\s+cli1\s+busybox\s+\S+\s+namespaces\s+filesystem\s/m,
    );
    snaplab(['exec', 'cli1', '--', 'sh', '-c', 'echo v2 > /root/v']);
    const r = snaplab(['restore', 'cli-snap', '--name', 'cli2', '--json']);
    expect(r.code).toBe(0);
    expect(snaplab(['exec', 'cli2', '--', 'cat', '/root/v']).out).toBe('v1\n');

    const op = JSON.parse(r.out).operation as string;
    const t = snaplab(['trace', op]);
    expect(t.code).toBe(0);
    expect(t.out).toMatch(
      /clone rootfs[\s\S]*cgroup[\s\S]*launch[\s\S]*agent connect[\s\S]*first exec[\s\S]*\(unattributed\)/,
    );

    const ls = JSON.parse(snaplab(['ls', '--json']).out) as { name: string; state: string }[];
    expect(ls.map((b) => b.name).sort()).toEqual(['cli1', 'cli2']);
    expect(snaplab(['pause', 'cli2']).code).toBe(0);
    const paused = snaplab(['exec', 'cli2', '--', 'true']);
    expect(paused.code).toBe(125);
    expect(paused.err).toMatch(/SANDBOX_PAUSED[\s\S]*hint: resume/);
    expect(snaplab(['resume', 'cli2']).code).toBe(0);
    expect(snaplab(['rm', 'cli1', 'cli2']).code).toBe(0);
    expect(JSON.parse(snaplab(['ls', '--json']).out)).toEqual([]);
    expect(snaplab(['snapshot', 'rm', 'cli-snap']).code).toBe(0);
  });

  it('stop keeps the filesystem: ls says stopped, exec is refused with a hint, a snapshot of it restores, start boots it again', () => {
    expect(snaplab(['create', '--name', 'st1']).code).toBe(0);
    expect(snaplab(['exec', 'st1', '--', 'sh', '-c', 'echo kept > /root/f']).code).toBe(0);
    expect(snaplab(['stop', 'st1'])).toMatchObject({ code: 0, out: 'stopped st1\n' });
    const ls = JSON.parse(snaplab(['ls', '--json']).out).find((b: { name: string }) => b.name === 'st1');
    expect([ls.state, ls.reason]).toEqual(['dead', expect.stringMatching(/^stopped/)]);
    expect(snaplab(['ls']).out).not.toMatch(/st1.*NO USER NAMESPACE/);
    expect(snaplab(['exec', 'st1', '--', 'true'])).toMatchObject({
      code: 125,
      err: expect.stringMatching(/SANDBOX_STOPPED.*is stopped[\s\S]*hint: start it again/),
    });
    expect(snaplab(['snapshot', 'st1', '--name', 'st1-snap']).code).toBe(0);
    expect(snaplab(['restore', 'st1-snap', '--name', 'st2']).code).toBe(0);
    expect(snaplab(['exec', 'st2', '--', 'cat', '/root/f']).out).toBe('kept\n');
    // stopped again: refused; started: a fresh boot on its files
    expect(snaplab(['stop', 'st1'])).toMatchObject({ code: 2, err: expect.stringMatching(/SANDBOX_STOPPED/) });
    expect(snaplab(['start', 'st1', '--json'])).toMatchObject({
      code: 0,
      out: '{\n  "started": [\n    "st1"\n  ]\n}\n',
    });
    expect(snaplab(['exec', 'st1', '--', 'cat', '/root/f']).out).toBe('kept\n');
    expect(snaplab(['start', 'st1'])).toMatchObject({
      code: 2,
      err: expect.stringMatching(/SANDBOX_RUNNING[\s\S]*hint: stop it first/),
    });
    expect(snaplab(['rm', 'st1', 'st2']).code).toBe(0);
    expect(snaplab(['snapshot', 'rm', 'st1-snap']).code).toBe(0);
  });

  it('rm of a sandbox another process is still creating is refused (SANDBOX_BUSY), skipped by a bulk rm; once up, it is removed', async () => {
    const lab = await Lab.open({ home });
    const child = spawn(SNAPLAB, ['create', '--name', 'busy', '--label', 'busy=1'], {
      env: { ...process.env, SNAPLAB_HOME: home },
      stdio: 'ignore',
    });
    const exited = once(child, 'exit');
    try {
      // held while its record says creating: what an rm from elsewhere meets mid-create
      let held = false;
      for (let i = 0; i < 5000 && !held && child.exitCode === null; i++) {
        if (lab.context.store.getSandbox('busy')?.state === 'creating') held = child.kill('SIGSTOP');
        else await new Promise((r) => setTimeout(r, 1));
      }
      expect(held, 'the create was seen creating').toBe(true);
      await expect((await lab.get('busy')).destroy()).rejects.toMatchObject({ code: 'SANDBOX_BUSY' });
      expect(snaplab(['rm', 'busy'])).toMatchObject({
        code: 2,
        err: expect.stringMatching(/SANDBOX_BUSY.*being created \(by pid \d+\)/),
      });
      // rm --all's removal (its labels are written as the create ends: --label cannot match it yet)
      const skipped: string[] = [];
      expect(
        await removeMany(lab, [await lab.get('busy')], { onSkipped: (n, why) => skipped.push(`${n}: ${why.code}`) }),
      ).toEqual([]);
      expect(skipped).toEqual(['busy: SANDBOX_BUSY']);
      // its record and its uid range are its creator's still
      const rec = lab.context.store.getSandbox('busy');
      expect(rec?.state).toBe('creating');
      child.kill('SIGCONT');
      expect((await exited)[0]).toBe(0);
      expect(lab.context.store.getSandbox('busy')?.state).toBe('running');
      expect(snaplab(['rm', 'busy']).code).toBe(0);
    } finally {
      child.kill('SIGCONT');
      if (child.exitCode === null) await exited;
      snaplab(['rm', 'busy']);
      lab.close();
    }
  });

  it('ls pages (--limit, --after: the next cursor on stderr, or in the JSON) and counts by state (--count)', async () => {
    const lab = await Lab.open({ home });
    try {
      const made: string[] = [];
      // one at a time: each sorts after the one before (creation time, then id)
      for (let i = 0; i < 3; i++) made.push((await lab.create({ image: 'busybox', labels: { pg: 'x' } })).name);
      const first = snaplab(['ls', '--limit', '2', '--label', 'pg=x']);
      expect(first.code, first.err).toBe(0);
      expect(
        first.out
          .trim()
          .split('\n')
          .slice(1)
          .map((l) => l.split(/\s+/)[1]),
      ).toEqual(made.slice(0, 2));
      const cursor = /^next page: snaplab ls --limit 2 --label 'pg=x' --after (\S+)\n$/.exec(first.err)?.[1];
      expect(cursor, first.err).toBeDefined();
      const second = snaplab(['ls', '--limit', '2', '--label', 'pg=x', '--after', cursor!]);
      expect(
        second.out
          .trim()
          .split('\n')
          .slice(1)
          .map((l) => l.split(/\s+/)[1]),
      ).toEqual([made[2]]);
      expect(second.err).toBe(''); // a page shorter than the limit is the last
      const json = JSON.parse(snaplab(['ls', '--json', '--limit', '2', '--label', 'pg=x']).out);
      expect(json.sandboxes.map((b: { name: string }) => b.name)).toEqual(made.slice(0, 2));
      expect(json.nextCursor).toBe(cursor);
      expect(JSON.parse(snaplab(['ls', '--json', '--limit', '1', '--after', cursor!, '--label', 'pg=x']).out)).toEqual({
        sandboxes: [expect.objectContaining({ name: made[2] })],
        nextCursor: expect.stringMatching(/^\d+\.[0-9a-f]{12}$/),
      });
      await (await lab.get(made[0]!)).pause();
      expect(snaplab(['ls', '--count', '--label', 'pg=x'])).toMatchObject({
        code: 0,
        out: '3 sandboxes: 1 paused, 2 running\n',
      });
      expect(JSON.parse(snaplab(['ls', '--count', '--json', '--label', 'pg=x']).out)).toEqual({
        total: 3,
        byState: { paused: 1, running: 2 },
      });
      expect(snaplab(['ls', '--count', '--label', 'pg=none']).out).toBe('0 sandboxes\n');
      // a count checks the records first: one whose init was killed from outside is counted dead
      const victim = (await lab.get(made[1]!)).info.pid!;
      process.kill(victim, 'SIGKILL');
      for (const end = Date.now() + 10_000; existsSync(`/proc/${victim}`) && Date.now() < end; )
        await new Promise((r) => setTimeout(r, 50));
      expect(existsSync(`/proc/${victim}`), 'its init reaped').toBe(false);
      expect(snaplab(['ls', '--count', '--label', 'pg=x']).out).toBe('3 sandboxes: 1 dead, 1 paused, 1 running\n');
      expect(snaplab(['ls', '--count', '--limit', '2']).err).toMatch(/error\[BAD_INPUT\]: --count[\s\S]*hint:/);
      expect(snaplab(['ls', '--limit', '0']).err).toMatch(/error\[BAD_INPUT\]: invalid limit "0"[\s\S]*hint:/);
      expect(snaplab(['ls', '--limit', '1', '--after', 'nope']).err).toMatch(/error\[BAD_INPUT\]: invalid list cursor/);
      expect(snaplab(['rm', '--label', 'pg=x']).code).toBe(0);
    } finally {
      lab.close();
    }
  });

  it('create --count makes them in order under a prefix, or none: a failure or ^C removes what it made', async () => {
    const made = snaplab(['create', '--count', '4', '--name', 'n', '--label', 'batch=n']);
    expect(made, made.err).toMatchObject({ code: 0, out: 'n-1\nn-2\nn-3\nn-4\n' });
    expect(made.err).toMatch(/^created 4 in [\d.]+ s \([\d.]+\/s\)\n$/);
    // every name is taken: none made
    const clash = snaplab(['create', '--count', '4', '--name', 'n', '--parallel', '1', '--json']);
    expect(clash.code).toBe(2);
    expect(JSON.parse(clash.err).error).toMatchObject({ code: 'SANDBOX_EXISTS', message: /^no sandbox made: / });
    // n-3 is taken: n-1 and n-2 (one at a time) are made, then removed
    snaplab(['rm', 'n-1', 'n-2']);
    const again = snaplab(['create', '--count', '4', '--name', 'n', '--parallel', '1']);
    expect(again.err).toMatch(/error\[SANDBOX_EXISTS\]: the 2 made were removed: a sandbox named n-3/);
    expect(snaplab(['ls', '--count']).out).toBe('2 sandboxes: 2 running\n');
    // a name is a prefix whatever the count
    expect(snaplab(['create', '--count', '1', '--name', 'solo']).out).toBe('solo-1\n');
    expect(snaplab(['rm', 'solo-1']).code).toBe(0);
    for (const [args, re] of [
      [['--count', '0'], /error\[BAD_INPUT\]: invalid --count "0"\nhint: --count must be a positive whole number/],
      [['--count', '1e1'], /error\[BAD_INPUT\]: invalid --count "1e1"/],
      [['--count', '100001'], /error\[BAD_INPUT\]: a count of 100001 sandboxes\nhint: a whole number from 1 to 100000/],
      [
        ['--count', '2', '--parallel', '65'],
        /error\[BAD_INPUT\]: 65 calls in flight\nhint: parallel: a whole number from 1 to 64/,
      ],
      [['--parallel', '2'], /error\[BAD_INPUT\]: --parallel is for --count/],
      [['--count', '2', '--trace'], /error\[BAD_INPUT\]: --trace shows one create/],
    ] as [string[], RegExp][])
      expect(snaplab(['create', ...args]).err).toMatch(re);
    // ^C once it has told its progress: what it made is removed, and it says so
    // as a terminal's ^C: to the whole foreground process group (its own here), helpers and tools included
    const child = spawn(SNAPLAB, ['create', '--count', '2000', '--label', 'batch=int'], {
      env: { ...process.env, SNAPLAB_HOME: home },
      detached: true,
    });
    let err = '';
    let interrupted = false;
    child.stderr.on('data', (b: Buffer) => {
      err += b;
      if (/created \(/.test(err) && child.signalCode === null && !interrupted) {
        process.kill(-child.pid!, 'SIGINT');
        interrupted = true;
      }
    });
    const [code] = await once(child, 'exit');
    expect(code, err).toBe(2);
    expect(err).toMatch(
      /… \d+\/2000 created \([\d.]+\/s\)\n[\s\S]*error\[ABORTED\]: the \d+ made were removed: the create was interrupted\nhint:/,
    );
    expect(snaplab(['ls', '--count', '--label', 'batch=int']).out).toBe('0 sandboxes\n');
    expect(snaplab(['rm', '--label', 'batch=n']).out).toMatch(/^removed n-[34], n-[34]\n$/);
  }, 120_000);

  it('rm --label interrupted (^C to its group): those under way finish, none more begin; what it removed is said', async () => {
    const made = snaplab(['create', '--count', '300', '--label', 'batch=stop']);
    expect(made.code, made.err).toBe(0);
    const lab = await Lab.open({ home });
    const child = spawn(SNAPLAB, ['rm', '--label', 'batch=stop'], {
      env: { ...process.env, SNAPLAB_HOME: home },
      detached: true,
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (b: Buffer) => (out += b));
    child.stderr.on('data', (b: Buffer) => (err += b));
    const exited = once(child, 'exit');
    try {
      // ^C once its removals have begun (the store's count falls), read from the store at once
      const left = async (): Promise<number> =>
        (await lab.list({ labels: { batch: 'stop' }, check: false })).filter((b) => b.state !== 'removing').length;
      for (let i = 0; i < 20_000 && child.exitCode === null && (await left()) === 300; i++)
        await new Promise((r) => setTimeout(r, 2));
      process.kill(-child.pid!, 'SIGINT');
      const [code] = await exited;
      const remaining = await left();
      expect([code, remaining > 0], `${out}${err}`).toEqual([2, true]);
      expect(err).toMatch(
        /error\[ABORTED\]: \d+ of 300 sandboxes not removed \(\d+ removed; \d+ not begun: interrupted\): the removal was interrupted\nhint:/,
      );
      // what it did remove, on stdout as when it ends
      expect(out).toMatch(/^removed (\d+ sandboxes|[\w-]+(, [\w-]+)*)\n$/);
    } finally {
      if (child.exitCode === null) await exited;
      lab.close();
      expect(snaplab(['rm', '--label', 'batch=stop']).code).toBe(0);
    }
  }, 120_000);

  it('rm --label removes every sandbox with the label; the others stay; names with --all, and --all with --label, are refused', async () => {
    const lab = await Lab.open({ home });
    try {
      const made = [
        ...JSON.parse(snaplab(['create', '--count', '11', '--label', 'batch=a', '--json']).out),
        await lab.create({ image: 'busybox', labels: { batch: 'b' } }),
      ] as { name: string }[];
      const keep = made.slice(11).map((b) => b.name);
      const r = snaplab(['rm', '--label', 'batch=a']);
      expect(r, r.err).toMatchObject({ code: 0, out: 'removed 11 sandboxes\n' });
      const left = JSON.parse(snaplab(['ls', '--json']).out) as { name: string }[];
      expect(left.map((b) => b.name).sort()).toEqual([...keep].sort());
      expect(snaplab(['rm', '--label', 'batch=a', '--json']).out).toBe('{\n  "removed": []\n}\n');
      const both = snaplab(['rm', keep[0]!, '--all']);
      expect(both.code).toBe(2);
      expect(both.err).toMatch(/error\[BAD_INPUT\]: give names, or --all \/ --label, not both[\s\S]*hint:/);
      expect(snaplab(['rm', '--all', '--label', 'batch=b']).err).toMatch(
        /error\[BAD_INPUT\]: --all or --label, not both/,
      );
      expect(JSON.parse(snaplab(['rm', '--label', 'batch=b', '--json']).out)).toEqual({
        removed: expect.arrayContaining(keep),
      });
      expect(JSON.parse(snaplab(['ls', '--json']).out)).toEqual([]);
    } finally {
      lab.close();
    }
  });

  it('bad input: a code, a hint, no stack trace, exit 2 (125 from exec)', () => {
    const cases: [string[], number, RegExp][] = [
      [['create', '--image', 'nope'], 2, /IMAGE_NOT_FOUND[\s\S]*hint:/],
      [['create', '--memory', 'lots'], 2, /BAD_SIZE[\s\S]*hint:/],
      [['create', '--pids', '-1'], 2, /hint:/],
      [['create', '--storage', 'zfs'], 2, /unknown storage[\s\S]*hint:/],
      [['exec', 'ghost', '--', 'true'], 125, /SANDBOX_NOT_FOUND[\s\S]*hint:/],
      [['exec', 'ghost', '--bogus', '--', 'true'], 125, /unknown option[\s\S]*hint:/],
      [['exec', 'ghost', '--timeout', 'soon', '--', 'true'], 125, /invalid timeout[\s\S]*hint:/],
      [['restore', 'ghost'], 2, /SNAPSHOT_NOT_FOUND/],
      [['snapshot', 'ghost', '--name', 'x'], 2, /SANDBOX_NOT_FOUND/],
      [['trace', 'op-none'], 2, /OPERATION_NOT_FOUND/],
      [['frobnicate'], 2, /unknown command[\s\S]*hint:/],
      [['create', '--bogus'], 2, /unknown option[\s\S]*hint:/],
    ];
    for (const [args, code, re] of cases) {
      const r = snaplab(args);
      expect({ args, code: r.code }).toEqual({ args, code });
      expect(r.err).toMatch(re);
      expect(r.err).not.toMatch(/\n\s+at /);
    }
  });

  it('pool create, run --pool with --put, run --image, pool ls, pool rm', () => {
    const c = snaplab(['pool', 'create', 'cp1', '--size', '1', '--json']);
    expect(c.code).toBe(0);
    expect(JSON.parse(c.out)).toMatchObject({ name: 'cp1', target: 1, ready: 1 });
    const job = join(home, 'job.sh');
    writeFileSync(job, 'echo from-job; exit 3\n');
    const r = snaplab(['run', '--pool', 'cp1', '--put', `${job}:/root/job.sh`, '--', 'sh', '/root/job.sh']);
    expect(r).toMatchObject({ code: 3, out: 'from-job\n' });
    const j = JSON.parse(snaplab(['run', '--pool', 'cp1', '--json', '--', 'echo', 'hi']).out);
    expect(j).toMatchObject({ exitCode: 0, stdout: 'hi\n', recycled: expect.any(Boolean) });
    expect(snaplab(['run', '--image', 'busybox', '--', 'sh', '-c', 'exit 5']).code).toBe(5);
    expect(snaplab(['run', '--pool', 'nope', '--', 'true'])).toMatchObject({
      code: 125,
      err: expect.stringMatching(/POOL_NOT_FOUND[\s\S]*hint:/),
    });
    expect(snaplab(['run', '--pool', 'cp1', '--put', 'nocolon', '--', 'true']).code).toBe(125);
    const ls = JSON.parse(snaplab(['pool', 'ls', '--json']).out) as Record<string, unknown>[];
    expect(ls[0]).toMatchObject({ name: 'cp1', target: 1 });
    for (const k of ['ready', 'inUse', 'hits', 'misses', 'recycled', 'refusedDirty', 'leaks'])
      expect(typeof ls[0]![k]).toBe('number');
    expect(snaplab(['pool', 'rm', 'cp1']).code).toBe(0);
    expect(JSON.parse(snaplab(['ls', '--json']).out)).toEqual([]);
  });

  it('pool serve keeps a pool at its target while runs take from it, and stops on SIGINT', async () => {
    expect(snaplab(['pool', 'create', 'served', '--size', '2']).code).toBe(0);
    const serve = spawn(SNAPLAB, ['pool', 'serve', 'served'], {
      env: { ...process.env, SNAPLAB_HOME: home },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    serve.stdout.on('data', (b: Buffer) => (out += b.toString()));
    for (let i = 0; i < 4; i++)
      expect(snaplab(['run', '--pool', 'served', '--', 'sh', '-c', 'echo dirty > /root/x']).code).toBe(0);
    const ready = async (): Promise<number> =>
      (JSON.parse(snaplab(['pool', 'ls', '--json']).out) as { name: string; ready: number }[]).find(
        (p) => p.name === 'served',
      )!.ready;
    for (let i = 0; i < 200 && (await ready()) < 2; i++) await new Promise((r) => setTimeout(r, 100));
    expect(await ready()).toBe(2);
    serve.kill('SIGINT');
    const code = await new Promise((r) => serve.once('exit', r));
    expect(code).toBe(0);
    expect(out).toMatch(/pool served: ready \d\/2/);
    expect(snaplab(['pool', 'rm', 'served']).code).toBe(0);
  });

  it('refuses to run as non-root and says what needs root', () => {
    const r = snaplab(['ls'], { uid: 65534 });
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/NOT_ROOT[\s\S]*hint:/);
  });

  it('a CLI killed in the middle of create leaves no claimed sandbox; gc removes what it made', async () => {
    const child = spawn(SNAPLAB, ['create', '--name', 'killed'], {
      env: { ...process.env, SNAPLAB_HOME: home },
      stdio: 'ignore',
    });
    // kill as soon as the record exists: mid-operation
    for (let i = 0; i < 400; i++) {
      await new Promise((r) => setTimeout(r, 5));
      const l = snaplab(['ls', '--json']);
      if (l.out.includes('killed')) break;
    }
    child.kill('SIGKILL');
    await new Promise((r) => child.on('exit', r));
    const states = (JSON.parse(snaplab(['ls', '--json']).out) as { name: string; state: string }[]).filter(
      (b) => b.name === 'killed',
    );
    for (const b of states) expect(['dead', 'running']).toContain(b.state);
    const gc = snaplab(['gc', '--json']);
    expect(gc.code).toBe(0);
    snaplab(['rm', '--all']);
    expect(JSON.parse(snaplab(['ls', '--json']).out)).toEqual([]);
  });

  it('exec gives the same codes, output and errors on the fast path (C) and the Node path', () => {
    expect(snaplab(['create', '--name', 'both', '--memory', '64M']).code).toBe(0);
    const seen: unknown[] = [];
    for (const env of [{}, { SNAPLAB_NO_FAST_EXEC: '1' }]) {
      const x = (args: string[], input?: string) => {
        const r = snaplab(args, { env, input });
        return { code: r.code, out: r.out, err: r.err };
      };
      seen.push([
        x(['exec', 'both', '--', 'sh', '-c', 'echo out; echo err >&2; exit 7']),
        x(['exec', 'both', '--', 'nosuch']),
        x(['exec', 'both', '--', 'sh', '-c', 'kill -KILL $$']),
        x(['exec', '-i', 'both', '--', 'cat'], 'piped'),
        x([
          'exec',
          'both',
          '-e',
          'A=1',
          '--env=B=2',
          '--env',
          'PATH=/bin',
          '--cwd=/etc',
          '--',
          'sh',
          '-c',
          'echo $A$B $PATH $(pwd)',
        ]),
        x(['exec', 'both', '--timeout', '0.3', '--', 'sleep', '5']),
        x(['exec', 'both', '--cwd', '/nope', '--', 'pwd']), // refused before it starts
        x(['exec', 'both', 'echo', 'operands', '--', 'and', 'argv']),
        x(['exec', 'both', '--', '--', 'echo', 'dashes']),
        x(['exec', 'both', '--', 'dd', 'if=/dev/zero', 'of=/dev/null', 'bs=200M', 'count=1']), // OOM-killed in its 64M
        x(['exec', 'ghost', '--', 'true']),
        x(['exec', 'both', '--env', 'novalue', '--', 'true']),
        x(['exec', 'both', '--timeout', '1e3', '--', 'true']),
        x(['exec', 'both', '--json', '--cwd', '/nope', '--', 'true']),
      ]);
    }
    // output that cannot be written: a reader gone (141, as SIGPIPE), a full disk (125, and why)
    for (const env of [{}, { SNAPLAB_NO_FAST_EXEC: '1' }]) {
      const full = openSync('/dev/full', 'w');
      const r = spawnSync(SNAPLAB, ['exec', 'both', '--', 'sh', '-c', 'echo x; exit 4'], {
        env: { ...process.env, SNAPLAB_HOME: home, ...env },
        stdio: ['ignore', full, 'pipe'],
        encoding: 'utf8',
      });
      closeSync(full);
      seen.push({ code: r.status, err: r.stderr });
      const piped = spawnSync('sh', ['-c', `"${SNAPLAB}" exec both -- yes | head -1`], {
        env: { ...process.env, SNAPLAB_HOME: home, ...env },
        encoding: 'utf8',
        timeout: 20_000,
      });
      seen.push([piped.stdout, piped.signal]); // `yes` ends when its reader does: no timeout kill
    }
    expect(seen[2]).toEqual(seen[4]);
    expect(seen[2]).toEqual({
      code: 125,
      err: "error[OUTPUT_FAILED]: cannot write the command's output (ENOSPC)\nhint: is there room where stdout goes?\n",
    });
    expect([seen[3], seen[5]]).toEqual([
      ['y\n', null],
      ['y\n', null],
    ]);
    expect(seen[0]).toEqual(seen[1]);
    const [fast] = seen as { code: number; out: string; err: string }[][];
    expect(fast!.map((r) => r.code)).toEqual([7, 127, 137, 0, 0, 124, 125, 0, 0, 137, 125, 125, 125, 125]);
    expect(fast![4]!.out).toBe('12 /bin /etc\n');
    expect(fast![5]!.err).toBe('snaplab: timed out after 0.3 s; killed\n');
    expect(fast![6]!.err).toMatch(
      /^error\[BAD_INPUT\]: cwd \/nope: No such file or directory \(ENOENT\)\nhint: give a directory/,
    );
    expect(fast![7]!.out).toBe('operands and argv\n');
    expect(fast![8]!.out).toBe('dashes\n');
    expect(fast![9]!.err).toMatch(/killed by the OOM killer/);
    expect(JSON.parse(fast![13]!.err).error.code).toBe('BAD_INPUT');
    expect(snaplab(['rm', 'both']).code).toBe(0);
  });

  it('the fast path runs no Node; a connection lost mid-command is reported as the Node CLI reports it', async () => {
    expect(snaplab(['create', '--name', 'fast']).code).toBe(0);
    // with no node on PATH only the C path can answer: anything it handed over would fail
    expect(snaplab(['exec', 'fast', '--', 'echo', 'no node'], { env: { PATH: '/nonexistent' } })).toMatchObject({
      code: 0,
      out: 'no node\n',
    });
    expect(snaplab(['exec', 'fast', '--bogus', '--', 'true'], { env: { PATH: '/nonexistent' } })).toMatchObject({
      code: 125,
      err: expect.stringMatching(/cannot start node/),
    });
    // the sandbox dies while a command runs: SANDBOX_DEAD and why, exit 125, not a retry
    const child = spawn(SNAPLAB, ['exec', 'fast', '--', 'sh', '-c', 'echo started; sleep 30'], {
      env: { ...process.env, SNAPLAB_HOME: home },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (b: Buffer) => (out += b.toString()));
    child.stderr.on('data', (b: Buffer) => (err += b.toString()));
    for (let i = 0; i < 200 && !out.includes('started'); i++) await new Promise((r) => setTimeout(r, 25));
    const box = (JSON.parse(snaplab(['ls', '--json']).out) as { name: string; pid: number }[]).find(
      (b) => b.name === 'fast',
    )!;
    process.kill(box.pid, 'SIGKILL');
    const code = await new Promise((r) => child.once('exit', r));
    expect(code).toBe(125);
    expect(err).toMatch(/^error\[SANDBOX_DEAD\]: [\s\S]*hint:/);
    expect(snaplab(['rm', 'fast']).code).toBe(0);
  });

  it("snaplab on PATH is this checkout's command (set-up links it)", () => {
    const found = spawnSync('sh', ['-c', 'command -v snaplab'], { encoding: 'utf8' }).stdout.trim();
    expect(found, 'run scripts/setup.sh: it links /usr/local/bin/snaplab').not.toBe('');
    expect(realpathSync(found)).toBe(realpathSync(SNAPLAB));
    // --version is answered by the command itself, from package.json; the Node CLI agrees
    const version = (
      JSON.parse(readFileSync(join(import.meta.dirname, '..', 'package.json'), 'utf8')) as { version: string }
    ).version;
    expect(snaplab(['--version'], { env: { PATH: '/nonexistent' } }).out).toBe(`${version}\n`);
    expect(
      spawnSync(process.execPath, [join(import.meta.dirname, '..', 'dist', 'bin', 'snaplab.js'), '--version'], {
        encoding: 'utf8',
      }).stdout,
    ).toBe(`${version}\n`);
  });
});
