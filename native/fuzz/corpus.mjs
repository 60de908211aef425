#!/usr/bin/env node
// Writes the seed corpus of the C parsers' harnesses (native/fuzz/corpus/NAME/*): a few valid
// conversations in each harness's input format (the comment at the top of each harness), made
// of the frames docs/agent-protocol.md describes. `node native/fuzz/corpus.mjs` rewrites them;
// the files are checked in, and the fuzzer's runs work on copies (make fuzz-run). Inputs that
// once failed are kept beside them as regress-* (added by hand, never touched here).
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const T = { PING: 1, EXEC: 2, STDIN: 3, SIGNAL: 4, FILE_PUT: 5, FILE_GET: 6, SET_CLOCK: 7, STATUS: 8, RESET: 9, RESIZE: 0x0a, HOLD_OUTPUT: 0x0b, LIST_KEPT: 0x0d, ATTACH: 0x0e, DETACH: 0x0f };
const R = { HELLO: 0x80, PONG: 0x81, STARTED: 0x82, STDOUT: 0x83, STDERR: 0x84, EXIT: 0x85, DATA: 0x86, OK: 0x87, ERROR: 0x88, STDIN_ACK: 0x89 };

const u16 = (v) => { const b = Buffer.alloc(2); b.writeUInt16LE(v); return b; };
const u32 = (v) => { const b = Buffer.alloc(4); b.writeUInt32LE(v >>> 0); return b; };
const i64 = (v) => { const b = Buffer.alloc(8); b.writeBigInt64LE(BigInt(v)); return b; };
const bytes = (x) => (Buffer.isBuffer(x) ? x : Buffer.from(x));

/** One frame: u32 length, u16 type, u16 flags, u32 id, payload. */
function frame(type, id, payload = Buffer.alloc(0)) {
  const p = bytes(payload);
  return Buffer.concat([u32(p.length), u16(type), u16(0), u32(id), p]);
}

/** An EXEC payload: timeout, flags, then tagged fields (argv 1, env 2, cwd 3, user 4, tty 5, tag 6). */
function exec({ argv, env = ['PATH=/usr/bin:/bin'], cwd, user, tty, stdin = false, timeoutMs = 0, keep }) {
  const field = (tag, s) => Buffer.concat([Buffer.from([tag]), u32(Buffer.byteLength(s)), Buffer.from(s)]);
  const fields = [...argv.map((a) => field(1, a)), ...env.map((e) => field(2, e))];
  if (cwd !== undefined) fields.push(field(3, cwd));
  if (user !== undefined) fields.push(field(4, user));
  if (tty !== undefined) fields.push(field(5, tty));
  if (keep !== undefined) fields.push(field(6, keep));
  return Buffer.concat([u32(timeoutMs), u32((stdin ? 1 : 0) | (keep !== undefined ? 2 : 0)), ...fields]);
}

function filePut(mode, path, data) {
  return Buffer.concat([u32(mode), u32(Buffer.byteLength(path)), Buffer.from(path), bytes(data)]);
}

// ---- frame_fuzz: ops 0x00-0x7f write (op + 1) bytes; 0x80-0xff make an exec exit ----

/** Bytes sent to the agent, in chunks of at most 128 (and of `chunk` when given). */
function send(buf, chunk = 128) {
  const out = [];
  for (let i = 0; i < buf.length; i += chunk) {
    const part = buf.subarray(i, i + chunk);
    out.push(Buffer.from([part.length - 1]), part);
  }
  return Buffer.concat(out);
}
/** The k-th exec, newest first, exits with code (0..7), or is killed by SIGNALS[sig] (0 = SIGKILL, 1 = SIGTERM, 2 = SIGINT). */
const exits = (k, code) => Buffer.from([0x80 | (code << 3) | k]);
const killed = (k, sig) => Buffer.from([0xc0 | (sig << 3) | k]);

