/**
 * The dashboard as a person uses it: a real `snaplab serve`, Debian's headless Chromium (driven
 * by playwright-core), real machines. Sign in with a key on TCP; create a machine from the page
 * and see others appear and go live; a terminal; a snapshot taken and restored; a waterfall that
 * matches `snaplab trace --json`; a scenario drawn with a block; a pool's takes; a bench results
 * directory drawn; `snaplab ui` without a key. Screenshots of every page go to test-results/.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { connect } from 'node:net';
import type { Page, Request } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { launch, type TestBrowser } from './browser.js';
import { cli, sleep, startDaemon, until, type TestDaemon } from './daemon-helpers.js';
import { SNAPLAB } from './cli-command.js';

let home: string;
let d: TestDaemon;
let admin: string;
let b: TestBrowser;
let page: Page;

/**
 * A parsed JSON answer of the daemon. Each test reads the fields it checks by name, and its
 * expect() fails when one is not there, so a declared shape per route would add nothing.
 */
// biome-ignore lint/suspicious/noExplicitAny: see above
type Json = any;

/** The API over the Unix socket (curl), as JSON. */
function api(method: string, path: string, json?: unknown): { status: number; body: Json } {
  const args = [
    '-s',
    '-w',
    '\n%{http_code}',
    '-X',
    method,
    '--max-time',
    '120',
    '--unix-socket',
    d.socket,
    `http://snaplab${path}`,
  ];
  if (json !== undefined) args.push('-H', 'content-type: application/json', '--data-binary', JSON.stringify(json));
  const r = spawnSync('curl', args, { encoding: 'utf8' });
  const at = r.stdout.lastIndexOf('\n');
  const text = r.stdout.slice(0, at);
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    /* text */
  }
  return { status: Number(r.stdout.slice(at + 1)), body };
}

const exec = (box: string, cmd: string): string => {
  const r = api('POST', `/sandboxes/${box}/exec`, { argv: ['sh', '-c', cmd] });
  expect(r.status).toBe(200);
  return r.body.stdout as string;
};

/** The uplink of machines with egress: a namespace of the test's, never the host's network. */
const UPLINK = `sltest-dash-${process.pid}`;
const savedUplink = process.env.SNAPLAB_UPLINK_NETNS;

beforeAll(async () => {
  spawnSync('ip', ['netns', 'add', UPLINK]);
  process.env.SNAPLAB_UPLINK_NETNS = UPLINK;
  home = mkdtempSync(join(tmpdir(), 'snaplab-test-dashboard-'));
  admin = cli(home, ['key', 'create', 'admin', '--scope', 'read,exec,admin']).out.trim();
  d = await startDaemon(home, ['--default-timeout', '0']);
  b = await launch();
  // signed in already (the sign-in itself is tested on a page of its own)
  page = await b.page();
  // (page code as strings: this file is type checked without the DOM's types)
  await page.addInitScript(`sessionStorage.setItem('snaplab.key', ${JSON.stringify(admin)})`);
}, 120_000);

afterAll(async () => {
  await b?.close();
  api('DELETE', '/scenarios/lab');
  api('DELETE', '/pools/jobs');
  await d?.stop();
  cli(home, ['rm', '--all']);
  cli(home, ['snapshot', 'rm', 'snap1']);
  cli(home, ['image', 'rm', '--force', 'busybox']);
  cli(home, ['gc']);
  rmSync(home, { recursive: true, force: true });
  if (savedUplink === undefined) delete process.env.SNAPLAB_UPLINK_NETNS;
  else process.env.SNAPLAB_UPLINK_NETNS = savedUplink;
  spawnSync('ip', ['netns', 'del', UPLINK]);
}, 120_000);

