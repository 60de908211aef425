/**
 * The stage: the tree the stock-host VM boots from, imported as an image. The host tree (Debian 12
 * with systemd, trees.ts) and, on top of it, what a user who installed this checkout would have:
 *
 *   /opt/snaplab/{package.json,dist,native/build,deploy,src/host/tools.json,node_modules}
 *   /usr/local/bin/snaplab -> /opt/snaplab/native/build/snaplab
 *   /usr/local/bin/node                    this host's /usr/bin/node (Node 20, runs on bookworm as is)
 *   /usr/lib/modules/VERSION               every module of the guest kernel, depmod'ed (the qemu
 *                                          driver's own cache keeps only the few its /init loads)
 *   /opt/stock/sysd                        a small Debian tree with systemd, for a system machine inside
 *
 * What the CLI reads at run time (checked in dist/bin): the bundle itself (tools.json is inlined by
 * esbuild), package.json (packageRoot() finds the package by it), native/build/* by path from
 * there, dist/web (serve's dashboard) and the bundle's externals in node_modules (better-sqlite3, a
 * native addon, and etcd3, whose gRPC client reads .proto files beside its code): scripts/bundle.mjs.
 */
import {
  cpSync,
  existsSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  renameSync,
  statSync,
  symlinkSync,
} from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { dirname, isAbsolute, join, relative, sep } from 'node:path';
import { run } from '../../src/host/run.js';
import type { Lab } from '../../src/sdk/lab.js';
import { CACHE_DIR, HOST_SPEC, SYSD_SPEC, treeInto, type Tree } from './trees.js';

export const CHECKOUT = join(import.meta.dirname, '..', '..');
/** Where snaplab is installed in the guest. */
export const GUEST_PREFIX = '/opt/snaplab';
export const GUEST_SYSD_TREE = '/opt/stock/sysd';

export interface Stage {
  dir: string;
  host: Tree;
  sysd: Tree;
  /** milliseconds per step */
  ms: Record<string, number>;
}

const timed = async <T>(ms: Record<string, number>, what: string, f: () => Promise<T>): Promise<T> => {
  const t0 = performance.now();
  try {
    return await f();
  } finally {
    ms[what] = Math.round(performance.now() - t0);
  }
};

/** A path inside `root` that follows the tree's own relative links (bookworm's /lib is usr/lib). */
function inTree(root: string, rel: string): string {
  let at = root;
  for (const part of rel.split('/').filter(Boolean)) {
    const p = join(at, part);
    const st = existsSync(p) ? lstatSync(p) : null;
    if (st?.isSymbolicLink()) {
      const target = readlinkSync(p);
      if (isAbsolute(target)) throw new Error(`${p} is an absolute link (${target}): not followed out of the stage`);
      at = join(at, target);
    } else at = p;
  }
  if (relative(root, at).startsWith('..')) throw new Error(`${rel} leads out of ${root}`);
  return at;
}

/** The packages the CLI bundle leaves external (scripts/bundle.mjs), and everything they depend on. */
export function runtimePackages(checkout = CHECKOUT): string[] {
  const bundle = readFileSync(join(checkout, 'scripts', 'bundle.mjs'), 'utf8');
  const m = /external:\s*\[([^\]]*)\]/.exec(bundle);
  if (!m) throw new Error('scripts/bundle.mjs names no external packages: has the bundle changed?');
  const externals = [...m[1]!.matchAll(/'([^']+)'/g)].map((x) => x[1]!);
  const seen = new Set<string>();
  // node's resolution: node_modules/NAME in the requiring package's directory, then each one above it
  const resolve = (from: string, name: string): string => {
    for (let d = from; ; d = dirname(d)) {
      const p = join(d, 'node_modules', name);
      if (existsSync(join(p, 'package.json'))) return p;
      if (d === checkout || d === dirname(d))
        throw new Error(`${name} (needed by ${relative(checkout, from) || 'snaplab'}) is not installed: run npm ci`);
    }
  };
  const walk = (dir: string): void => {
    if (seen.has(dir)) return;
    seen.add(dir);
    const pj = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as {
      dependencies?: Record<string, string>;
      optionalDependencies?: Record<string, string>;
    };
    for (const n of Object.keys(pj.dependencies ?? {})) walk(resolve(dir, n));
    for (const n of Object.keys(pj.optionalDependencies ?? {})) {
      try {
        walk(resolve(dir, n));
      } catch {
        /* optional: not installed on this platform */
      }
    }
  };
  for (const e of externals) walk(resolve(checkout, e));
  return [...seen].map((p) => relative(checkout, p)).sort();
}

/**
 * Copy the production packages: each package's own files, not its nested node_modules (those are
 * in the list themselves), and of a native addon (binding.gyp) only what it loads: not its C
 * sources or object files (better-sqlite3: 28 MB of them beside a 2 MB .node).
 */