const agent = {
  'ping': send(Buffer.concat([frame(T.PING, 1, 'hello'), frame(T.PING, 2)])),
  'exec-exit': Buffer.concat([send(frame(T.EXEC, 1, exec({ argv: ['echo', 'hi\n'], cwd: '/' }))), exits(0, 0)]),
  'exec-stdin': Buffer.concat([
    send(frame(T.EXEC, 3, exec({ argv: ['<cat', 'x'], stdin: true }))),
    send(Buffer.concat([frame(T.STDIN, 3, 'abc'), frame(T.STDIN, 3, 'def'.repeat(40)), frame(T.STDIN, 3)]), 7),
    exits(0, 1),
  ]),
  'exec-tty': Buffer.concat([
    send(frame(T.EXEC, 4, exec({ argv: ['sh', '$ '], tty: '80x24', stdin: true }))),
    send(Buffer.concat([frame(T.RESIZE, 4, Buffer.concat([u16(100), u16(40)])), frame(T.STDIN, 4, '\x03'), frame(T.SIGNAL, 4, u32(2))])),
    killed(0, 2),
  ]),
  'exec-user': Buffer.concat([send(frame(T.EXEC, 5, exec({ argv: ['id', 'uid=1000\n'], user: '1000:1000:4,24,27', timeoutMs: 5000 }))), exits(0, 3)]),
  'exec-refused': send(Buffer.concat([
    frame(T.EXEC, 6, exec({ argv: ['?nosuch'] })), // started, then "command not found"
    frame(T.EXEC, 6, exec({ argv: ['true'] })), // EBUSY: 6 still runs
    frame(T.EXEC, 7, exec({ argv: ['!ls'], cwd: '/nonexistent' })), // chdir fails
    frame(T.EXEC, 8, exec({ argv: [] })), // argv is empty
    frame(T.EXEC, 9, exec({ argv: ['x'], tty: '0x24' })), // bad tty
    frame(T.EXEC, 10, exec({ argv: ['x'], user: 'root' })), // bad user
    frame(T.EXEC, 11, Buffer.from([0, 0, 0, 0, 0, 0, 0, 0, 1, 9, 0, 0, 0, 0x61])), // malformed
  ])),
  'files': send(Buffer.concat([
    frame(T.FILE_PUT, 1, filePut(0o644, '/tmp/a/b', 'data\n')),
    frame(T.FILE_GET, 2, '/etc/hostname'),
    frame(T.FILE_GET, 3, '/'),
    frame(T.FILE_GET, 4, '/missing'),
    frame(T.FILE_GET, 5, '/big'),
    frame(T.FILE_PUT, 6, filePut(0, '', '')),
  ])),
  'misc': send(Buffer.concat([
    frame(T.SET_CLOCK, 1, i64(1_700_000_000_000_000_000n)),
    frame(T.SET_CLOCK, 2, i64(-1_500_000_000)),
    frame(T.STATUS, 3),
    frame(T.RESET, 4),
    frame(0x42, 5, 'x'),
    frame(T.SIGNAL, 6, u32(99)),
    frame(T.RESIZE, 7, u32(0)),
    frame(T.HOLD_OUTPUT, 8, u16(1)),
  ])),
  'hold': Buffer.concat([
    send(frame(T.EXEC, 10, exec({ argv: ['<x', 'out'], stdin: true }))),
    send(Buffer.concat([frame(T.HOLD_OUTPUT, 10, u32(1)), frame(T.STDIN, 10, 'in'), frame(T.HOLD_OUTPUT, 10, u32(0))])),
    exits(0, 0),
  ]),
  'kept': Buffer.concat([
    send(Buffer.concat([
      frame(T.EXEC, 12, exec({ argv: ['<cat', 'x'], stdin: true, keep: '{"id":"k"}' })),
      frame(T.EXEC, 13, exec({ argv: ['true'], keep: 'x'.repeat(4097) })), // a tag over 4096
      frame(T.LIST_KEPT, 14),
      frame(T.ATTACH, 15, u32(1)), // no kept exec has that pid
      frame(T.ATTACH, 16, u16(1)), // short
      frame(T.STDIN, 12, 'in'),
    ])),
    exits(0, 0),
    // one kept at the host's EOF: it outlives the connection, until its command exits
    send(Buffer.concat([frame(T.LIST_KEPT, 17), frame(T.EXEC, 18, exec({ argv: ['<cat', 'y'], stdin: true, keep: 't' }))])),
  ]),
  // kept past a RESET (its session's end), then taken on again by its pid (the harness's first)
  'kept-reset': Buffer.concat([
    send(Buffer.concat([
      frame(T.EXEC, 20, exec({ argv: ['<cat', 'z'], stdin: true, keep: '{"id":"r"}' })),
      frame(T.RESET, 21),
      frame(T.LIST_KEPT, 22),
      frame(T.ATTACH, 23, u32(1 << 23)),
      frame(T.STDIN, 23, 'again'),
      frame(T.ATTACH, 24, u32(1 << 23)), // held now: EBUSY
      frame(T.DETACH, 23), // let go again (1.6), its connection staying
      frame(T.DETACH, 26), // no exec has that id: ESRCH
      frame(T.ATTACH, 25, u32(1 << 23)), // free again: taken on
    ])),
    exits(0, 0),
  ]),
  'oversize': send(Buffer.concat([Buffer.concat([u32(0x04000001), u16(T.PING), u16(0), u32(9)]), Buffer.from('the payload that is skipped')])),
};

