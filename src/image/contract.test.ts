import { existsSync, lstatSync, readdirSync, readFileSync, readlinkSync, writeFileSync } from 'node:fs';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { dockerSave, ociLayout, tar } from '../../test/image-archives.js';
import { isSnaplabError, type ErrorCode } from '../errors.js';
import { readMounts } from '../storage/mounts.js';
import { archiveSource, busyboxSource, debianSource, IMAGE_SOURCES } from './registry.js';
import { SKELETON_DIRS } from './skeleton.js';
import { type ImagePlan, type ImageSource, type Provenance, produceImage } from './source.js';

/**
 * One suite for every image source (as storage/contract.test.ts is for every backend and
 * drivers/contract.test.ts for every driver): each is probed, planned and produced through the
 * ImageSource contract alone, through `produceImage` as the lab calls it. The archive source runs
 * once per archive format. The Debian run is a minimal build (variant `extract`, no packages:
 * mmdebstrap fetches the archive's indices from the host's apt sources and installs nothing, ~3 s
 * here, up to ~20 s on a loaded host); its failure case uses a file:// mirror with no archive in
 * it, its abort case a mirror on loopback where nothing listens (no network beyond the host).
 */
interface Run {
  name: string;
  source: ImageSource<never>;
  /** an input that produces an image */
  good: (top: string) => Promise<unknown>;
  /** refused by `plan`: nothing is made */
  bad: (top: string) => Promise<unknown>;
  badCode: ErrorCode;
  /** planned, then failing while it produces */
  failing: (top: string) => Promise<unknown>;
  failCode: ErrorCode;
  /** an input whose produce reports progress for a while (the abort case aborts at the first report) */
  slow?: (top: string) => Promise<unknown>;
  kind: Provenance['kind'];
  /** the image's own init, as its tree says */
  init?: 'systemd';
  /** something only this source's tree has */
  has: (root: string) => void;
  ms: number;
}

/** A layer with a file, and /sbin/init a link to systemd (the fact `produceImage` reads). */
const LAYER = tar([
  { name: 'etc/', type: 'dir' },
  { name: 'etc/os-release', data: 'ID=contract\n' },
  { name: 'sbin/', type: 'dir' },
  { name: 'sbin/init', type: 'symlink', link: '../lib/systemd/systemd' },
]);
const OTHER = tar([{ name: 'other.txt', data: 'not this layer\n' }]);

const archiveRun = (
  name: string,
  kind: Provenance['kind'],
  write: (at: string, bad: boolean) => void,
  failCode: ErrorCode = 'IMAGE_DIGEST_MISMATCH',
): Run => {
  let made = 0;
  const archive = async (top: string, bad: boolean): Promise<{ path: string }> => {
    const at = join(top, `archive-${kind}-${++made}`);
    write(at, bad);
    return { path: at };
  };
  return {
    name,
    source: archiveSource as ImageSource<never>,
    good: (top) => archive(top, false),
    bad: async (top) => ({ path: join(top, 'no-such-archive.tar') }),
    badCode: 'BAD_INPUT',
    failing: (top) => archive(top, true),
    failCode,
    kind,
    init: 'systemd',
    has: (root) => expect(readFileSync(join(root, 'etc/os-release'), 'utf8')).toBe('ID=contract\n'),
    ms: 30_000,
  };
};

/** a mirror with no archive in it: apt finds no Release file and mmdebstrap fails in ~3 s, with no network */
const NO_MIRROR = 'file:///nonexistent/debian';
/** nothing listens there: mmdebstrap retries for ~9 s unless interrupted (loopback only) */
const LOOPBACK_MIRROR = 'http://127.0.0.1:9/debian';
/** from an abort to produce's rejection: an interrupted mmdebstrap ends in ~50 ms here */
const ABORT_MS = 5_000;

