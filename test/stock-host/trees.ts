/**
 * Debian trees for the stock-host VM, built with the test's own lab (`lab.buildImage`, mmdebstrap
 * from Debian's archive through the host's apt sources) and kept across runs as a tar under
 * CACHE_DIR/trees, keyed by the lab's own build key (suite, variant, packages and the apt sources
 * the build uses) and rebuilt once a week (Debian's point releases and security updates move on).
 *
 * Measured here: mmdebstrap of the host tree took 29 s; extracting its cached tar (300 MB,
 * uncompressed) takes ~1-2 s. A cache entry is written under a temporary name and renamed into
 * place, so one that exists is whole; one that fails to extract is removed and built again.
 * SNAPLAB_TEST_CACHE=DIR moves the cache, SNAPLAB_TEST_CACHE=off turns it off.
 */
import { existsSync, mkdirSync, readdirSync, statSync } from 'node:fs';
import { rename, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { buildKey, checkSpec, hostSources, sourcesFor, type DebianSpec } from '../../src/image/debian.js';
import { run } from '../../src/host/run.js';
import type { Lab } from '../../src/sdk/lab.js';

export const CACHE_DIR =
  process.env.SNAPLAB_TEST_CACHE === 'off' ? null : process.env.SNAPLAB_TEST_CACHE || '/var/tmp/snaplab-test-cache';
const MAX_AGE_MS = 7 * 24 * 3600 * 1000;

/**
 * The stock host: what a user's Debian 12 has that snaplab needs. Already in minbase (Priority
 * required or Essential, listed anyway to say so): e2fsprogs, util-linux, mount. Not in minbase:
 * systemd, systemd-sysv, udev, kmod, iproute2, procps (important), dbus (standard), bubblewrap,
 * busybox-static, btrfs-progs, curl (optional). libstdc++6, which /usr/bin/node needs, comes with apt.
 */
/**
 * The suite of both trees: bookworm (Debian 12) in the suite; SNAPLAB_STOCK_SUITE=trixie runs the
 * same file on Debian 13's userland (systemd 257), an optional second run (the guest kernel is the
 * qemu driver's, Debian 12's cloud kernel, either way).
 */
export const STOCK_SUITE = process.env.SNAPLAB_STOCK_SUITE || 'bookworm';

export const HOST_SPEC: DebianSpec = {
  suite: STOCK_SUITE,
  variant: 'minbase',
  packages: [
    'systemd',
    'systemd-sysv',
    'dbus',
    'udev',
    'kmod',
    'bubblewrap',
    'busybox-static',
    'btrfs-progs',
    'iproute2',
    'e2fsprogs',
    'procps',
    'curl',
    'nftables',
    'util-linux',
    'mount',
  ],
};

/** The system machine's image inside the guest: the least that boots systemd (as test/system.test.ts's, without sudo). */
export const SYSD_SPEC: DebianSpec = {
  suite: STOCK_SUITE,
  variant: 'minbase',
  packages: ['systemd', 'systemd-sysv', 'dbus'],
};

const TAR_FLAGS = ['--numeric-owner', '--xattrs', '--xattrs-include=*', '--acls'];

async function key(spec: DebianSpec): Promise<string> {
  const s = checkSpec(spec);
  return buildKey(s, sourcesFor(s, s.mirror ? [] : await hostSources()));
}

export interface Tree {
  /** the tar came from the cache (no mmdebstrap) */
  cached: boolean;
  ms: number;
}

/**
 * Fill the empty directory `dest` with the tree `spec` describes: from the cache when it has
 * it, else built by `lab.buildImage` under `name` (the image is removed once copied, and its tar
 * stored in the cache).
 */
export async function treeInto(lab: Lab, spec: DebianSpec, name: string, dest: string): Promise<Tree> {
  const t0 = performance.now();
  const k = await key(spec);
  const tar = CACHE_DIR ? join(CACHE_DIR, 'trees', `${k.slice(0, 32)}.tar`) : null;
  if (tar && existsSync(tar)) {
    if (Date.now() - statSync(tar).mtimeMs < MAX_AGE_MS) {
      const r = await run('tar', ['-C', dest, ...TAR_FLAGS, '-xpf', tar], { allowFail: true });
      if (r.code === 0) return { cached: true, ms: performance.now() - t0 };
      console.warn(`stock-host: the cached tree ${tar} did not extract (${r.stderr.trim()}): building it again`);
      // what was extracted goes: dest must be empty for the build's copy
      for (const e of readdirSync(dest)) await rm(join(dest, e), { recursive: true, force: true });
    }
    await rm(tar, { force: true });
  }
  const built = await lab.buildImage(spec, { name });
  const tree = built.image.path;
  const copy = run('cp', ['-a', '--reflink=auto', '--', `${tree}/.`, dest]);
  const cached = (async () => {
    if (!tar) return;
    mkdirSync(join(CACHE_DIR!, 'trees'), { recursive: true, mode: 0o700 });
    const tmp = `${tar}.tmp-${process.pid}-${Date.now()}`;
    try {
      await run('tar', ['-C', tree, ...TAR_FLAGS, '-cf', tmp, '.']);
      await rename(tmp, tar);
    } finally {
      await rm(tmp, { force: true });
    }
  })();
  // both awaited, whichever fails: no copy left running into a directory being removed
  const [c, t] = await Promise.allSettled([copy, cached]);
  if (c.status === 'rejected') throw c.reason;
  if (t.status === 'rejected') throw t.reason;
  await lab.removeImage(name);
  return { cached: false, ms: performance.now() - t0 };
}