// ---- relay_fuzz: ops of two bytes, OP N: client OP%8 (0-3) or the agent (4-6) sends N+1 bytes; 7: client N%4 goes ----

function from(who, buf) {
  const out = [];
  for (let i = 0; i < buf.length; i += 256) {
    const part = buf.subarray(i, i + 256);
    out.push(Buffer.from([who, part.length - 1]), part);
  }
  return Buffer.concat(out);
}
const AGENT = 4;
const gone = (client) => Buffer.from([7, client]);
const exitPayload = (code) => Buffer.concat([u32(code), u32(0), u32(0), u32(0), Buffer.alloc(32)]);
const hello = Buffer.concat([u16(1), u16(6), u32(1), Buffer.from('0.1.0')]);

// relay ids are handed out from 1, in the order the relay forwards requests
const relay = {
  'ping': Buffer.concat([from(0, frame(T.PING, 7, 'x')), from(AGENT, frame(R.PONG, 1, 'x'))]),
  'exec': Buffer.concat([
    from(0, frame(T.EXEC, 1, exec({ argv: ['cat'], stdin: true }))),
    from(AGENT, frame(R.STARTED, 1, u32(42))),
    from(0, Buffer.concat([frame(T.STDIN, 1, 'abc'), frame(T.STDIN, 1), frame(T.RESIZE, 1, u32(0x00280050))])),
    from(AGENT, Buffer.concat([frame(R.STDIN_ACK, 1, u32(3)), frame(R.STDOUT, 1, 'abc'), frame(R.EXIT, 1, exitPayload(0))])),
  ]),
  'two-clients': Buffer.concat([
    from(0, frame(T.EXEC, 1, exec({ argv: ['sleep', '9'] }))),
    from(1, frame(T.EXEC, 1, exec({ argv: ['sleep', '9'] }))),
    from(1, frame(T.EXEC, 1, exec({ argv: ['true'] }))), // EBUSY
    from(AGENT, Buffer.concat([frame(R.STARTED, 1, u32(10)), frame(R.STARTED, 2, u32(11))])),
    from(0, frame(T.SIGNAL, 1, u32(15))),
    gone(1), // its exec is killed
    from(AGENT, Buffer.concat([frame(R.EXIT, 1, exitPayload(143)), frame(R.EXIT, 2, exitPayload(137))])),
  ]),
  'reset': Buffer.concat([
    from(2, Buffer.concat([frame(T.EXEC, 5, exec({ argv: ['x'] })), frame(T.RESET, 6)])),
    from(3, frame(T.STATUS, 1)),
    from(AGENT, frame(R.HELLO, 0, hello)), // a new session: in-flight requests fail
    from(AGENT, frame(R.DATA, 2, 'processes 0\n')), // dropped until the resync HELLO
    from(AGENT, frame(R.HELLO, 3, hello)),
    from(3, frame(T.PING, 2)),
    from(AGENT, frame(R.PONG, 4)),
  ]),
  // a kept exec let go when its client leaves (DETACH), taken on by another (ATTACH), let go in so many words
  'kept': Buffer.concat([
    from(0, frame(T.EXEC, 1, exec({ argv: ['cat'], stdin: true, keep: 'k' }))),
    from(AGENT, frame(R.STARTED, 1, u32(42))),
    gone(0),
    from(1, frame(T.ATTACH, 4, u32(42))),
    from(AGENT, Buffer.concat([frame(R.STARTED, 2, Buffer.concat([u32(42), u32(4), Buffer.alloc(8)])), frame(R.STDOUT, 2, 'late')])),
    from(1, Buffer.concat([frame(T.STDIN, 4, 'x'), frame(T.DETACH, 4), frame(T.DETACH, 5)])),
    from(1, frame(T.EXEC, 6, exec({ argv: ['true'] }))),
    from(AGENT, frame(R.STARTED, 3, u32(43))),
    from(1, frame(T.DETACH, 6)), // not kept: EINVAL
    from(AGENT, frame(R.EXIT, 3, exitPayload(0))),
  ]),
  'errors': Buffer.concat([
    from(0, frame(T.EXEC, 3, exec({ argv: ['x'], cwd: '/no' }))),
    from(AGENT, frame(R.ERROR, 1, Buffer.concat([u32(2), Buffer.from('chdir /no: No such file or directory')]))),
    from(0, Buffer.concat([u32(0x04000001), u16(T.PING), u16(0), u32(4), Buffer.from('skipped')])), // oversized
    from(1, frame(T.FILE_GET, 9, '/etc/hostname')),
    from(AGENT, frame(R.DATA, 2, 'host\n')),
  ]),
};

