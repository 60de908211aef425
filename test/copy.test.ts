/**
 * `snaplab cp`: trees in, out and between machines through the real CLI, a 200 MiB file with the
 * snaplab process's memory watched, and hostile archives fed to the receiving side (native/copy.c).
 */
import { spawn, spawnSync } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { agentBinaryPath, hostAgentBinaryPath } from '../src/agent/binary.js';
import { SNAPLAB } from './cli-command.js';

let home: string;
let work: string;

function snaplab(args: string[], input?: Buffer | string): { code: number; out: string; err: string } {
  const r = spawnSync(SNAPLAB, args, {
    env: { ...process.env, SNAPLAB_HOME: home },
    input,
    encoding: 'utf8',
    timeout: 120_000,
    maxBuffer: 64 << 20,
  });
  return { code: r.status ?? -1, out: r.stdout, err: r.stderr };
}

/** Runs snaplab and samples its peak resident memory (VmHWM) until it exits. */
async function peakRss(args: string[]): Promise<{ code: number; err: string; peakKb: number }> {
  const p = spawn(SNAPLAB, args, { env: { ...process.env, SNAPLAB_HOME: home }, stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  p.stderr.on('data', (b: Buffer) => (err += b.toString()));
  let peakKb = 0;
  const t = setInterval(() => {
    try {
      const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${p.pid}/status`, 'utf8'));
      if (m) peakKb = Math.max(peakKb, Number(m[1]));
    } catch {
      // gone
    }
  }, 20);
  const code = await new Promise<number>((res) => p.on('close', (c) => res(c ?? -1)));
  clearInterval(t);
  return { code, err, peakKb };
}

beforeAll(() => {
  home = mkdtempSync(join(tmpdir(), 'snaplab-test-cp-'));
  work = join(home, 'work');
  mkdirSync(work);
  expect(snaplab(['create', '--name', 'a']).code).toBe(0);
  expect(snaplab(['create', '--name', 'b']).code).toBe(0);
});
afterAll(() => {
  snaplab(['rm', '--all']);
  snaplab(['image', 'rm', '--force', 'busybox']);
  snaplab(['gc']);
  rmSync(home, { recursive: true, force: true });
});

describe('snaplab cp', () => {
  it('copies a tree in, out and between machines: modes, owners, links as links, nothing followed out', () => {
    const src = join(work, 'tree');
    mkdirSync(join(src, 'sub', 'deep'), { recursive: true });
    writeFileSync(join(src, 'setuid'), 'x');
    chmodSync(join(src, 'setuid'), 0o4755);
    mkdirSync(join(src, 'sticky'));
    chmodSync(join(src, 'sticky'), 0o1777);
    writeFileSync(join(src, 'sub', 'deep', 'f'), 'deep');
    chownSync(join(src, 'sub'), 1234, 5678);
    symlinkSync('/etc/passwd', join(src, 'outside')); // a link pointing out of the tree: copied as a link
    symlinkSync('../..', join(src, 'sub', 'up'));

    expect(snaplab(['cp', src, 'a:/tmp/']).code).toBe(0);
    const ls = snaplab([
      'exec',
      'a',
      '--',
      'sh',
      '-c',
      'cd /tmp/tree && stat -c "%n %a %u:%g %F" setuid sticky sub outside && readlink outside && readlink sub/up && cat sub/deep/f',
    ]);
    expect(ls.out).toBe(
      'setuid 4755 0:0 regular file\nsticky 1777 0:0 directory\nsub 755 1234:5678 directory\noutside 777 0:0 symbolic link\n/etc/passwd\n../..\ndeep',
    );

    // machine to machine, renamed (docker's rule: DEST does not exist, so it becomes the copy)
    expect(snaplab(['cp', 'a:/tmp/tree', 'b:/root/copy']).code).toBe(0);
    expect(snaplab(['exec', 'b', '--', 'stat', '-c', '%a %u:%g', '/root/copy/setuid', '/root/copy/sub']).out).toBe(
      '4755 0:0\n755 1234:5678\n',
    );

    // out to the host: owners kept, setuid dropped (said), the link not followed
    const out = join(work, 'out');
    const r = snaplab(['cp', 'b:/root/copy', out, '--json']);
    expect(r.code, r.err).toBe(0);
    expect(JSON.parse(r.out)).toMatchObject({
      complete: true,
      warnings: [expect.stringMatching(/1 file\(s\) copied without their setuid\/setgid bits/)],
    });
    expect(statSync(join(out, 'setuid')).mode & 0o7777).toBe(0o755);
    expect(statSync(join(out, 'sticky')).mode & 0o7777).toBe(0o1777);
    expect(statSync(join(out, 'sub')).uid).toBe(1234);
    expect(readlinkSync(join(out, 'outside'))).toBe('/etc/passwd');
    expect(readFileSync(join(out, 'sub', 'deep', 'f'), 'utf8')).toBe('deep');

    // contents with DIR/., into an existing directory; a tar stream each way
    expect(snaplab(['cp', `${src}/.`, 'a:/srv']).code).toBe(0);
    expect(snaplab(['exec', 'a', '--', 'ls', '/srv']).out.split('\n')).toContain('sticky');
    const tar = spawnSync(SNAPLAB, ['cp', 'a:/srv', '-'], {
      env: { ...process.env, SNAPLAB_HOME: home },
      maxBuffer: 64 << 20,
    });
    expect(tar.status).toBe(0);
    const listing = spawnSync('tar', ['-tv'], { input: tar.stdout, encoding: 'utf8' }).stdout;
    expect(listing).toMatch(/^drwx.* srv\/$/m);
    expect(listing).toMatch(/srv\/outside -> \/etc\/passwd/);
    expect(snaplab(['exec', 'a', '--', 'mkdir', '/in']).code).toBe(0);
    expect(snaplab(['cp', '-', 'a:/in'], tar.stdout).code).toBe(0);
    expect(snaplab(['exec', 'a', '--', 'cat', '/in/srv/sub/deep/f']).out).toBe('deep');
  });

  it('errors: a missing source, a file onto a missing directory, no machine side, a machine that is not there', () => {
    expect(snaplab(['cp', 'a:/nope', work])).toMatchObject({
      code: 2,
      err: expect.stringMatching(/COPY_FAILED\]: cp: \/nope: No such file or directory/),
    });
    writeFileSync(join(work, 'one'), '1');
    expect(snaplab(['cp', join(work, 'one'), 'a:/missing/'])).toMatchObject({
      code: 2,
      err: expect.stringMatching(/\/missing\/: not a directory/),
    });
    // a receiver that fails at once while the sender still has megabytes to write: an error, not a hang
    spawnSync('dd', ['if=/dev/zero', `of=${join(work, 'eight')}`, 'bs=1M', 'count=8', 'status=none']);
    expect(snaplab(['cp', join(work, 'eight'), 'a:/no/such/dir/f'])).toMatchObject({
      code: 2,
      err: expect.stringMatching(/COPY_FAILED\]: cp: \/no\/such\/dir: No such file or directory/),
    });
    // and the other way: the host's side fails at once while the machine still has megabytes to send
    expect(snaplab(['cp', join(work, 'eight'), 'a:/tmp/eight']).code).toBe(0);
    expect(snaplab(['cp', 'a:/tmp/eight', join(work, 'no', 'such', 'f')])).toMatchObject({
      code: 2,
      err: expect.stringMatching(/COPY_FAILED\]: cp: \S+\/no\/such: No such file or directory/),
    });
    expect(snaplab(['cp', 'a:/tmp/eight', 'b:/no/such/f'])).toMatchObject({
      code: 2,
      err: expect.stringMatching(/COPY_FAILED/),
    });
    // within one machine: one exec inside it; the first failure is the one said
    expect(snaplab(['cp', 'a:/tmp/eight', 'a:/tmp/eight-copy']).code).toBe(0);
    expect(snaplab(['exec', 'a', '--', 'cmp', '/tmp/eight', '/tmp/eight-copy']).code).toBe(0);
    expect(snaplab(['cp', 'a:/nope', 'a:/tmp/x'])).toMatchObject({
      code: 2,
      err: expect.stringMatching(/COPY_FAILED\]: cp: \/nope: No such file or directory/),
    });
    // a source machine that cannot send (paused) fails the copy at once; the other side ends too
    expect(snaplab(['pause', 'b']).code).toBe(0);
    expect(snaplab(['cp', 'b:/etc/hostname', 'a:/tmp/'])).toMatchObject({
      code: 2,
      err: expect.stringMatching(/SANDBOX_PAUSED/),
    });
    expect(snaplab(['resume', 'b']).code).toBe(0);
    expect(snaplab(['cp', join(work, 'one'), join(work, 'two')])).toMatchObject({
      code: 2,
      err: expect.stringMatching(/BAD_INPUT[\s\S]*hint:/),
    });
    expect(snaplab(['cp', join(work, 'one'), 'ghost:/tmp'])).toMatchObject({
      code: 2,
      err: expect.stringMatching(/SANDBOX_NOT_FOUND/),
    });
    // a file onto a file: replaced, not written through (a hard link to the old one keeps its contents)
    expect(snaplab(['exec', 'a', '--', 'sh', '-c', 'echo old > /tmp/t && ln /tmp/t /tmp/t2']).code).toBe(0);
    expect(snaplab(['cp', join(work, 'one'), 'a:/tmp/t']).code).toBe(0);
    expect(snaplab(['exec', 'a', '--', 'cat', '/tmp/t', '/tmp/t2']).out).toBe('1old\n');
  });

  it('streams a 200 MiB file both ways with the snaplab process staying small', async () => {
    const big = join(work, 'big');
    spawnSync('dd', ['if=/dev/urandom', `of=${big}`, 'bs=1M', 'count=200', 'status=none']);
    const up = await peakRss(['cp', big, 'a:/tmp/big']);
    expect(up.code, up.err).toBe(0);
    const down = await peakRss(['cp', 'a:/tmp/big', join(work, 'big.back')]);
    expect(down.code, down.err).toBe(0);
    expect(spawnSync('cmp', [big, join(work, 'big.back')]).status).toBe(0);
    // Node alone is ~50 MB resident; holding the file would be 200 MB more
    expect(up.peakKb).toBeLessThan(130 * 1024);
    expect(down.peakKb).toBeLessThan(130 * 1024);
    rmSync(big);
    rmSync(join(work, 'big.back'));
  });
});

// the machine's agent (musl) receives from another machine; the host's build (glibc, fortified)
// receives a machine's archive as host root: both read the same hostile bytes alike
describe.each([
  ['snaplab-agent', agentBinaryPath],
  ['snaplab-agent-host', hostAgentBinaryPath],
])('the receiving side (%s untar) against hostile archives', (name, binary) => {
  /** Builds an archive with Python's tarfile: each member [name, type, target?] ('f' file, 'l' symlink, 'h' hard link, 'd' dir). */
  function archive(members: [string, string, string?][]): Buffer {
    const py = `
import io, sys, tarfile, json
buf = io.BytesIO()
t = tarfile.open(fileobj=buf, mode='w', format=tarfile.PAX_FORMAT)
for name, kind, target in json.loads(sys.argv[1]):
    i = tarfile.TarInfo(name)
    if kind == 'f':
        data = b'pwned'; i.size = len(data); t.addfile(i, io.BytesIO(data)); continue
    i.type = {'l': tarfile.SYMTYPE, 'h': tarfile.LNKTYPE, 'd': tarfile.DIRTYPE, 'c': tarfile.CHRTYPE}[kind]
    if kind == 'd': i.mode = 0o755
    if kind == 'c': i.devmajor, i.devminor, i.mode = 8, 0, 0o666
    if target: i.linkname = target
    t.addfile(i)
t.close()
sys.stdout.buffer.write(buf.getvalue())`;
    return spawnSync('/usr/bin/python3', ['-c', py, JSON.stringify(members.map(([n, k, t]) => [n, k, t ?? null]))])
      .stdout;
  }

  it('never writes outside DEST: through a symlink, .., absolute names, hard links out; a setuid file and a device node out of a machine are refused', () => {
    const root = join(work, name, 'hostile');
    const outside = join(work, name, 'outside');
    mkdirSync(outside, { recursive: true });
    writeFileSync(join(outside, 'sentinel'), 'intact');
    const untar = (members: [string, string, string?][], flags: string[] = []) => {
      rmSync(root, { recursive: true, force: true });
      mkdirSync(root);
      return spawnSync(binary(), ['untar', ...flags, '--plain', root], {
        input: archive(members),
        encoding: 'utf8',
      });
    };
    const cases: [string, [string, string, string?][]][] = [
      [
        'a symlink, then a file through it',
        [
          ['a', 'l', outside],
          ['a/sentinel', 'f'],
        ],
      ],
      [
        'a symlink to /, then a hard link through it',
        [
          ['r', 'l', '/'],
          ['x', 'h', `r${outside}/sentinel`],
        ],
      ],
      ['..', [['../outside/sentinel', 'f']]],
      [
        '.. in the middle',
        [
          ['d', 'd'],
          ['d/../../outside/sentinel', 'f'],
        ],
      ],
      ['an absolute name', [[`${outside}/sentinel`, 'f']]],
      ['a hard link out', [['x', 'h', '../outside/sentinel']]],
    ];
    for (const [what, members] of cases) {
      const r = untar(members);
      expect(r.status, what).toBe(2);
      expect(r.stderr, what).toMatch(/^snaplab: cp: /);
      expect(readFileSync(join(outside, 'sentinel'), 'utf8'), what).toBe('intact');
    }
    expect(existsSync(join(outside, 'a'))).toBe(false);

    // --expect (what `cp MACHINE:SRC HOST` runs): the archive must begin with what was asked for;
    // a hostile machine's tar cannot put .ssh/authorized_keys into a host home instead
    const asked = join(work, name, 'home');
    mkdirSync(asked, { recursive: true });
    const swap = spawnSync(binary(), ['untar', '--untrusted', '--expect', 'app.log', '--', asked], {
      input: archive([
        ['.ssh', 'd'],
        ['.ssh/authorized_keys', 'f'],
      ]),
      encoding: 'utf8',
    });
    expect(swap.status).toBe(2);
    expect(swap.stderr).toMatch(/begins with \.ssh, not the app\.log that was asked for/);
    expect(existsSync(join(asked, '.ssh'))).toBe(false);
    // out of a machine, a directory the host already has keeps its owner and mode
    mkdirSync(join(asked, 'keep'), { mode: 0o755 });
    const py777 = `
import io, sys, tarfile
buf = io.BytesIO(); t = tarfile.open(fileobj=buf, mode='w')
d = tarfile.TarInfo('keep'); d.type = tarfile.DIRTYPE; d.mode = 0o2777; d.uid = 1234; d.gid = 1234; t.addfile(d)
t.close(); sys.stdout.buffer.write(buf.getvalue())`;
    const keep = spawnSync(binary(), ['untar', '--untrusted', '--expect', 'keep', '--', asked], {
      input: spawnSync('/usr/bin/python3', ['-c', py777]).stdout,
      encoding: 'utf8',
    });
    expect(keep.status, keep.stderr).toBe(0);
    const st = lstatSync(join(asked, 'keep'));
    expect([st.mode & 0o7777, st.uid]).toEqual([0o755, 0]);

    // --untrusted (what `cp MACHINE:SRC HOST` runs): no device node, no setuid bit on the host
    const dev = untar([['disk', 'c']], ['--untrusted']);
    expect(dev.status).toBe(1);
    expect(dev.stderr).toMatch(/device node out of a machine is not made/);
    expect(existsSync(join(root, 'disk'))).toBe(false);
    const py = `
import io, sys, tarfile
buf = io.BytesIO(); t = tarfile.open(fileobj=buf, mode='w')
i = tarfile.TarInfo('sh'); i.size = 2; i.mode = 0o4755; t.addfile(i, io.BytesIO(b'#!'))
t.close(); sys.stdout.buffer.write(buf.getvalue())`;
    rmSync(root, { recursive: true, force: true });
    mkdirSync(root);
    const suid = spawnSync(binary(), ['untar', '--untrusted', '--plain', root], {
      input: spawnSync('/usr/bin/python3', ['-c', py]).stdout,
      encoding: 'utf8',
    });
    expect(suid.status).toBe(0);
    expect(lstatSync(join(root, 'sh')).mode & 0o7777).toBe(0o755);
  });
});
