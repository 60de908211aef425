/**
 * Kernel objects a machine takes are charged to the machine, not to host root (docs/security.md
 * "Kernel objects"). The kernel counts inotify instances, nested namespaces and the like per user
 * of each user namespace, and charges a namespace's whole use to its owner in the parent: the
 * launcher makes each machine's namespace as the range's base uid (native/userns.c become_owner)
 * and sets its per-namespace limits (limit_here). A static filler (escapes/fill.c) takes objects
 * until the kernel refuses and holds them while the host and another create are tried.
 */
import { spawnSync } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Lab } from '../src/sdk/lab.js';
import type { Sandbox } from '../src/sdk/sandbox.js';
import { snaplabWithNosuidDev } from './cli-command.js';
import { disposeLab, testLab } from './helpers.js';

let lab: Lab;
let box: Sandbox;
let scratch: string;
let fill: string;

beforeAll(async () => {
  scratch = mkdtempSync(join(tmpdir(), 'snaplab-test-kernel-'));
  chmodSync(scratch, 0o755); // the filler runs as a machine's root too, which host root's 0700 keeps out
  fill = join(scratch, 'fill');
  const built = spawnSync('gcc', ['-O2', '-static', '-o', fill, join(import.meta.dirname, 'escapes', 'fill.c')], {
    encoding: 'utf8',
  });
  if (built.status !== 0) throw new Error(`cannot build the filler: ${built.stderr}`);
  lab = await testLab();
  box = await lab.create({ name: 'greedy' });
  const probe = join(scratch, 'probe');
  const built2 = spawnSync('gcc', ['-O2', '-static', '-o', probe, join(import.meta.dirname, 'escapes', 'probe.c')], {
    encoding: 'utf8',
  });
  if (built2.status !== 0) throw new Error(`cannot build the probe: ${built2.stderr}`);
  await box.putFile('/fill', readFileSync(fill), 0o755);
  await box.putFile('/probe', readFileSync(probe), 0o755);
}, 120_000);

afterAll(async () => {
  await disposeLab(lab);
  rmSync(scratch, { recursive: true, force: true });
});

/** Run the filler on the host (argv before it: how to run it, e.g. nsenter); "COUNT ERRNO". */
const onHost = (...argv: string[]): string => {
  const r = spawnSync(argv[0]!, argv.slice(1), { encoding: 'utf8', input: '', timeout: 60_000 });
  expect(r.status, r.stderr).toBe(0);
  return r.stdout.trim();
};

/** A new sandbox through the CLI, as a user makes one (in a private mount namespace), then gone. */
const anotherCreate = (): void => {
  const env = { ...process.env, SNAPLAB_HOME: lab.home };
  const made = snaplabWithNosuidDev(['create', '--image', 'busybox', '--name', 'bystander'], env);
  expect(made.status, made.stderr).toBe(0);
  expect(snaplabWithNosuidDev(['rm', 'bystander'], env).status).toBe(0);
};

describe('kernel objects are charged to the machine', () => {
  it("a machine's user namespace is owned by its range's base uid, with the documented limits", async () => {
    expect(onHost(fill, 'owner', String(box.info.pid))).toBe(String(box.info.uidBase));
    const r = await box.exec([
      'sh',
      '-c',
      'cd /proc/sys/user && for f in max_user_namespaces max_mnt_namespaces max_net_namespaces max_pid_namespaces max_ipc_namespaces max_inotify_instances max_inotify_watches; do echo $f=$(cat $f); done',
    ]);
    expect(r.stdout.trim().split('\n')).toEqual([
      'max_user_namespaces=256',
      'max_mnt_namespaces=1024',
      'max_net_namespaces=256',
      'max_pid_namespaces=256',
      'max_ipc_namespaces=256',
      'max_inotify_instances=128',
      'max_inotify_watches=65536',
    ]);
    // and the sandbox cannot raise them (no CAP_SYS_RESOURCE, /proc/sys read-only)
    expect((await box.exec(['sh', '-c', 'echo 100000 > /proc/sys/user/max_user_namespaces'])).exitCode).not.toBe(0);
  });

  it('inotify instances exhausted inside a sandbox: host root still gets one, and another create works', async () => {
    const [count, errno] = (await holdInside('inotify', 100_000)).split(' ');
    // the kernel's refusal: the sandbox's count (at most the host's per-user limit, on its base uid)
    expect(errno).toBe('EMFILE');
    expect(Number(count)).toBeGreaterThan(64);
    expect(Number(count)).toBeLessThanOrEqual(128);
    try {
      expect(onHost(fill, 'inotify', '1')).toBe('1 ok'); // host root's own are untouched
      anotherCreate();
    } finally {
      await release();
    }
  });

  it('a sandbox makes no user namespace at all (its seccomp filter), nor keys', async () => {
    expect(await holdInside('userns', 1)).toBe('0 EPERM');
    await release();
    for (const argv of [['keyctl'], ['add_key']]) expect(['EPERM', 'ENOSYS']).toContain(await probe(argv));
  });

  it("nested user namespaces exhausted in a machine's namespace stop at its limit; the host and another create go on", () => {
    // a system machine's root may unshare (its filter lets systemd do so); the same, unfiltered,
    // from the host: the filler joins the sandbox's user namespace as its root
    const [count, errno] = onHost('nsenter', '-t', String(box.info.pid), '-U', fill, 'userns', '1000').split(' ');
    expect([count, errno]).toEqual(['256', 'ENOSPC']);
    expect(spawnSync('unshare', ['-U', 'true']).status).toBe(0);
    anotherCreate();
  });

  it("keyrings are refused by a system machine's filter too, where its root could otherwise add keys", () => {
    const bin = join(scratch, 'system-filter');
    const native = join(import.meta.dirname, '..', 'native');
    const built = spawnSync(
      'gcc',
      [
        '-O2',
        '-I',
        native,
        // the filters as the build compiled them (native/filters.c)
        '-I',
        join(native, 'build'),
        '-o',
        bin,
        join(import.meta.dirname, 'escapes', 'system-filter.c'),
        join(native, 'sandbox.c'),
      ],
      { encoding: 'utf8' },
    );
    expect(built.status, built.stderr).toBe(0);
    // as the root of a machine's namespace, under the filter its PID 1 gets (native/boot.c)
    expect(onHost('nsenter', '-t', String(box.info.pid), '-U', bin).split('\n')).toEqual([
      'keyctl EPERM',
      'add_key EPERM',
    ]);
  });
});

/** Start the filler inside the sandbox in the background, holding what it took; its "COUNT ERRNO". */
async function holdInside(what: string, n: number): Promise<string> {
  const r = await box.exec([
    'sh',
    '-c',
    `rm -f /tmp/held; (sleep 600 | /fill ${what} ${n}) > /tmp/held 2>&1 & while [ ! -s /tmp/held ]; do sleep 0.05; done; cat /tmp/held`,
  ]);
  expect(r.exitCode, r.stderr).toBe(0);
  return r.stdout.trim();
}

/** End the background filler (its stdin's writer goes, it exits and lets go of what it held). */
async function release(): Promise<void> {
  await box.exec(['sh', '-c', 'kill $(pidof sleep) 2>/dev/null; while pidof fill >/dev/null; do sleep 0.05; done']);
}

/** The escape probe's answer to one attempt inside the sandbox. */
async function probe(argv: string[]): Promise<string> {
  const r = await box.exec(['/probe', ...argv]);
  return r.stdout.trim();
}