// ---- hostops_fuzz: the helper's requests, u32 length, u32 id, NUL-separated strings ----

function request(id, ...args) {
  const p = Buffer.from(args.map((a) => `${a}\0`).join(''));
  return Buffer.concat([u32(p.length), u32(id), p]);
}

const hostops = {
  'ping': request(1, 'ping'),
  'btrfs': Buffer.concat([request(1, 'btrfs-snapshot', '/pool/a', '/pool/b', '1'), request(2, 'btrfs-limit', '/pool/b', '4294967296'), request(3, 'btrfs-delete', '/pool/b')]),
  'mount': Buffer.concat([request(4, 'mount', 'overlay', '/m', 'overlay', '0', 'lowerdir=/a,upperdir=/b,workdir=/c,userxattr'), request(5, 'umount', '/m', '2')]),
  'launch': request(6, 'launch', '/log', '10000', '/run/s.sock', '-', '-', '2', '/cg/a/cgroup.procs', '/cg/b/cgroup.procs', 'bwrap', '--as-pid-1', '--', '/agent', 'serve'),
  'launch-userns': request(7, 'launch', '/log', '10000', '/run/s.sock', '/run/netns/n', '100000:65536', '/root', '/agent', '1', '/cg/cgroup.procs', 'bwrap', '--'),
  'launch-overlay': request(8, 'launch', '/log', '10000', '/run/s.sock', '-', '100000:65536:suid', 'overlay', '2', '/l1', '/l2', '/up', '/work', '/agent', '0', 'bwrap'),
  'misc': Buffer.concat([request(9, 'tcp-check', '/run/netns/n', '10.0.0.2', '22', '500'), request(10, 'qmp-getfd', '/q.sock', 'mig', '/f', 'w'), request(11, 'idmap-check', '/d', '100000')]),
};

// ---- daemon_fuzz: answers of `snaplab serve`, as the command reads them until the daemon closes ----

const view = { id: '2d50db566457', name: 'box', state: 'running', reason: null, image: 'busybox', storage: 'btrfs', driver: 'namespaces', labels: { q: '"x\\y é😀\t' }, metadata: {}, owner: 'local', timeoutS: 0, onTimeout: 'kill', expiresAt: null, createdAt: '2026-12-02T01:10:25.180Z', limits: { memoryBytes: 1073741824, pids: 1024 }, origin: null, pid: 17005, userns: { uidBase: 2114221312, size: 65536 }, init: 'agent' };
function answer(status, body, { chunked = false } = {}) {
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  const head = `HTTP/1.1 ${status} X\r\ncontent-type: application/json; charset=utf-8\r\n`;
  if (!chunked) return Buffer.from(`${head}content-length: ${Buffer.byteLength(text)}\r\nConnection: close\r\n\r\n${text}`);
  const half = Math.floor(text.length / 2);
  const chunk = (t) => `${Buffer.byteLength(t).toString(16)}\r\n${t}\r\n`;
  return Buffer.from(`${head}Transfer-Encoding: chunked\r\n\r\n${chunk(text.slice(0, half))}${chunk(text.slice(half))}0\r\n\r\n`);
}

const daemon = {
  'created': answer(201, view),
  'list-chunked': answer(200, [view, { ...view, id: 'aa', name: 'b2', reason: 'exited 1', expiresAt: '2026-12-02T02:00:00.000Z' }], { chunked: true }),
  'list-empty': answer(200, []),
  'error': answer(409, { code: 'SANDBOX_EXISTS', message: 'a sandbox named "box" already exists', hint: 'pick another --name', operationId: 'op-67a6366011' }),
  'error-escapes': answer(404, '{"code":"X","message":"\\ud83d\\ude00 \\u00e9 \\ud800 \\n","hint":null}'),
  'not-json': answer(502, 'Bad Gateway'),
  'deleted': Buffer.from('HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n'),
};

// ---- tar_fuzz: a flags byte (bit 0 checksums made right, bit 1 cp's options, bits 2-4 the read size), then an archive ----