const RUNS: Run[] = [
  {
    name: 'busybox',
    source: busyboxSource as ImageSource<never>,
    good: async () => ({}),
    bad: async () => ({ binary: '/usr/bin/env' }), // dynamically linked
    badCode: 'IMAGE_NOT_FOUND',
    failing: async (top) => {
      // static (not an ELF at all), but no busybox: it lists no applets
      await writeFile(join(top, 'not-busybox'), '#!/bin/sh\nexit 3\n');
      await chmod(join(top, 'not-busybox'), 0o755);
      return { binary: join(top, 'not-busybox') };
    },
    failCode: 'IMAGE_NOT_FOUND',
    kind: 'builtin',
    has: (root) => expect(readlinkSync(join(root, 'bin/sh'))).toBe('busybox'),
    ms: 30_000,
  },
  {
    name: 'debian',
    source: debianSource as ImageSource<never>,
    good: async (top) => ({ spec: { suite: 'bookworm', variant: 'extract', packages: [] }, logDir: top }),
    bad: async (top) => ({ spec: { suite: 'bookworm; rm', variant: 'minbase', packages: [] }, logDir: top }),
    badCode: 'BAD_INPUT',
    failing: async (top) => ({
      spec: { suite: 'bookworm', variant: 'extract', packages: [], mirror: NO_MIRROR },
      logDir: top,
    }),
    failCode: 'IMAGE_BUILD_FAILED',
    slow: async (top) => ({
      spec: { suite: 'bookworm', variant: 'extract', packages: [], mirror: LOOPBACK_MIRROR },
      logDir: top,
    }),
    kind: 'debian',
    has: (root) => {
      expect(readFileSync(join(root, 'etc/hostname'), 'utf8')).toBe('contract\n');
      expect(readdirSync(join(root, 'var/lib/apt/lists')).some((f) => f.endsWith('_Packages'))).toBe(true);
    },
    ms: 120_000,
  },
  archiveRun('archive (OCI layout)', 'oci', (at, bad) =>
    ociLayout(at, { layers: [LAYER], ...(bad ? { diffIdsOf: [OTHER] } : {}) }),
  ),
  archiveRun('archive (docker save)', 'docker-archive', (at, bad) =>
    writeFileSync(at, dockerSave({ layers: [LAYER], legacy: false, ...(bad ? { diffIdsOf: [OTHER] } : {}) })),
  ),
  archiveRun(
    'archive (rootfs tar)',
    'rootfs',
    (at, bad) =>
      // a rootfs has no digests: a truncated one is what it can get wrong
      writeFileSync(at, bad ? LAYER.subarray(0, 700) : LAYER),
    'BAD_IMAGE',
  ),
];

/** Processes whose command line names `dir` (mmdebstrap, apt, the unpack helper, cp): none may outlive a produce. */
function processesIn(dir: string): string[] {
  const found: string[] = [];
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    let cmd = '';
    try {
      cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ');
    } catch {
      continue; // gone meanwhile
    }
    if (cmd.includes(dir)) found.push(`${pid}: ${cmd}`);
  }
  return found;
}

const mountsIn = async (dir: string): Promise<string[]> =>
  (await readMounts()).filter((m) => m.target === dir || m.target.startsWith(`${dir}/`)).map((m) => m.target);

/** Nothing of a produce that failed or was aborted is left: no tree, no process, no mount. */
async function expectNothingLeft(dir: string): Promise<void> {
  expect(existsSync(dir)).toBe(false);
  expect(processesIn(dir)).toEqual([]);
  expect(await mountsIn(dir)).toEqual([]);
}