describe('the dashboard', () => {
  it('is served at / (public, with a content security policy), its first load under 300 KB of gzipped JavaScript; the API behind it still needs a key', () => {
    const r = spawnSync('curl', ['-s', '-D', '-', `${d.url}/`], { encoding: 'utf8' });
    expect(r.stdout).toMatch(/^HTTP\/1\.1 200/);
    expect(r.stdout).toMatch(/content-security-policy: default-src 'self'/i);
    expect(r.stdout).toMatch(/frame-ancestors 'none'/);
    expect(
      spawnSync('curl', ['-s', '-o', '/dev/null', '-w', '%{http_code}', `${d.url}/sandboxes`], { encoding: 'utf8' })
        .stdout,
    ).toBe('401');
    // what the page loads first: the scripts index.html names (xterm is a chunk loaded with the terminal)
    const web = join(__dirname, '..', 'dist', 'web');
    const html = readFileSync(join(web, 'index.html'), 'utf8');
    const scripts = [...html.matchAll(/(?:src|href)="\/(assets\/[^"]+\.js)"/g)].map((m) => m[1]!);
    expect(scripts.length).toBeGreaterThan(0);
    const gz = scripts.reduce((n, s) => n + gzipSync(readFileSync(join(web, s))).length, 0);
    expect(gz).toBeLessThan(300 * 1024);
    const all = readdirSync(join(web, 'assets')).filter((f) => f.endsWith('.js'));
    expect(all.length).toBeGreaterThan(scripts.length); // the terminal is not in the first load
  });

  it('asks for a key once on TCP, then lists machines live: one created from the page, one by the CLI appears and goes without a reload', async () => {
    const page = await b.page();
    // a link that carries a real key does not sign the visitor in (only the local forward's token does)
    await page.goto(`${d.url}/#key=${admin}`);
    await page.getByLabel('API key').waitFor();
    expect(page.url()).not.toContain(admin);
    await page.goto(`${d.url}/`);
    await page.getByLabel('API key').fill('snaplab_wrong');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByText('error[UNAUTHORIZED]').waitFor();
    await page.getByLabel('API key').fill(admin);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { level: 1, name: 'Machines' }).waitFor();

    await page.getByLabel('name', { exact: true }).fill('web1');
    await page.getByRole('button', { name: 'Create' }).click();
    await page.locator('tr[data-machine="web1"][data-state="running"]').waitFor();

    // made and removed by another process: the page hears of both from the event stream
    expect(cli(home, ['create', '--image', 'busybox', '--name', 'cli1']).code).toBe(0);
    await page.locator('tr[data-machine="cli1"]').waitFor({ timeout: 15_000 });
    expect(cli(home, ['pause', 'cli1']).code).toBe(0);
    await page.locator('tr[data-machine="cli1"][data-state="paused"]').waitFor({ timeout: 15_000 });
    expect(cli(home, ['rm', 'cli1']).code).toBe(0);
    await page.locator('tr[data-machine="cli1"]').waitFor({ state: 'detached', timeout: 15_000 });
    // CPU and memory now, from the machine's cgroup
    await until('memory shown', async () =>
      /\d (KiB|MiB)/.test((await page.locator('tr[data-machine="web1"] td').nth(9).textContent()) ?? ''),
    );
    await b.shot(page, 'machines');

    // filter, then bulk destroy of what is shown
    expect(cli(home, ['create', '--image', 'busybox', '--name', 'tmp-a']).code).toBe(0);
    expect(cli(home, ['create', '--image', 'busybox', '--name', 'tmp-b']).code).toBe(0);
    await page.locator('tr[data-machine="tmp-b"]').waitFor({ timeout: 15_000 });
    await page.getByLabel('filter').fill('tmp-');
    await until('filtered', async () => (await page.locator('tbody tr[data-machine]').count()) === 2);
    await page.getByLabel('select all shown').check();
    await page.getByRole('button', { name: /Destroy selected \(2\)/ }).click();
    await until(
      'destroyed',
      () => !api('GET', '/sandboxes').body.some((s: { name: string }) => s.name.startsWith('tmp-')),
    );
    await page.locator('tr[data-machine="tmp-a"]').waitFor({ state: 'detached' });
    await page.getByLabel('filter').fill('');
    expect(await page.locator('tr[data-machine="web1"]').count()).toBe(1);
    await page.context().close();
  });

  it('pages the machine list (?per=2): a page at a time, Next and Previous, live on the page it shows, a removal from page 2', async () => {
    const names = ['pg-1', 'pg-2', 'pg-3'];
    for (const n of names) expect(cli(home, ['create', '--image', 'busybox', '--name', n]).code).toBe(0);
    // oldest first, as GET /sandboxes pages them: web1 pg-1 | pg-2 pg-3
    const order = (api('GET', '/sandboxes').body as { name: string }[]).map((s) => s.name);
    expect(order).toEqual(['web1', ...names]);
    const rows = () => page.locator('tbody tr[data-machine]').evaluateAll((trs) => trs.map((t) => t.dataset.machine));
    // the usage it polls is its page's (at 10 000 the poll of every machine took the daemon down)
    const asked: string[] = [];
    const onRequest = (r: Request): void => {
      const u = new URL(r.url());
      if (u.pathname === '/usage') asked.push(u.searchParams.get('id') ?? '(every machine)');
    };
    page.on('request', onRequest);
    await page.goto(`${d.url}/?per=2#/machines`);
    await until('page 1', async () => JSON.stringify(await rows()) === JSON.stringify(['web1', 'pg-1']));
    expect(await page.getByTestId('page').textContent()).toBe('page 1');
    expect(await page.getByRole('button', { name: 'Previous' }).isDisabled()).toBe(true);
    await page.getByRole('button', { name: 'Next' }).click();
    await until('page 2', async () => JSON.stringify(await rows()) === JSON.stringify(['pg-2', 'pg-3']));
    const page2 = ['pg-2', 'pg-3'].map((n) => api('GET', `/sandboxes/${n}`).body.id as string).sort();
    await until('usage asked for page 2', () => asked.at(-1)?.split(',').sort().join() === page2.join());
    page.off('request', onRequest);
    expect(asked).not.toContain('(every machine)');
    // an event for a machine on this page changes its row; one for another page adds nothing here
    expect(cli(home, ['pause', 'pg-2']).code).toBe(0);
    await page.locator('tr[data-machine="pg-2"][data-state="paused"]').waitFor({ timeout: 15_000 });
    expect(cli(home, ['pause', 'pg-1']).code).toBe(0);
    await until('pg-1 paused', () => api('GET', '/sandboxes/pg-1').body.state === 'paused');
    // removed from the page: selected and destroyed
    await page.getByLabel('select pg-3').check();
    await page.getByRole('button', { name: /Destroy selected \(1\)/ }).click();
    await page.locator('tr[data-machine="pg-3"]').waitFor({ state: 'detached', timeout: 15_000 });
    // a machine made now sorts last: it joins this page, which has room again
    expect(cli(home, ['create', '--image', 'busybox', '--name', 'pg-4']).code).toBe(0);
    await until('pg-4 on page 2', async () => JSON.stringify(await rows()) === JSON.stringify(['pg-2', 'pg-4']));
    await b.shot(page, 'machines-paged');
    await page.getByRole('button', { name: 'Previous' }).click();
    await until('page 1 again', async () => JSON.stringify(await rows()) === JSON.stringify(['web1', 'pg-1']));
    expect(await page.locator('tr[data-machine="pg-1"]').getAttribute('data-state')).toBe('paused');
    for (const n of ['pg-1', 'pg-2', 'pg-4']) expect(cli(home, ['rm', n]).code).toBe(0);
  });

  it('a terminal: `echo hi` answers hi, and the terminal follows the window when it is resized', async () => {
    const id = api('GET', '/sandboxes/web1').body.id as string;
    await page.goto(`${d.url}/#/machines/${id}/terminal`);
    await page.getByTestId('terminal-status').getByText('connected').waitFor();
    const screen = page.locator('.xterm-rows');
    await page.locator('.xterm').click();
    await page.keyboard.type('echo hi\n');
    await until('hi on the screen', async () =>
      (await screen.locator('div').allTextContents()).some((l) => l.trim() === 'hi'),
    );
    await page.keyboard.type('stty size\n');
    const size = async (): Promise<string[]> =>
      (await screen.locator('div').allTextContents()).map((l) => l.trim()).filter((l) => /^\d+ \d+$/.test(l));
    const before = await until('stty size', async () => (await size())[0]);
    await b.shot(page, 'terminal');
    await page.setViewportSize({ width: 900, height: 600 });
    await sleep(500);
    await page.keyboard.type('clear; stty size\n');
    const after = await until('a new size', async () => (await size()).find((s) => s !== before));
    expect(after).not.toBe(before);
    await page.setViewportSize({ width: 1280, height: 800 });
    // the shell ends with the page: none is left in the machine (nor a process in the daemon)
    const shells = (): number =>
      exec(id, 'ps -o args')
        .split('\n')
        .filter((l) => l.trim() === '/bin/sh -l').length;
    expect(shells()).toBe(1);
    await page.goto(`${d.url}/#/machines/${id}/overview`);
    await until('the shell gone', () => shells() === 0);
  });

  it('CPU now: a machine spinning a core shows it in the list', async () => {
    const id = api('GET', '/sandboxes/web1').body.id as string;
    const spin = api('POST', `/sandboxes/${id}/processes`, { argv: ['sh', '-c', 'while :; do :; done'], tag: 'spin' });
    expect(spin.status).toBe(201);
    await page.goto(`${d.url}/#/machines`);
    const cpu = page.locator('tr[data-machine="web1"] td').nth(8);
    await until('CPU above 30 %', async () => parseFloat((await cpu.textContent()) ?? '') > 30);
    expect(api('DELETE', `/sandboxes/${id}/processes/${spin.body.id}`).status).toBeLessThan(300);
    await until('CPU back under 10 %', async () => parseFloat((await cpu.textContent()) ?? '') < 10);
  });

  it("a machine's egress: its address, lists and counters; none for one without", async () => {
    const made = api('POST', '/sandboxes', {
      name: 'out1',
      egress: { allow: ['203.0.113.0/24'], deny: ['203.0.113.9'] },
    });
    expect(made.status).toBe(201);
    // a refused connection counts (the router's rules are outside the machine)
    exec(made.body.id, 'nc -w 1 192.168.1.1 80 </dev/null; true');
    await page.goto(`${d.url}/#/machines/${made.body.id}`);
    const dl = page.locator('dl.egress');
    await dl.getByText(made.body.egress.address).waitFor();
    await dl.getByText('203.0.113.0/24').waitFor();
    await dl.getByText('203.0.113.9').waitFor();
    await until('the refusal counted', async () => /[1-9]\d* refused/.test((await dl.textContent()) ?? ''));
    await b.shot(page, 'machine-egress');
    const web1 = api('GET', '/sandboxes/web1').body.id as string;
    await page.goto(`${d.url}/#/machines/${web1}`);
    await page.locator('dl.egress').getByText('none (loopback only)').waitFor();
    expect(api('DELETE', `/sandboxes/${made.body.id}`).status).toBeLessThan(300);
  });

  it('a snapshot taken from the page and restored as a new machine holds what was written', async () => {
    const id = api('GET', '/sandboxes/web1').body.id as string;
    exec(id, 'echo kept > /root/marker');
    await page.goto(`${d.url}/#/machines/${id}/snapshots`);
    await page.getByLabel('name', { exact: true }).fill('snap1');
    await page.getByRole('button', { name: 'Take snapshot' }).click();
    await page.locator('tr[data-snapshot="snap1"]').waitFor();
    await b.shot(page, 'snapshots');
    await page.getByRole('button', { name: 'restore snap1' }).click();
    await until('the new machine', () => page.url().match(/#\/machines\/([0-9a-f]{6,})$/) && !page.url().endsWith(id));
    const restored = page.url().split('/').pop()!;
    expect(restored).not.toBe(id);
    expect(exec(restored, 'cat /root/marker')).toBe('kept\n');
    await page.getByRole('heading', { name: /running/ }).waitFor();
  });

  it('a machine stopped and started from its page: shown stopped (not dead) in the list, running again with its files', async () => {
    expect(cli(home, ['create', '--image', 'busybox', '--name', 'halt1']).code).toBe(0);
    const id = api('GET', '/sandboxes/halt1').body.id as string;
    exec(id, 'echo kept > /root/marker');
    await page.goto(`${d.url}/#/machines/${id}`);
    await page.getByRole('button', { name: 'Stop' }).click();
    await page.getByRole('heading', { name: /stopped/ }).waitFor();
    expect(await page.getByRole('button', { name: 'Pause' }).count()).toBe(0);
    // its last pid is not shown as if it still ran
    expect(await page.locator('dt:text-is("host pid") + dd').textContent()).toBe('—');
    await b.shot(page, 'machine-stopped');
    await page.goto(`${d.url}/#/machines`);
    await page.locator('tr[data-machine="halt1"][data-state="stopped"]').waitFor();
    await page.goto(`${d.url}/#/machines/${id}`);
    await page.getByRole('button', { name: 'Start' }).click();
    await page.getByRole('heading', { name: /running/ }).waitFor();
    expect(exec(id, 'cat /root/marker')).toBe('kept\n');
    expect(cli(home, ['rm', 'halt1']).code).toBe(0);
  });

  it("a machine's files: browse, upload from the page, download what is there, remove", async () => {
    const id = api('GET', '/sandboxes/web1').body.id as string;
    exec(id, 'mkdir -p /root/sub && printf "from the machine\\n" > /root/sub/out.txt');
    await page.goto(`${d.url}/#/machines/${id}/files`);
    await page.locator('tr[data-file="sub"]').getByRole('button', { name: 'sub/' }).click();
    await page.locator('tr[data-file="out.txt"]').waitFor();
    const [download] = await Promise.all([
      page.waitForEvent('download'),
      page.getByRole('button', { name: 'download out.txt' }).click(),
    ]);
    const saved = join(home, 'downloaded.txt');
    await download.saveAs(saved);
    expect(readFileSync(saved, 'utf8')).toBe('from the machine\n');
    await page
      .getByLabel('upload here')
      .setInputFiles({ name: 'up.bin', mimeType: 'application/octet-stream', buffer: Buffer.from('uploaded\n') });
    await page.locator('tr[data-file="up.bin"]').waitFor();
    expect(exec(id, 'cat /root/sub/up.bin')).toBe('uploaded\n');
    await b.shot(page, 'files');
    await page.getByRole('button', { name: 'remove up.bin' }).click();
    await page.locator('tr[data-file="up.bin"]').waitFor({ state: 'detached' });
    expect(exec(id, 'test -e /root/sub/up.bin && echo there || echo gone')).toBe('gone\n');
  });

  it("an operation's waterfall has the phases of `snaplab trace --json`; a failed one shows its error and hint", async () => {
    const create = api('GET', '/traces?limit=100').body.find(
      (t: { kind: string; target: string }) => t.kind === 'create' && t.target === 'web1',
    );
    const trace = JSON.parse(cli(home, ['trace', create.id, '--json']).out);
    await page.goto(`${d.url}/#/operations/${create.id}`);
    await page.getByTestId('waterfall').waitFor();
    const rows = await page.locator('[data-phase]').evaluateAll((els) =>
      els.map((e) => ({
        name: e.getAttribute('data-phase'),
        start: Number(e.getAttribute('data-start')),
        end: Number(e.getAttribute('data-end')),
      })),
    );
    expect(rows).toEqual(
      trace.phases.map((p: { name: string; startMs: number; endMs: number }) => ({
        name: p.name,
        start: p.startMs,
        end: p.endMs,
      })),
    );
    expect(Number(await page.locator('[data-unattributed]').getAttribute('data-unattributed'))).toBe(
      trace.unattributedMs,
    );
    // and each bar is where its phase is on the time axis, as long as it lasted
    const bars = await page.locator('[data-phase] .wf-bar').evaluateAll((els) =>
      els.map((e) => {
        const st = (e as unknown as { style: { left: string; width: string } }).style;
        return [parseFloat(st.left), parseFloat(st.width)];
      }),
    );
    const total = Math.max(trace.totalMs, ...trace.phases.map((p: { endMs: number }) => p.endMs));
    trace.phases.forEach((p: { startMs: number; endMs: number }, i: number) => {
      expect(bars[i]![0]).toBeCloseTo((p.startMs / total) * 100, 3);
      expect(bars[i]![1]).toBeCloseTo(((p.endMs - p.startMs) / total) * 100, 3);
    });
    // a key without the admin scope is shown the traces of its own machines only
    const alice = cli(home, ['key', 'create', 'alice', '--scope', 'read,exec']).out.trim();
    const tcp = (path: string, method = 'GET', json?: unknown): Json =>
      JSON.parse(
        spawnSync(
          'curl',
          [
            '-s',
            '-X',
            method,
            '-H',
            `authorization: Bearer ${alice}`,
            ...(json ? ['-H', 'content-type: application/json', '--data-binary', JSON.stringify(json)] : []),
            `${d.url}${path}`,
          ],
          { encoding: 'utf8' },
        ).stdout,
      );
    expect(tcp('/traces?limit=100')).toEqual([]);
    expect(tcp(`/traces/${create.id}`)).toMatchObject({ code: 'OPERATION_NOT_FOUND' });
    const mine = tcp('/sandboxes', 'POST', { image: 'busybox', name: 'alices' });
    expect(tcp('/traces?limit=100').map((t: { target: string }) => t.target)).toEqual(['alices']);
    expect(api('DELETE', `/sandboxes/${mine.id}`).status).toBe(204);
    await b.shot(page, 'operation');

    expect(api('POST', '/sandboxes', { image: 'no-such-image' }).status).toBe(404);
    const failed = api('GET', '/traces?limit=5').body.find((t: { status: string }) => t.status === 'error');
    expect(failed).toMatchObject({ errorCode: 'IMAGE_NOT_FOUND' });
    await page.goto(`${d.url}/#/operations/${failed.id}`);
    await page.getByRole('alert').getByText('error[IMAGE_NOT_FOUND]').waitFor();
    expect(await page.getByRole('alert').textContent()).toContain(`hint: ${failed.errorHint}`);
    // the list filters by status
    await page.getByLabel('status').selectOption('error');
    await until(
      'only failures',
      async () =>
        (await page.locator('tr[data-trace]').count()) >= 1 &&
        (await page.locator('tr[data-trace] .state-ok').count()) === 0,
    );
  });

  it("a pool's counts and its takes per second, from the traces of its runs", async () => {
    const op = api('POST', '/pools', { name: 'jobs', image: 'busybox', size: 2 });
    expect(op.status).toBe(202);
    expect(api('GET', `/operations/${op.body.id}?wait=60`).body.state).toBe('done');
    for (let i = 0; i < 5; i++) expect(api('POST', '/pools/jobs/run', { argv: ['true'] }).status).toBe(200);
    await page.goto(`${d.url}/#/pools`);
    await page.locator('tr[data-pool="jobs"] [data-field="hits"]').getByText('5').waitFor();
    const chart = page.getByTestId('takes-jobs');
    await until('5 takes drawn', async () => {
      const ys = await chart.locator('[data-y]').evaluateAll((els) => els.map((e) => Number(e.getAttribute('data-y'))));
      return ys.reduce((a, y) => a + y, 0) === 5;
    });
    await b.shot(page, 'pools');
  });
});

describe('the dashboard: scenarios and bench results', () => {
  it('a scenario drawn with its machines; a block from the page drops the traffic and shows on the graph; heal; a reset shows its waterfall', async () => {
    const file = join(__dirname, '..', 'examples', 'scenarios', 'tiny-service', 'scenario.yaml');
    const op = api('POST', '/scenarios', { file, name: 'lab' });
    expect(op.status).toBe(202);
    expect(api('GET', `/operations/${op.body.id}?wait=120`).body).toMatchObject({ state: 'done' });
    await page.goto(`${d.url}/#/scenarios/lab`);
    const graph = page.getByTestId('scenario-graph');
    await graph.locator('[data-machine="client"][data-state="running"]').waitFor();
    expect(
      (
        await graph.locator('[data-machine]').evaluateAll((els) => els.map((e) => e.getAttribute('data-machine')))
      ).sort(),
    ).toEqual(['client', 'proxy', 'server', 'store']);
    expect(await graph.locator('[data-network]').count()).toBe(2);

    const wget = (): number =>
      api('POST', '/sandboxes/lab%2Fclient/exec', {
        argv: ['timeout', '5', 'wget', '-q', '-O', '/dev/null', 'http://proxy:8000/cgi-bin/forward/hello'],
      }).body.exitCode;
    expect(wget()).toBe(0);
    await page.getByLabel('Machine A').selectOption('client');
    await page.getByLabel('Machine B').selectOption('proxy');
    await page.getByRole('button', { name: 'Block', exact: true }).click();
    await graph.locator('[data-blocked="client|proxy"]').waitFor();
    expect(api('GET', '/scenarios/lab').body.blocked).toEqual([['client', 'proxy']]);
    expect(wget()).not.toBe(0);
    await b.shot(page, 'scenario');
    await page.getByRole('button', { name: 'Heal', exact: true }).click();
    await graph.locator('[data-blocked]').waitFor({ state: 'detached' });
    expect(wget()).toBe(0);

    await page.getByLabel('Snapshot name').fill('base');
    await page.getByRole('button', { name: 'Snapshot', exact: true }).click();
    await until('the snapshot listed', () => api('GET', '/scenarios/lab').body.snapshots.includes('base'));
    // its standby is raised in the background, and the page says when it is ready
    await until('the standby ready', () => api('GET', '/scenarios/lab').body.standby?.state === 'ready');
    await page
      .getByTestId('scenario-standby')
      .filter({ hasText: /^Standby: ready \(of base, raised in / })
      .waitFor();
    await page.getByLabel('Reset to').locator('option[value="base"]').waitFor({ state: 'attached' });
    await page.getByRole('button', { name: 'Reset', exact: true }).click();
    const reset = await until('the reset traced', () =>
      api('GET', '/traces?limit=20').body.find(
        (t: { kind: string; target: string }) => t.kind === 'reset' && t.target === 'lab',
      ),
    );
    const wf = page
      .getByTestId('scenario-last-trace')
      .locator(`[data-testid="waterfall"][data-total="${reset.totalMs}"]`);
    await wf.waitFor();
    const names = await wf.locator('[data-phase]').evaluateAll((els) => els.map((e) => e.getAttribute('data-phase')));
    expect(names).toEqual(reset.phases.map((p: { name: string }) => p.name));
    await b.shot(page, 'scenario-reset');
  });

  it('a bench results directory drawn: throughput and p99 per rung are the figures of its summary.json', async () => {
    const dir = join(home, 'bench', 'exec-ladder');
    const r = cli(home, [
      'bench',
      '--workload',
      'exec',
      '--ladder',
      '1,2',
      '--reps',
      '2',
      '--duration',
      '0.5',
      '--baselines',
      'none',
      '--results',
      dir,
    ]);
    expect(r.code, r.err).toBe(0);
    const summary = JSON.parse(readFileSync(join(dir, 'summary.json'), 'utf8'));
    await page.goto(`${d.url}/#/bench`);
    await page.getByRole('link', { name: 'exec-ladder' }).click();
    const points = async (id: string): Promise<[number, number][]> =>
      page
        .getByTestId(id)
        .locator('[data-x]')
        .evaluateAll((els) =>
          els.map((e) => [Number(e.getAttribute('data-x')), Number(e.getAttribute('data-y'))] as [number, number]),
        );
    await page.getByTestId('chart-throughput').waitFor();
    expect(await points('chart-throughput')).toEqual(
      summary.rungs.map((g: { concurrency: number; throughput: number }) => [g.concurrency, g.throughput]),
    );
    expect(await points('chart-p99')).toEqual(
      summary.rungs.map((g: { concurrency: number; latencyMs: { p99: number } }) => [g.concurrency, g.latencyMs.p99]),
    );
    await b.shot(page, 'bench');
    // a --compare run: both arms drawn, each rung's verdict as the summary has it
    const cdir = join(home, 'bench', 'exec-compare');
    const c = cli(home, [
      'bench',
      '--workload',
      'exec',
      '--ladder',
      '1',
      '--reps',
      '2',
      '--duration',
      '0.3',
      '--baselines',
      'none',
      '--compare',
      '--storage btrfs',
      '--storage overlay',
      '--results',
      cdir,
    ]);
    expect(c.code, c.err).toBe(0);
    const cs = JSON.parse(readFileSync(join(cdir, 'summary.json'), 'utf8'));
    await page.goto(`${d.url}/#/bench/exec-compare`);
    await page.getByTestId('chart-throughput').waitFor();
    expect(
      await page.locator('[data-verdict]').evaluateAll((els) => els.map((e) => e.getAttribute('data-verdict'))),
    ).toEqual(cs.compare.rungs.map((g: { verdict: string }) => g.verdict));
    expect(await page.getByTestId('chart-throughput').locator('[data-series]').count()).toBeGreaterThanOrEqual(2);
    await b.shot(page, 'bench-compare');
    // a name that is not a results directory, and one that climbs out, are refused with a code
    expect(api('GET', '/bench/nope')).toMatchObject({ status: 404, body: { code: 'RESULTS_NOT_FOUND' } });
    expect(api('GET', '/bench/..%2F..%2Fetc')).toMatchObject({ status: 400, body: { code: 'BAD_INPUT' } });
    // a symbolic link, as the directory or as its summary.json, is not followed
    symlinkSync(dir, join(home, 'bench', 'linked'));
    mkdirSync(join(home, 'bench', 'sneaky'));
    symlinkSync('/etc/passwd', join(home, 'bench', 'sneaky', 'summary.json'));
    expect(api('GET', '/bench/linked')).toMatchObject({ status: 404, body: { code: 'RESULTS_NOT_FOUND' } });
    expect(api('GET', '/bench/sneaky')).toMatchObject({ status: 404, body: { code: 'RESULTS_NOT_FOUND' } });
    expect(api('GET', '/bench').body.map((r: { name: string }) => r.name)).toEqual(['exec-compare', 'exec-ladder']);
  });

  it('works from the keyboard and on a narrow window (nothing wider than the screen)', async () => {
    const p = await b.page({ width: 400, height: 800 });
    await p.goto(`${d.url}/`);
    await p.getByLabel('API key').fill(admin);
    await p.keyboard.press('Enter');
    await p.getByRole('heading', { level: 1, name: 'Machines' }).waitFor();
    for (const where of ['#/machines', '#/operations', '#/pools', '#/scenarios/lab', '#/bench/exec-ladder']) {
      await p.goto(`${d.url}/${where}`);
      await p.locator('main h1').first().waitFor();
      await sleep(300);
      const [scroll, inner] = await p.evaluate<[number, number]>(
        '[document.documentElement.scrollWidth, window.innerWidth]',
      );
      expect(scroll, where).toBeLessThanOrEqual(inner);
    }
    await b.shot(p, 'narrow-bench');
    // Tab reaches the navigation; Enter on a link changes the page
    await p.goto(`${d.url}/#/machines`);
    await p.getByRole('heading', { level: 1, name: 'Machines' }).waitFor();
    let label = '';
    for (let i = 0; i < 8 && label !== 'Operations'; i++) {
      await p.keyboard.press('Tab');
      label = await p.evaluate<string>("document.activeElement?.textContent ?? ''");
    }
    expect(label).toBe('Operations');
    await p.keyboard.press('Enter');
    await p.getByRole('heading', { level: 1, name: 'Operations' }).waitFor();
    await p.context().close();
  });
});

describe('snaplab ui', () => {
  let ui: ChildProcess | undefined;
  afterAll(() => {
    ui?.kill('SIGTERM');
  });

  it('forwards a local port to the Unix socket behind a token: the page needs no key, a caller without the token or from another Host is refused', async () => {
    ui = spawn(SNAPLAB, ['ui', '--json'], {
      env: { ...process.env, SNAPLAB_HOME: home },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const line = await new Promise<string>((resolve, reject) => {
      let out = '';
      ui!.stdout!.on('data', (c: Buffer) => {
        out += c;
        try {
          JSON.parse(out);
          resolve(out);
        } catch {
          /* not whole yet */
        }
      });
      ui!.once('exit', (c) => reject(new Error(`snaplab ui exited ${c}`)));
    });
    const { url, port } = JSON.parse(line) as { url: string; port: number };
    const token = /#key=([\w-]+)$/.exec(url)![1]!; // after #: a browser never sends it
    const code = (args: string[]): string =>
      spawnSync('curl', ['-s', '-o', '/dev/null', '-w', '%{http_code}', ...args], { encoding: 'utf8' }).stdout;
    const base = `http://127.0.0.1:${port}`;
    expect(code([`${base}/sandboxes`])).toBe('401');
    expect(code(['-H', 'authorization: Bearer wrong', `${base}/sandboxes`])).toBe('401');
    expect(code(['-H', `authorization: Bearer ${token}`, `${base}/sandboxes`])).toBe('200');
    expect(code(['-H', `authorization: Bearer ${token}`, '-H', 'host: evil.example', `${base}/sandboxes`])).toBe('403'); // DNS rebinding
    expect(code([`${base}/`])).toBe('200'); // the page itself is public, as on TCP
    expect(code([`${base}/events?token=${token}`, '--max-time', '1'])).toBe('200'); // ?token= where a browser cannot send a header
    // a request target that is not a path (curl will not send one: a raw socket does): refused, and the forward stays up
    const rawStatus = await new Promise<string>((resolve) => {
      const c = connect(port, '127.0.0.1', () =>
        c.write(`GET //[ HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\nconnection: close\r\n\r\n`),
      );
      let got = '';
      c.on('data', (x) => (got += x));
      c.on('close', () => resolve(got.split(' ')[1] ?? ''));
      c.on('error', () => resolve('error'));
    });
    expect(rawStatus).toBe('400');
    expect(code(['-H', `authorization: Bearer ${token}`, `${base}/healthz`])).toBe('200');
    // WebSockets: no token, another Origin
    const ws = (headers: string[]): string =>
      spawnSync(
        'curl',
        [
          '-s',
          '-o',
          '/dev/null',
          '-w',
          '%{http_code}',
          '--max-time',
          '3',
          '-H',
          'connection: upgrade',
          '-H',
          'upgrade: websocket',
          '-H',
          'sec-websocket-version: 13',
          '-H',
          'sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==',
          ...headers,
          `${base}/rpc`,
        ],
        { encoding: 'utf8' },
      ).stdout;
    expect(ws([])).toBe('401');
    expect(ws(['-H', `authorization: Bearer ${token}`, '-H', 'origin: http://evil.example'])).toBe('403');
    expect(ws(['-H', `authorization: Bearer ${token}`, '-H', `origin: http://127.0.0.1:${port}`])).toBe('101');

    const p = await b.page();
    await p.goto(url);
    await p.getByText('local (Unix socket)').waitFor();
    expect(p.url()).not.toContain(token); // taken out of the address bar
    await p.locator('tr[data-machine="web1"]').waitFor();
    // the event stream through the forward
    expect(cli(home, ['create', '--image', 'busybox', '--name', 'via-ui']).code).toBe(0);
    await p.locator('tr[data-machine="via-ui"]').waitFor({ timeout: 15_000 });
    // and a terminal (a WebSocket) through it
    const id = api('GET', '/sandboxes/via-ui').body.id as string;
    await p.goto(`${base}/#/machines/${id}/terminal`);
    await p.getByTestId('terminal-status').getByText('connected').waitFor();
    await p.locator('.xterm').click();
    await p.keyboard.type('echo $((6*7))\n');
    await until('42', async () =>
      (await p.locator('.xterm-rows div').allTextContents()).some((l) => l.trim() === '42'),
    );
    await p.context().close();
    ui.kill('SIGTERM');
    await new Promise((r) => ui!.once('exit', r));
    expect(code([`${base}/`])).toBe('000'); // the forward is gone with it
    ui = undefined;
  });

  it('says so when no daemon answers', () => {
    const empty = mkdtempSync(join(tmpdir(), 'snaplab-test-ui-'));
    mkdirSync(empty, { recursive: true });
    const r = cli(empty, ['ui']);
    rmSync(empty, { recursive: true, force: true });
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/error\[DAEMON_UNREACHABLE\]/);
    expect(r.err).toMatch(/hint: .*snaplab serve/);
  });
});