/** A 512-byte header: ustar (POSIX, with a prefix) or GNU's magic, its checksum right. */
function header(name, { type = '0', size = 0, mode = 0o644, uid = 0, gid = 0, mtime = 1700000000, link = '', prefix = '', gnu = false, major = 0, minor = 0 } = {}) {
  const h = Buffer.alloc(512);
  const octal = (at, width, v) => h.write(`${v.toString(8).padStart(width - 1, '0')}\0`, at, 'latin1');
  h.write(name, 0, 100, 'utf8');
  octal(100, 8, mode);
  octal(108, 8, uid);
  octal(116, 8, gid);
  octal(124, 12, size);
  octal(136, 12, mtime);
  h.write(type, 156, 'latin1');
  h.write(link, 157, 100, 'utf8');
  h.write(gnu ? 'ustar  \0' : 'ustar\x0000', 257, 'latin1');
  octal(329, 8, major);
  octal(337, 8, minor);
  h.write(prefix, 345, 155, 'utf8');
  h.fill(' ', 148, 156);
  let sum = 0;
  for (const c of h) sum += c;
  h.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 'latin1');
  return h;
}
const pad = (b) => Buffer.concat([b, Buffer.alloc((512 - (b.length % 512)) % 512)]);
/** A member: its header and its data, padded. */
const member = (name, data = '', opts = {}) => Buffer.concat([header(name, { ...opts, size: Buffer.byteLength(data) }), pad(Buffer.from(data))]);
/** A pax header ('x', or 'g') of records `key=value`, each with its length. */
function paxHeader(records, type = 'x') {
  const body = Buffer.concat(Object.entries(records).map(([k, v]) => {
    const kv = Buffer.from(` ${k}=${v}\n`);
    let n = kv.length + 1;
    while (String(n).length + kv.length !== n) n++;
    return Buffer.concat([Buffer.from(String(n)), kv]);
  }));
  return member('PaxHeader', body, { type });
}
const end = Buffer.alloc(1024);
const seed = (flags, ...parts) => Buffer.concat([Buffer.from([flags]), ...parts]);

const tarSeeds = {
  'layer': seed(0x1c, member('etc/', '', { type: '5', mode: 0o755 }), member('etc/hostname', 'box\n'), member('bin/sh', '#!', { mode: 0o4755, uid: 1000, gid: 1000 }), member('bin/ash', '', { type: '1', link: 'bin/sh' }), member('lib', '', { type: '2', link: '/usr/lib' }), member('etc/.wh.motd'), member('var/.wh..wh..opq'), end),
  'pax': seed(0x01, paxHeader({ path: `deep/${'d'.repeat(120)}/file`, size: '3', uid: '70000', gid: '70000', mtime: '-1.5', 'SCHILY.xattr.user.x': 'v', 'SCHILY.xattr.security.capability': 'c' }), member('short', 'abc'), paxHeader({ linkpath: `t/${'l'.repeat(110)}` }), member('s', '', { type: '2', link: 'x' }), end),
  'pax-cp': seed(0x1f, paxHeader({ uid: '5', gid: '6', mtime: '1600000000.25', comment: 'all' }, 'g'), member('./', '', { type: '5' }), member('./a', 'data'.repeat(200)), paxHeader({ path: './b', size: '0' }), member('b'), end),
  'gnu-long': seed(0x15, member('././@LongLink', `${'n'.repeat(300)}\0`, { type: 'L', gnu: true }), member('x', 'hi', { gnu: true }), member('././@LongLink', `${'k'.repeat(200)}\0`, { type: 'K', gnu: true }), member('y', '', { type: '2', gnu: true }), end),
  'prefix-dev': seed(0x03, member('name', 'z', { prefix: 'some/prefix' }), member('dev/null', '', { type: '3', major: 1, minor: 3 }), member('fifo', '', { type: '6' }), member('old-dir/', '', { type: '0' }), member('label', '', { type: 'V' }), end),
  'one-end-block': seed(0x03, member('f', 'x'), Buffer.alloc(512)),
  'no-end': seed(0x09, member('f', 'x'.repeat(700))),
  'big-data': seed(0x17, member('big', 'b'.repeat(5000)), member('small', 's'), end),
  'big-data-layer': seed(0x19, member('big', 'c'.repeat(3000)), member('d/', '', { type: '5' }), end),
  'trailer': seed(0x1f, member('f', 'y'), end, Buffer.alloc(9000, 0x41)),
};

const root = join(import.meta.dirname, 'corpus');
for (const [name, seeds] of Object.entries({ frame: agent, relay, hostops, daemon, tar: tarSeeds })) {
  mkdirSync(join(root, name), { recursive: true });
  for (const [seed, buf] of Object.entries(seeds)) writeFileSync(join(root, name, seed), buf);
}