function copyPackages(checkout: string, packages: string[], into: string): void {
  for (const rel of packages) {
    const src = join(checkout, rel);
    const addon = existsSync(join(src, 'binding.gyp'));
    cpSync(src, join(into, rel), {
      recursive: true,
      verbatimSymlinks: true,
      filter: (p) => {
        const r = relative(src, p);
        if (r === '') return true;
        const parts = r.split(sep);
        if (parts.includes('node_modules')) return false;
        if (!addon) return true;
        if (parts[0] === 'deps' || parts[0] === 'src') return false;
        if (parts[0] === 'build')
          return (
            parts.length === 1 ||
            (parts[1] === 'Release' && (parts.length === 2 || (parts.length === 3 && parts[2]!.endsWith('.node'))))
          );
        return true;
      },
    });
  }
}

/** Sources newer than what was built from them (the guest would run an older snaplab than the checkout's). */
export function staleBuild(checkout = CHECKOUT): string[] {
  const newest = (dir: string, ext: RegExp): { file: string; ms: number } => {
    let best = { file: '', ms: 0 };
    for (const d of readdirSync(join(checkout, dir), { withFileTypes: true, recursive: true })) {
      if (!d.isFile() || !ext.test(d.name) || d.name.endsWith('.test.ts')) continue;
      const file = join(d.parentPath, d.name);
      const ms = statSync(file).mtimeMs;
      if (ms > best.ms) best = { file: relative(checkout, file), ms };
    }
    return best;
  };
  const built = (f: string): number => (existsSync(join(checkout, f)) ? statSync(join(checkout, f)).mtimeMs : 0);
  const stale: string[] = [];
  const ts = newest('src', /\.(ts|json)$/);
  if (ts.ms > built('dist/bin/snaplab.js')) stale.push(`${ts.file} is newer than dist/bin/snaplab.js`);
  const c = newest('native', /\.[ch]$/);
  if (
    c.ms >
    Math.min(
      built('native/build/snaplab'),
      built('native/build/snaplab-agent'),
      built('native/build/snaplab-agent-host'),
      built('native/build/snaplab-hostops'),
    )
  )
    stale.push(`${c.file} is newer than native/build`);
  return stale;
}

/** This checkout's runtime under `stage` + GUEST_PREFIX, the node binary and the command's link. */
export async function installRuntime(stage: string, checkout = CHECKOUT): Promise<void> {
  for (const s of staleBuild(checkout))
    console.warn(`stock-host: ${s}: the guest gets the last build (npm run build to test the change)`);
  const prefix = join(stage, GUEST_PREFIX);
  mkdirSync(join(prefix, 'native'), { recursive: true });
  cpSync(join(checkout, 'package.json'), join(prefix, 'package.json'));
  cpSync(join(checkout, 'dist'), join(prefix, 'dist'), { recursive: true, verbatimSymlinks: true });
  cpSync(join(checkout, 'deploy'), join(prefix, 'deploy'), { recursive: true, verbatimSymlinks: true });
  // the programs, not their object files
  cpSync(join(checkout, 'native', 'build'), join(prefix, 'native', 'build'), {
    recursive: true,
    filter: (p) => !p.endsWith('.o'),
  });
  for (const f of ['snaplab', 'snaplab-agent', 'snaplab-agent-host', 'snaplab-hostops', 'snaplab-unpack']) {
    if (!existsSync(join(prefix, 'native', 'build', f)))
      throw new Error(`native/build/${f} is missing: run npm run build`);
  }
  mkdirSync(join(prefix, 'src', 'host'), { recursive: true });
  cpSync(join(checkout, 'src', 'host', 'tools.json'), join(prefix, 'src', 'host', 'tools.json'));
  copyPackages(checkout, runtimePackages(checkout), prefix);
  const bin = inTree(stage, 'usr/local/bin');
  mkdirSync(bin, { recursive: true });
  // /usr/bin/node: Node 20 (NodeSource's build, glibc and libstdc++ only: both in bookworm's minbase)
  const v = await run('/usr/bin/node', ['--version']);
  if (!/^v20\./.test(v.stdout.trim())) throw new Error(`/usr/bin/node is ${v.stdout.trim()}, not Node 20`);
  cpSync('/usr/bin/node', join(bin, 'node'));
  symlinkSync(`${GUEST_PREFIX}/native/build/snaplab`, join(bin, 'snaplab'));
}

/**
 * The guest kernel's package (the exact version name, never a glob), from the cache or
 * `apt-get download` into it. The cache keeps one .deb per kernel version: the candidate apt knows.
 */
