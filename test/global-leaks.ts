import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** What the suite must leave behind: nothing of snaplab's in mounts, cgroups, processes or loop devices. */
export function leaks(): string[] {
  const found: string[] = [];
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    if (line.includes('snaplab')) found.push(`mount: ${line.split(' ')[4]}`);
  }
  // (on a host whose PID 1 is systemd, snaplab's cgroups are in its scope: src/host/cgroups/scope.ts)
  for (const root of [
    '/sys/fs/cgroup',
    '/sys/fs/cgroup/snaplab.slice/snaplab.scope',
    ...readdirSync('/sys/fs/cgroup').map((d) => `/sys/fs/cgroup/${d}`),
  ]) {
    const dir = `${root}/snaplab`;
    if (!existsSync(dir)) continue;
    for (const e of readdirSync(dir, { withFileTypes: true }))
      if (e.isDirectory()) found.push(`cgroup: ${dir}/${e.name}`);
  }
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      // a zombie has exited and holds nothing but its pid until its parent reaps it: a system
      // machine's monitor (native/boot.c) is orphaned to the host's init, which reaps on its own
      // schedule (seconds, on this host's process_api)
      const state = readFileSync(`/proc/${pid}/stat`, 'utf8').replace(/^.*\) /s, '')[0];
      if (state !== 'Z' && /\/snaplab\/|\/snaplab\.scope\//.test(readFileSync(`/proc/${pid}/cgroup`, 'utf8')))
        found.push(`process: ${pid}`);
    } catch {
      /* exited */
    }
  }
  if (existsSync('/sys/block')) {
    for (const dev of readdirSync('/sys/block').filter((d) => d.startsWith('loop'))) {
      try {
        const file = readFileSync(`/sys/block/${dev}/loop/backing_file`, 'utf8').trim();
        if (file.includes('snaplab')) found.push(`loop device: /dev/${dev} → ${file}`);
      } catch {
        /* not attached */
      }
    }
  }
  // network namespaces (scenarios', egress's) and forwarding egress turned on in the host's namespace
  if (existsSync('/run/netns'))
    for (const ns of readdirSync('/run/netns').filter((n) => n.startsWith('snaplab-'))) found.push(`netns: ${ns}`);
  if (existsSync('/run/snaplab/egress-forwarding-host')) found.push('forwarding: /run/snaplab/egress-forwarding-host');
  return found;
}

let before: Set<string>;
let packages: string | undefined;

export function setup(): void {
  before = new Set(leaks());
  // one package cache for the run's Debian builds (docs/images.md): each suite's packages are
  // fetched once per run, never kept from an earlier run
  if (!process.env.SNAPLAB_PACKAGE_CACHE) {
    packages = mkdtempSync(join(tmpdir(), 'snaplab-test-packages-'));
    process.env.SNAPLAB_PACKAGE_CACHE = packages;
  }
}

/** Fails the run when the suite left anything it did not find there at the start (test/leak-check.ts names the file). */
export function teardown(): void {
  if (packages) rmSync(packages, { recursive: true, force: true });
  const left = leaks().filter((l) => !before.has(l));
  if (left.length) throw new Error(`the test suite leaked snaplab host objects:\n  ${left.join('\n  ')}`);
}
