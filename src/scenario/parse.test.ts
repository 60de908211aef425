import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { isSnaplabError, type SnaplabError } from '../errors.js';
import { loadScenario, parseScenario } from './parse.js';

const EXAMPLE = resolve(import.meta.dirname, '../../examples/scenarios/tiny-service/scenario.yaml');
const dir = mkdtempSync(join(tmpdir(), 'snaplab-scenario-test-'));
writeFileSync(join(dir, 'app.sh'), '#!/bin/sh\necho hi\n', { mode: 0o750 });
mkdirSync(join(dir, 'sub'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const parse = (lines: string[]) => parseScenario(lines.join('\n'), { file: 's.yaml', dir });

/** Parse `lines`, expect SCENARIO_INVALID at `line`, return the error. */
function fails(lines: string[], line: number, what?: RegExp): SnaplabError {
  let err: unknown;
  try {
    parse(lines);
  } catch (e) {
    err = e;
  }
  if (!isSnaplabError(err, 'SCENARIO_INVALID')) throw new Error(`expected SCENARIO_INVALID, got ${String(err)}`);
  expect(err.message).toMatch(new RegExp(`^s\\.yaml:${line}:\\d+: `));
  if (what) expect(err.message).toMatch(what);
  expect(err.hint).toBeTruthy();
  return err;
}

const NETS = ['networks:', '  front: { subnet: 10.77.1.0/24 }', '  back: { subnet: 10.77.2.0/24 }'];

describe('the shipped example', () => {
  it('parses with every address resolved, the same way twice', async () => {
    const a = await loadScenario(EXAMPLE);
    const b = await loadScenario(EXAMPLE);
    expect(b.spec).toEqual(a.spec);
    expect(a.hash).toMatch(/^[0-9a-f]{64}$/);
    expect(a.hash).toBe(b.hash);
    const { spec } = a;
    expect(spec.name).toBe('tiny-service');
    expect(spec.networks).toEqual([
      { name: 'front', subnet: '10.77.1.0/24', prefix: 24 },
      { name: 'back', subnet: '10.77.2.0/24', prefix: 24 },
    ]);
    expect(spec.machines.map((m) => m.name)).toEqual(['store', 'server', 'proxy', 'client']);
    const addr = Object.fromEntries(
      spec.machines.map((m) => [m.name, Object.fromEntries(m.networks.map((n) => [n.network, n.address]))]),
    );
    expect(addr).toEqual({
      store: { back: '10.77.2.30' },
      server: { back: '10.77.2.10' },
      proxy: { front: '10.77.1.10', back: '10.77.2.11' },
      client: { front: '10.77.1.11' },
    });
    for (const m of spec.machines) {
      expect(m.image).toBe('busybox');
      expect(m.hostname).toBe(m.name);
      for (const s of [...m.provision, ...m.start]) {
        if ('copy' in s) expect(s.copy.from.startsWith(a.dir)).toBe(true);
      }
    }
    const store = spec.machines[0]!;
    expect(store.limits).toEqual({ memoryBytes: 128 * 1024 ** 2, pids: 64 });
    expect(store.provision[0]).toEqual({
      copy: { from: join(a.dir, 'files/kv.cgi'), to: '/srv/store/cgi-bin/kv', mode: 0o755 },
    });
    expect(store.ready).toEqual([
      { kind: 'tcp', port: 8081, timeoutMs: 30_000 },
      { kind: 'log', file: '/var/log/kv.log', line: '/up on :[0-9]+/', timeoutMs: 5000 },
    ]);
    expect(spec.machines[2]!.start).toEqual([
      { run: { argv: ['httpd', '-p', '8000', '-h', '/srv/proxy'], timeoutMs: 60_000, env: {} } },
    ]);
  });

  it('loads a directory as its scenario.yaml', async () => {
    const l = await loadScenario(resolve(EXAMPLE, '..'));
    expect(l.path).toBe(EXAMPLE);
  });

  it('reports a missing file as SCENARIO_INVALID with a hint', async () => {
    const e = await loadScenario(join(dir, 'nope.yaml')).catch((x: unknown) => x);
    expect(isSnaplabError(e, 'SCENARIO_INVALID')).toBe(true);
    expect((e as SnaplabError).message).toMatch(/no such file/);
    expect((e as SnaplabError).hint).toBeTruthy();
  });
});

describe('defaults and shapes', () => {
  it('fills defaults and reads every step and check form', () => {
    const spec = parse([
      'machines:',
      '  box:',
      '    env: { A: 1.10, B: true, C: text, D: 0x1F }',
      '    provision:',
      '      - copy: { from: app.sh, to: /opt/ }',
      '      - copy: { from: ./app.sh, to: /opt/x, mode: 0644 }',
      '      - run: echo hi',
      '      - run: [sleep, 1.50]',
      '        timeout: 2m',
      '      - run: { sh: "echo $X", env: { X: 1 }, timeout: 500ms }',
      '      - run: { argv: [true] }',
      '        env: { Y: 2 }',
      '    ready:',
      '      - command: [true]',
      '      - tcp: 80',
      '      - tcp: "10.0.0.1:81"',
      '      - tcp: { port: 82, host: localhost }',
      '      - file: /etc/../etc/passwd',
      '        timeout: 1.5',
      '      - log: { file: /var/log/x, line: started }',
    ]);
    const m = spec.machines[0]!;
    expect(spec.name).toBeUndefined();
    expect(spec.networks).toEqual([]);
    expect(m).toMatchObject({ name: 'box', image: 'busybox', hostname: 'box', limits: {}, networks: [], start: [] });
    expect(m.env).toEqual({ A: '1.10', B: 'true', C: 'text', D: '0x1F' });
    expect(m.provision).toEqual([
      { copy: { from: join(dir, 'app.sh'), to: '/opt/app.sh', mode: 0o750 } },
      { copy: { from: join(dir, 'app.sh'), to: '/opt/x', mode: 0o644 } },
      { run: { argv: ['sh', '-c', 'echo hi'], timeoutMs: 60_000, env: {} } },
      { run: { argv: ['sleep', '1.50'], timeoutMs: 120_000, env: {} } },
      { run: { argv: ['sh', '-c', 'echo $X'], timeoutMs: 500, env: { X: '1' } } },
      { run: { argv: ['true'], timeoutMs: 60_000, env: { Y: '2' } } },
    ]);
    expect(m.ready).toEqual([
      { kind: 'command', argv: ['true'], timeoutMs: 30_000 },
      { kind: 'tcp', port: 80, timeoutMs: 30_000 },
      { kind: 'tcp', port: 81, host: '10.0.0.1', timeoutMs: 30_000 },
      { kind: 'tcp', port: 82, host: '127.0.0.1', timeoutMs: 30_000 },
      { kind: 'file', path: '/etc/passwd', timeoutMs: 1500 },
      { kind: 'log', file: '/var/log/x', line: 'started', timeoutMs: 30_000 },
    ]);
  });

  it('gives deterministic addresses from .10, skipping fixed ones, in file order', () => {
    const spec = parse([
      ...NETS,
      '  tiny: { subnet: 10.77.3.0/29 }',
      'machines:',
      '  a: { networks: { front: {}, tiny: } }',
      '  b: { networks: { front: 10.77.1.11 } }',
      '  c: { networks: { front: {}, back: {}, tiny: {} } }',
      '  "1": { networks: { front: { address: 10.77.1.10 } } }',
    ]);
    const addr = spec.machines.map((m) => [m.name, m.networks.map((n) => `${n.network}=${n.address}/${n.prefix}`)]);
    expect(addr).toEqual([
      ['a', ['front=10.77.1.12/24', 'tiny=10.77.3.1/29']],
      ['b', ['front=10.77.1.11/24']],
      ['c', ['front=10.77.1.13/24', 'back=10.77.2.10/24', 'tiny=10.77.3.2/29']],
      ['1', ['front=10.77.1.10/24']],
    ]);
  });

  it('takes an empty machine and every way to write a mode', () => {
    const spec = parse([
      'machines:',
      '  a:',
      '  b:',
      '    provision:',
      '      - copy: { from: app.sh, to: /a, mode: "0755" }',
      '      - copy: { from: app.sh, to: /b, mode: 0o600 }',
      '      - copy: { from: app.sh, to: /c, mode: 644 }',
      "      - copy: { from: app.sh, to: /d, mode: '4755' }",
    ]);
    expect(spec.machines[0]).toMatchObject({ name: 'a', image: 'busybox', networks: [], provision: [], ready: [] });
    expect(spec.machines[1]!.provision.map((s) => ('copy' in s ? s.copy.mode : 0))).toEqual([
      0o755, 0o600, 0o644, 0o4755,
    ]);
  });

  it('resolves a tcp check host named after a machine to its address on a shared network', () => {
    const spec = parse([
      ...NETS,
      'machines:',
      '  a: { networks: { back: {} } }',
      '  b:',
      '    networks: { back: {} }',
      '    ready: [ { tcp: "a:80" } ]',
    ]);
    expect(spec.machines[1]!.ready[0]).toEqual({ kind: 'tcp', port: 80, host: '10.77.2.10', timeoutMs: 30_000 });
  });
});

describe('errors name the file, line and column', () => {
  it('YAML syntax', () => {
    fails(['machines:', '  a: { image: busybox', 'x: 1'], 3, /YAML syntax/);
  });

  it('unknown keys, at the key, with a suggestion', () => {
    fails(['machines:', '  a: {}', 'extra: 1'], 3, /unknown key "extra" in the top level/);
    const e = fails(
      ['machines:', '  a:', '    image: busybox', '    memroy: 64M'],
      4,
      /unknown key "memroy" in machine "a"/,
    );
    expect(e.message).toMatch(/^s\.yaml:4:5: /);
    expect(e.hint).toMatch(/did you mean "memory"/);
    fails(
      ['machines:', '  a:', '    provision:', '      - copy: { from: app.sh, to: /x, owner: root }'],
      4,
      /unknown key "owner"/,
    );
    fails(['machines:', '  a:', '    ready:', '      - tcp: 80', '        timout: 5s'], 5, /unknown key "timout"/);
    fails(
      [...NETS, 'machines:', '  a:', '    networks:', '      front: { adress: 10.77.1.5 }'],
      7,
      /unknown key "adress"/,
    );
  });

  it('wrong types', () => {
    fails(['machines:', '  a:', '    pids: many'], 3, /machines\.a\.pids: expected a whole number/);
    fails(['machines:', '  a:', '    provision: echo'], 3, /expected a list/);
    fails(['machines:', '  a:', '    provision:', '      - echo hi'], 4, /expected a step/);
    fails(['machines:', '  a:', '    start:', '      - run: { argv: [a], sh: b }'], 4, /exactly one of argv/);
    fails(['machines:', '  a:', '    ready:', '      - tcp: 80', '        file: /x'], 4, /tcp and file in one item/);
    fails(['networks:', '  front: {}', 'machines: { a: {} }'], 2, /missing "subnet" in network "front"/);
    fails(['name: x'], 1, /missing "machines"/);
    fails([''], 1, /expected a map/);
  });

  it('duplicate machines and networks', () => {
    fails(['machines:', '  a: {}', '  b: {}', '  a: {}'], 4, /duplicate machine "a" \(first at line 2\)/);
    fails([...NETS, '  front: { subnet: 10.77.9.0/24 }', 'machines: { a: {} }'], 4, /duplicate network "front"/);
  });

  it('system machines: init systemd with unit and systemd checks; those checks refused on other machines', () => {
    const spec = parse([
      'machines:',
      '  web:',
      '    init: systemd',
      '    ready:',
      '      - unit: nginx.service',
      '      - systemd: running',
      '        timeout: 5s',
    ]);
    expect(spec.machines[0]).toMatchObject({
      init: 'systemd',
      ready: [
        { kind: 'unit', unit: 'nginx.service', timeoutMs: 30_000 },
        { kind: 'systemd', state: 'running', timeoutMs: 5000 },
      ],
    });
    fails(['machines:', '  web:', '    ready:', '      - unit: nginx.service'], 4, /need a system machine/);
    fails(['machines:', '  web:', '    init: upstart'], 3, /agent or systemd/);
    // ports and Ansible groups
    expect(
      parse(['machines:', '  web:', '    ports: ["8080:80", 9000]', '    groups: [webservers]']).machines[0],
    ).toMatchObject({
      ports: [
        { local: 8080, remote: 80 },
        { local: 9000, remote: 9000 },
      ],
      groups: ['webservers'],
    });
    fails(['machines:', '  web:', '    groups: [all]'], 3, /Ansible's own/);
    fails(['machines:', '  web:', '    groups: [9x]'], 3, /invalid group name/);
    fails(['machines:', '  web:', '    ports: ["80:http"]'], 3, /invalid port/);
    fails(['machines:', '  web:', '    init: systemd', '    ready:', '      - systemd: degraded'], 5, /running/);
  });

  it("a machine's driver: qemu makes it a VM; namespaces is kept as written (up --driver leaves it); anything else is refused", () => {
    const spec = parse(['machines:', '  vm:', '    driver: qemu', '  box:', '    driver: namespaces', '  plain: {}']);
    expect(spec.machines.map((m) => m.driver)).toEqual(['qemu', 'namespaces', undefined]);
    fails(['machines:', '  vm:', '    driver: firecracker'], 3, /namespaces or qemu/);
  });

  it('a machine on a network that is not defined', () => {
    fails(
      [...NETS, 'machines:', '  a:', '    networks:', '      middle: {}'],
      7,
      /network "middle", which is not defined/,
    );
  });

  it('bad subnets', () => {
    fails(['networks:', '  n: { subnet: 10.77.1.0 }', 'machines: { a: {} }'], 2, /invalid subnet/);
    fails(['networks:', '  n: { subnet: 10.77.1.0/31 }', 'machines: { a: {} }'], 2, /prefix \/31/);
    fails(['networks:', '  n: { subnet: 10.0.0.0/7 }', 'machines: { a: {} }'], 2, /prefix \/7/);
    const e = fails(['networks:', '  n: { subnet: 10.77.1.5/24 }', 'machines: { a: {} }'], 2, /host bits set/);
    expect(e.hint).toMatch(/10\.77\.1\.0\/24/);
    fails(['networks:', '  n: 10.77.1.0/24', '  m: 10.77.0.0/16', 'machines: { a: {} }'], 3, /overlaps network "n"/);
  });

  it('bad, duplicate, outside and reserved addresses', () => {
    const m = (addr: string) => [
      ...NETS,
      'machines:',
      '  a: { networks: { front: 10.77.1.20 } }',
      '  b:',
      '    networks:',
      `      front: { address: ${addr} }`,
    ];
    fails(m('10.77.1.256'), 8, /invalid address "10\.77\.1\.256"/);
    fails(m('10.77.1.20/24'), 8, /invalid address/);
    fails(m('10.77.1.20'), 8, /already machine "a"'s/);
    fails(m('10.77.2.20'), 8, /outside network "front" \(10\.77\.1\.0\/24\)/);
    fails(m('10.77.1.0'), 8, /network address/);
    fails(m('10.77.1.255'), 8, /broadcast address/);
  });

  it('a network with no free address left', () => {
    fails(
      [
        'networks: { n: 10.77.1.0/30 }',
        'machines:',
        '  a: { networks: { n: } }',
        '  b: { networks: { n: } }',
        '  c: { networks: { n: } }',
      ],
      5,
      /no free address/,
    );
  });

  it('a copy source that does not exist, at its from value', () => {
    const e = fails(
      ['machines:', '  a:', '    provision:', '      - copy:', '          to: /x', '          from: ./missing.txt'],
      6,
      /does not exist/,
    );
    expect(e.message).toMatch(/^s\.yaml:6:17: /);
    fails(['machines:', '  a:', '    provision:', '      - copy: { from: sub, to: /x }'], 4, /not a regular file/);
    fails(['machines:', '  a:', '    provision:', '      - copy: { from: app.sh, to: x }'], 4, /not an absolute path/);
    fails(
      ['machines:', '  a:', '    provision:', '      - copy: { from: app.sh, to: /x, mode: 0855 }'],
      4,
      /invalid mode/,
    );
  });

  it('an alias with no anchor is a located error, not a crash (found by test/fuzz.test.ts)', () => {
    const e = fails(['networks:', '  front: *a', 'machines:', '  a: {}'], 2, /YAML: .*alias/i);
    expect(e.message).toMatch(/^s\.yaml:2:10: /);
  });

  it('a disk cap: a size, or 0 for none', () => {
    expect(parse(['machines:', '  a:', '    disk: 512M', '  b:', '    disk: 0']).machines.map((m) => m.limits)).toEqual(
      [{ diskBytes: 512 * 1024 ** 2 }, { diskBytes: 0 }],
    );
    fails(['machines:', '  a:', '    disk: plenty'], 3, /invalid disk "plenty"/);
  });

  it('bad sizes, timeouts and ports', () => {
    fails(['machines:', '  a:', '    memory: lots'], 3, /invalid memory "lots"/);
    fails(['machines:', '  a:', '    memory: 128'], 3, /too little/);
    fails(
      ['machines:', '  a:', '    ready:', '      - file: /x', '        timeout: soon'],
      5,
      /invalid timeout "soon"/,
    );
    fails(['machines:', '  a:', '    start:', '      - run: { sh: x, timeout: -1s }'], 4, /invalid timeout/);
    fails(['machines:', '  a:', '    ready:', '      - tcp: 70000'], 4, /invalid port 70000/);
    fails(
      ['machines:', '  a:', '    ready:', '      - log: { file: /x, line: "/a(/" }'],
      4,
      /invalid regular expression/,
    );
  });

  it('bad names', () => {
    fails(['machines:', '  a: {}', '  Web_1: {}'], 3, /invalid machine name "Web_1"/);
    fails(
      ['networks:', '  front-net-with-a-name-much-too-long: 10.77.1.0/24', 'machines: { a: {} }'],
      2,
      /invalid network name/,
    );
    fails(['name: My Lab', 'machines: { a: {} }'], 1, /invalid scenario name/);
    fails(['machines:', '  a:', '    env: { 1X: y }'], 3, /invalid environment variable name "1X"/);
    fails(['machines:', '  a:', '    image: "no/slash"'], 3, /invalid image name/);
    fails(['machines: {}'], 1, /at least one machine/);
  });

  it('a tcp check host on no shared network', () => {
    fails(
      [
        ...NETS,
        'machines:',
        '  a: { networks: { back: {} } }',
        '  b:',
        '    networks: { front: {} }',
        '    ready: [ { tcp: "a:80" } ]',
      ],
      8,
      /shares no network/,
    );
  });
});