async function kernelDeb(version: string, scratch: string): Promise<string> {
  if (!/^[0-9][A-Za-z0-9.+-]*$/.test(version)) throw new Error(`not a kernel version: ${JSON.stringify(version)}`);
  const pkg = `linux-image-${version}`;
  const dir = CACHE_DIR ? join(CACHE_DIR, 'kernel') : scratch;
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const show = await run('apt-cache', ['show', '--no-all-versions', pkg], { allowFail: true });
  const candidate = /^Version: (\S+)$/m.exec(show.stdout)?.[1];
  const debs = (): string[] => readdirSync(dir).filter((f) => f.startsWith(`${pkg}_`) && f.endsWith('.deb'));
  const want = candidate ? `${pkg}_${candidate.replace(/:/g, '%3a')}_amd64.deb` : undefined;
  let have = debs().find((f) => f === want) ?? (want ? undefined : debs()[0]);
  if (!have) {
    for (const f of debs()) await rm(join(dir, f), { force: true }); // an older build of this version
    const r = await run('apt-get', ['-q', '-o', 'APT::Sandbox::User=root', 'download', pkg], {
      cwd: dir,
      allowFail: true,
      timeoutMs: 300_000,
    });
    if (r.code !== 0) throw new Error(`apt-get download ${pkg} failed: ${(r.stderr || r.stdout).trim()}`);
    have = debs()[0];
    if (!have) throw new Error(`apt-get download ${pkg} left no .deb in ${dir}`);
  }
  return join(dir, have);
}

/** Every module of the guest kernel, unpacked under `scratch`; returns its lib/modules/VERSION. */
export async function fetchModules(version: string, scratch: string): Promise<string> {
  const deb = await kernelDeb(version, scratch);
  const x = join(scratch, 'kernel-x');
  await run('dpkg-deb', ['-x', deb, x]);
  const from = join(x, 'lib', 'modules', version);
  if (!existsSync(join(from, 'kernel'))) throw new Error(`${deb} has no lib/modules/${version}/kernel`);
  return from;
}

/** Modules (from fetchModules) into the stage's /lib/modules/VERSION, indexed by depmod, checked for what snaplab loads. */
export async function installModules(stage: string, version: string, from: string): Promise<void> {
  const modules = inTree(stage, 'lib/modules');
  mkdirSync(modules, { recursive: true });
  renameSync(from, join(modules, version));
  await run('depmod', ['-b', stage, version]);
  const dep = readFileSync(join(modules, version, 'modules.dep'), 'utf8')
    .split('\n')
    .map((l) => l.split(':')[0])
    .join('\n');
  const builtin = readFileSync(join(modules, version, 'modules.builtin'), 'utf8');
  for (const m of ['loop', 'btrfs', 'overlay', 'veth', 'bridge', 'tun', 'sch_netem']) {
    const re = new RegExp(`(^|/)${m}\\.ko(\\.[a-z]+)?$`, 'm');
    if (!re.test(dep) && !re.test(builtin)) throw new Error(`the guest kernel ${version} has no module ${m}`);
  }
}

/** Empty apt's package lists (50+ MB that a machine's image does not need; apt-get update refills them). */
async function dropAptLists(tree: string): Promise<void> {
  const lists = join(tree, 'var', 'lib', 'apt', 'lists');
  if (!existsSync(lists)) return;
  for (const f of readdirSync(lists))
    if (f !== 'partial' && f !== 'lock') await rm(join(lists, f), { recursive: true, force: true });
}

/**
 * Assemble the stage in a new directory under the lab's home (the caller removes it once
 * imported; disposeLab removes the home in any case): both trees and the kernel's modules are
 * made at the same time.
 */
export async function assembleStage(lab: Lab, kernelVersion: string): Promise<Stage> {
  const ms: Record<string, number> = {};
  const t0 = performance.now();
  const dir = await mkdtemp(join(lab.home, 'stock-stage-'));
  const scratch = await mkdtemp(join(lab.home, 'stock-scratch-'));
  try {
    const sysdDir = join(scratch, 'sysd');
    mkdirSync(sysdDir);
    // the trees are extracted (or built) while the kernel's package is fetched and unpacked
    // (allSettled: a failure must not remove the directories while the others still write there)
    const settled = await Promise.allSettled([
      timed(ms, 'host tree', () => treeInto(lab, HOST_SPEC, 'stock-host-tree', dir)),
      timed(ms, 'sysd tree', () => treeInto(lab, SYSD_SPEC, 'stock-sysd-tree', sysdDir)),
      timed(ms, 'kernel package', () => fetchModules(kernelVersion, scratch)),
    ] as const);
    const failed = settled.find((r) => r.status === 'rejected');
    if (failed) throw (failed as PromiseRejectedResult).reason;
    const [host, sysd, modules] = settled.map((r) => (r as PromiseFulfilledResult<unknown>).value) as [
      Tree,
      Tree,
      string,
    ];
    await timed(ms, 'modules + depmod', () => installModules(dir, kernelVersion, modules));
    await timed(ms, 'runtime', async () => {
      await dropAptLists(sysdDir);
      mkdirSync(dirname(join(dir, GUEST_SYSD_TREE)), { recursive: true });
      renameSync(sysdDir, join(dir, GUEST_SYSD_TREE));
      await installRuntime(dir);
    });
    ms['stage total'] = Math.round(performance.now() - t0);
    return { dir, host, sysd, ms };
  } catch (e) {
    await rm(dir, { recursive: true, force: true });
    throw e;
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}

/** Bytes under a directory (for the report), as du counts them. */
export async function treeBytes(dir: string): Promise<number> {
  const r = await run('du', ['-s', '-B1', '-x', dir], { allowFail: true });
  return Number(r.stdout.split(/\s/)[0]) || statSync(dir).size;
}