function sourceContract(r: Run): void {
  let top: string;
  let n = 0;
  const dir = (): string => join(top, `image-${++n}`);
  const plan = (input: unknown): Promise<ImagePlan> => r.source.plan(input as never);

  beforeAll(async () => {
    top = await mkdtemp(join(tmpdir(), 'snaplab-test-source-'));
  });
  afterAll(async () => {
    if (top) await rm(top, { recursive: true, force: true });
  });

  it('probes: available here, with a reason (and a fix when not)', async () => {
    const a = await r.source.probe();
    expect(a.reason).not.toBe('');
    if (!a.ok) expect(a.fix).toBeTruthy();
    expect(a).toMatchObject({ ok: true });
    expect(r.source.feature).toBeTruthy();
  });

  it(
    'produces a tree with the skeleton, and records provenance and the facts of the tree',
    async () => {
      const p = await plan(await r.good(top));
      const at = dir();
      const progress: string[] = [];
      const got = await produceImage(p, at, { name: 'contract', onProgress: (s) => progress.push(s) });
      const root = join(at, 'rootfs');
      for (const d of SKELETON_DIRS) expect(lstatSync(join(root, d)).isDirectory(), d).toBe(true);
      expect(lstatSync(join(root, 'tmp')).mode & 0o7777).toBe(0o1777);
      expect(readFileSync(join(root, 'etc/passwd'), 'utf8')).toMatch(/^root:x:0:0:/m);
      expect(existsSync(join(at, 'scratch'))).toBe(false);
      r.has(root);
      expect(p.source).not.toBe('');
      expect(got.provenance).toMatchObject({ kind: r.kind, source: expect.any(String), notes: expect.any(Array) });
      expect(got.provenance.init).toBe(r.init);
      if (p.buildKey) expect(got.provenance.build?.key).toBe(p.buildKey);
      expect(progress.length).toBeGreaterThan(0);
      expect(processesIn(at)).toEqual([]);
      expect(await mountsIn(at)).toEqual([]);
    },
    r.ms,
  );

  it('refuses bad input in plan, with a code and a hint, before anything is made', async () => {
    const e = await plan(await r.bad(top)).then(
      () => undefined,
      (err: unknown) => err,
    );
    expect(isSnaplabError(e, r.badCode), String(e)).toBe(true);
    expect((e as { hint?: string }).hint).toBeTruthy();
  });

  it(
    'fails with a code and a hint on input it cannot produce, leaving nothing',
    async () => {
      const p = await plan(await r.failing(top));
      const at = dir();
      const e = await produceImage(p, at, { name: 'contract' }).then(
        () => undefined,
        (err: unknown) => err,
      );
      expect(isSnaplabError(e, r.failCode), String(e)).toBe(true);
      expect((e as { hint?: string }).hint).toBeTruthy();
      await expectNothingLeft(at);
    },
    r.ms,
  );

  it(
    'stops at an abort with its reason, leaving nothing (the abort comes at its first progress report)',
    async () => {
      const p = await plan(await (r.slow ?? r.good)(top));
      const at = dir();
      const ac = new AbortController();
      const reason = new Error('contract: aborted');
      let abortedAt = 0;
      const abort = (): void => {
        abortedAt ||= performance.now();
        ac.abort(reason);
      };
      const e = await produceImage(p, at, { name: 'contract', signal: ac.signal, onProgress: abort }).then(
        () => undefined,
        (err: unknown) => err,
      );
      // a source that ignored the signal would finish (produceImage does not check it after produce)
      expect(e).toBe(reason);
      expect(performance.now() - abortedAt).toBeLessThan(ABORT_MS);
      await expectNothingLeft(at);
    },
    r.ms,
  );

  it('makes nothing when the signal is already aborted', async () => {
    const p = await plan(await r.good(top));
    const at = dir();
    const reason = new Error('contract: aborted before');
    await expect(produceImage(p, at, { name: 'contract', signal: AbortSignal.abort(reason) })).rejects.toBe(reason);
    expect(existsSync(at)).toBe(false);
  });
}

describe('image source contract', () => {
  it('runs every source the registry lists', () => {
    expect(new Set(RUNS.map((r) => r.source))).toEqual(new Set(IMAGE_SOURCES));
  });
  for (const r of RUNS) describe(r.name, () => sourceContract(r));
});
