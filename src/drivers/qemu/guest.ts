/**
 * The QEMU driver's guest artefacts: the kernel (Debian's cloud kernel, fetched once per home with
 * apt and cached), the initramfs (the image's tree + the agent + the virtio modules + /init) and
 * the kernel command line. See docs/qemu-notes.md for the measurements behind the choices.
 */
import { existsSync, readFileSync } from 'node:fs';
import { chmod, copyFile, mkdir, mkdtemp, readFile, readdir, rename, rm, utimes, writeFile } from 'node:fs/promises';
import { createHash } from 'node:crypto';
import { basename, dirname, join } from 'node:path';
import { SnaplabError } from '../../errors.js';
import { isDynamicElf } from '../../host/elf.js';
import { run, which } from '../../host/run.js';
import { toolsVerdict } from '../../host/tools.js';
import { SANDBOX_CAPABILITIES } from '../namespaces/capabilities.js';
import { gzipConcat, listTree, writeNewc } from './guest-cpio.js';
import { GUEST_AGENT_PATH, INIT_BUSYBOX, initScript } from './guest-init.js';
import { orElse } from '../../cleanup.js';

export { listInitramfs, readInitramfsFile, type CpioEntry } from './guest-cpio.js';
export { GUEST_AGENT_PATH, GUEST_AGENT_RUN_PATH, PORT_NAME, ROOT_DEVICE } from './guest-init.js';

export type Machine = 'pc' | 'microvm';

export interface GuestKernel {
  /** the kernel release, as `uname -r` says it in the guest (e.g. 6.1.0-57-cloud-amd64) */
  version: string;
  /** PVH-bootable ELF if extracted, else the bzImage */
  kernel: string;
  /** .../lib/modules/VERSION */
  modulesDir: string;
}

/** The metapackage whose dependency names the current versioned cloud kernel. */
const KERNEL_METAPACKAGE = 'linux-image-cloud-amd64';
/** Modules the guest needs, by machine; their dependencies are added from modules.dep. */
export const GUEST_MODULES: Record<Machine, readonly string[]> = {
  // ext4 checksums its metadata with crc32c, which it asks the crypto API for (no module dependency)
  pc: ['virtio_pci', 'virtio_console', 'virtio_blk', 'crc32c_generic', 'ext4'],
  microvm: ['virtio_mmio', 'virtio_console', 'virtio_blk', 'crc32c_generic', 'ext4'],
};
/** Modules a VM with network interfaces (a scenario machine) loads too, when /init is told of one. */
export const NET_MODULES: readonly string[] = ['virtio_net'];
const BASE_MODULES = [...new Set(Object.values(GUEST_MODULES).flat())];
/** Every module a fetched kernel keeps. */
const KEPT_MODULES = [...new Set([...BASE_MODULES, ...NET_MODULES])];
/** lz4 legacy-frame magic: where the compressed vmlinux starts inside Debian's vmlinuz. */
const LZ4_LEGACY_MAGIC = Buffer.from([0x02, 0x21, 0x4c, 0x18]);

interface KernelManifest {
  version: string;
  /** file name of the kernel in the version directory: vmlinux (PVH) or vmlinuz (bzImage) */
  kernel: string;
  package: string;
}

const kernelDir = (home: string): string => join(home, 'qemu', 'kernel');

/**
 * A cached kernel, checked to be whole (with the network's modules when `net`); undefined when
 * there is none. Never runs apt.
 */
async function cachedKernel(home: string, net: boolean): Promise<GuestKernel | undefined> {
  try {
    const version = (await readFile(join(kernelDir(home), 'current'), 'utf8')).trim();
    if (!/^[A-Za-z0-9._+-]+$/.test(version)) return undefined;
    const dir = join(kernelDir(home), version);
    const m = JSON.parse(await readFile(join(dir, 'kernel.json'), 'utf8')) as KernelManifest;
    const k: GuestKernel = {
      version: m.version,
      kernel: join(dir, basename(m.kernel)),
      modulesDir: join(dir, 'lib', 'modules', m.version),
    };
    if (!existsSync(k.kernel) || !(await keepsAll(k.modulesDir, net ? KEPT_MODULES : BASE_MODULES))) return undefined;
    return k;
  } catch {
    return undefined;
  }
}

/**
 * Does the cached kernel keep these modules? A cache made before virtio_net (scenario VMs' NICs)
 * lacks it: it still boots every other VM (offline too), and is completed when a VM needs a NIC.
 */
async function keepsAll(modulesDir: string, wanted: readonly string[]): Promise<boolean> {
  try {
    loadOrder(
      parseModulesDep(await readFile(join(modulesDir, 'modules.dep'), 'utf8')),
      await readBuiltin(modulesDir),
      wanted,
      modulesDir,
    );
    return true;
  } catch {
    return false;
  }
}

const inflightKernel = new Map<string, Promise<GuestKernel>>();

/**
 * The guest kernel, cached under `${home}/qemu/kernel/<version>/` (`current` names the version).
 * First use: the exact versioned cloud kernel package from apt, unpacked, depmod'ed, the vmlinux
 * extracted for PVH boot, and everything but the kernel and the needed modules thrown away.
 * Built in a temporary directory and renamed into place: a crash leaves no half kernel.
 */
export async function ensureGuestKernel(
  home: string,
  onProgress?: (s: string) => void,
  opts: { net?: boolean } = {},
): Promise<GuestKernel> {
  const hit = await cachedKernel(home, opts.net === true);
  if (hit) return hit;
  let p = inflightKernel.get(home);
  if (!p) {
    p = fetchKernel(home, onProgress ?? (() => undefined)).finally(() => inflightKernel.delete(home));
    inflightKernel.set(home, p);
  }
  return p;
}

const APT_HINT = 'run `apt-get update`, check the Debian mirror in /etc/apt/sources.list(.d) and the network';

/** `apt-cache depends linux-image-cloud-amd64` → the versioned package; undefined if apt knows none. */
async function lookUpKernelPackage(): Promise<string | undefined> {
  const r = await run('apt-cache', ['depends', KERNEL_METAPACKAGE], { allowFail: true });
  if (r.code !== 0) return undefined;
  const m = /^\s*Depends:\s*<?(linux-image-\S+-cloud-amd64)>?\s*$/m.exec(r.stdout);
  return m?.[1];
}

async function aptUpdate(progress: (s: string) => void, why: string): Promise<void> {
  progress(`${why}: running apt-get update`);
  const r = await run('apt-get', ['update', '-q'], { allowFail: true });
  if (r.code !== 0) {
    throw new SnaplabError(
      'DRIVER_UNAVAILABLE',
      `apt-get update failed: ${(r.stderr || r.stdout).trim().split('\n').slice(-3).join(' ')}`,
      APT_HINT,
    );
  }
}

async function fetchKernel(home: string, progress: (s: string) => void): Promise<GuestKernel> {
  const missing = await toolsVerdict('qemu', 'the VM driver');
  if (missing) throw new SnaplabError('DRIVER_UNAVAILABLE', missing.reason, missing.fix);
  const found = await findKernelPackage(progress);
  await mkdir(kernelDir(home), { recursive: true });
  const tmp = await mkdtemp(join(kernelDir(home), '.tmp-'));
  try {
    const { deb, pkg } = await downloadKernel(tmp, found.pkg, found.updated, progress);
    const { version, kernelFile, out, mods } = await buildKernelTree(tmp, deb, pkg, progress);
    const final = await installKernel(home, out, mods, version);
    await writeFile(join(tmp, 'current'), `${version}\n`);
    await rename(join(tmp, 'current'), join(kernelDir(home), 'current'));
    const k = await cachedKernel(home, true);
    if (!k) throw new SnaplabError('INTERNAL', `the guest kernel was cached in ${final} but does not read back`);
    progress(`guest kernel ${version} ready (${kernelFile === 'vmlinux' ? 'PVH vmlinux' : 'bzImage'})`);
    return k;
  } finally {
    await rm(tmp, { recursive: true, force: true });
  }
}

/** The versioned kernel package, after one apt-get update if apt knows none (`updated` then). */
async function findKernelPackage(progress: (s: string) => void): Promise<{ pkg: string; updated: boolean }> {
  progress(`looking up the kernel package (apt-cache depends ${KERNEL_METAPACKAGE})`);
  const pkg = await lookUpKernelPackage();
  if (pkg) return { pkg, updated: false };
  await aptUpdate(progress, `apt does not know ${KERNEL_METAPACKAGE} (empty package lists?)`);
  const again = await lookUpKernelPackage();
  if (!again) {
    throw new SnaplabError(
      'DRIVER_UNAVAILABLE',
      `apt knows no package ${KERNEL_METAPACKAGE}, even after apt-get update`,
      'add Debian 12 (bookworm) main to /etc/apt/sources.list and run `apt-get update`',
    );
  }
  return { pkg: again, updated: true };
}

/** The package's .deb in `tmp`; on stale lists, refreshed once and looked up again (`pkg` may change). */
async function downloadKernel(
  tmp: string,
  wanted: string,
  updated: boolean,
  progress: (s: string) => void,
): Promise<{ deb: string; pkg: string }> {
  let pkg = wanted;
  // apt-get download: into the cwd; as root, so that _apt's sandbox need not reach the home
  const download = async (name: string): Promise<{ ok: boolean; msg: string }> => {
    progress(`downloading ${name}`);
    const r = await run('apt-get', ['-q', '-o', 'APT::Sandbox::User=root', 'download', name], {
      cwd: tmp,
      allowFail: true,
      timeoutMs: 600_000,
    });
    return {
      ok: r.code === 0,
      msg: (r.stderr || r.stdout)
        .trim()
        .split('\n')
        .filter((l) => !l.startsWith('W:'))
        .slice(-3)
        .join(' '),
    };
  };
  let got = await download(pkg);
  if (!got.ok && !updated) {
    // stale lists: the mirror may have moved on to a newer kernel ABI; refresh once and retry
    const failed = got.msg;
    try {
      await aptUpdate(progress, `apt-get download ${pkg} failed (${failed})`);
    } catch (e) {
      throw new SnaplabError(
        'DRIVER_UNAVAILABLE',
        `apt-get download failed: ${failed} (and ${(e as Error).message})`,
        APT_HINT,
        { cause: e },
      );
    }
    pkg = (await lookUpKernelPackage()) ?? pkg;
    got = await download(pkg);
  }
  if (!got.ok) throw new SnaplabError('DRIVER_UNAVAILABLE', `apt-get download failed: ${got.msg}`, APT_HINT);
  const deb = (await readdir(tmp)).find((f) => f.endsWith('.deb'));
  if (!deb) throw new SnaplabError('DRIVER_UNAVAILABLE', `apt-get download ${pkg} left no .deb in ${tmp}`, APT_HINT);
  return { deb, pkg };
}

/** The .deb unpacked and depmod'ed; in `out`: the kernel (PVH vmlinux, else the bzImage), the kept modules, kernel.json. */
async function buildKernelTree(
  tmp: string,
  deb: string,
  pkg: string,
  progress: (s: string) => void,
): Promise<{ version: string; kernelFile: 'vmlinux' | 'vmlinuz'; out: string; mods: string }> {
  progress(`extracting ${deb}`);
  const x = join(tmp, 'x');
  await run('dpkg-deb', ['-x', join(tmp, deb), x]);
  const versions = await readdir(join(x, 'lib', 'modules')).catch(orElse([] as string[], 'readdir', 'ENOENT'));
  const version = versions.find((v) => pkg === `linux-image-${v}`) ?? versions[0];
  const vmlinuz = version ? join(x, 'boot', `vmlinuz-${version}`) : '';
  if (!version || !existsSync(vmlinuz)) {
    throw new SnaplabError(
      'DRIVER_UNAVAILABLE',
      `${deb} has no /boot/vmlinuz-VERSION and /lib/modules/VERSION`,
      `is ${pkg} a kernel image package?`,
    );
  }
  progress(`depmod ${version}`);
  await run('depmod', ['-b', x, version]);

  const out = join(tmp, 'out');
  const mods = join(out, 'lib', 'modules', version);
  await mkdir(mods, { recursive: true });
  progress('extracting the uncompressed vmlinux for PVH boot');
  const kernelFile = (await extractVmlinux(vmlinuz, join(out, 'vmlinux'))) ? 'vmlinux' : 'vmlinuz';
  if (kernelFile === 'vmlinuz') {
    progress('no PVH vmlinux could be extracted: using the bzImage');
    await copyFile(vmlinuz, join(out, 'vmlinuz'));
  }
  await keepModules(join(x, 'lib', 'modules', version), mods, KEPT_MODULES);
  const manifest: KernelManifest = { version, kernel: kernelFile, package: pkg };
  await writeFile(join(out, 'kernel.json'), `${JSON.stringify(manifest, null, 2)}\n`);
  return { version, kernelFile, out, mods };
}

/** `out` renamed into the cache as this version's directory, unless a whole one stands there; returns its path. */
async function installKernel(home: string, out: string, mods: string, version: string): Promise<string> {
  const final = join(kernelDir(home), version);
  // another process may have cached the same version meanwhile: a whole one stands. One that
  // lacks a module gets it in place (the files first, modules.dep last, renamed over): the
  // kernel and every path stay, for VMs running from them or starting now
  const finalMods = join(final, 'lib', 'modules', version);
  if (existsSync(join(final, 'kernel.json')) && !(await keepsAll(finalMods, KEPT_MODULES)))
    await addModules(mods, finalMods);
  if (!existsSync(join(final, 'kernel.json'))) {
    await rm(final, { recursive: true, force: true });
    await rename(out, final).catch((e: NodeJS.ErrnoException) => {
      if (!((e.code === 'ENOTEMPTY' || e.code === 'EEXIST') && existsSync(join(final, 'kernel.json')))) throw e;
    });
  }
  return final;
}

/**
 * Debian's vmlinuz is a bzImage whose payload is lz4 (legacy frames): decompress from the magic.
 * lz4 exits non-zero on the bzImage's trailing bytes after the stream, so the result is judged
 * by what it wrote: an ELF with Xen's PVH entry note. Returns false (and leaves nothing) if not.
 */
async function extractVmlinux(vmlinuz: string, out: string): Promise<boolean> {
  if (!(await which('lz4'))) return false;
  const img = await readFile(vmlinuz);
  const at = img.indexOf(LZ4_LEGACY_MAGIC);
  if (at < 0) return false;
  const payload = `${out}.lz4`;
  await writeFile(payload, img.subarray(at));
  try {
    await run('lz4', ['-d', '-f', '-q', payload, out], { allowFail: true });
    const head = existsSync(out) ? readFileSync(out).subarray(0, 64) : Buffer.alloc(0);
    if (head.length < 64 || head.readUInt32BE(0) !== 0x7f454c46) {
      await rm(out, { force: true });
      return false;
    }
    return true;
  } finally {
    await rm(payload, { force: true });
  }
}

/** modules.dep as a map: module name → its path and the paths of its dependencies. */
interface ModuleDeps {
  path: Map<string, string>;
  deps: Map<string, string[]>;
}

const moduleName = (path: string): string =>
  basename(path)
    .replace(/\.ko(\.(xz|zst|gz))?$/, '')
    .replace(/-/g, '_');

function parseModulesDep(text: string): ModuleDeps {
  const path = new Map<string, string>();
  const deps = new Map<string, string[]>();
  for (const line of text.split('\n')) {
    const colon = line.indexOf(':');
    if (colon <= 0) continue;
    const p = line.slice(0, colon).trim();
    const name = moduleName(p);
    path.set(name, p);
    deps.set(
      name,
      line
        .slice(colon + 1)
        .trim()
        .split(/\s+/)
        .filter(Boolean)
        .map(moduleName),
    );
  }
  return { path, deps };
}

/** The module files to load for `wanted`, dependencies first; built-in modules are left out. */
function loadOrder(md: ModuleDeps, builtin: Set<string>, wanted: readonly string[], where: string): string[] {
  const order: string[] = [];
  const seen = new Set<string>();
  const visit = (name: string): void => {
    if (seen.has(name)) return;
    seen.add(name);
    const p = md.path.get(name);
    if (!p) {
      if (builtin.has(name)) return;
      throw new SnaplabError(
        'INTERNAL',
        `kernel module ${name} is neither in ${where}/modules.dep nor built in`,
        'remove the cached kernel (qemu/kernel under the snaplab home) to fetch it again',
      );
    }
    for (const d of md.deps.get(name) ?? []) visit(d);
    order.push(p);
  };
  for (const w of wanted) visit(w);
  return order;
}

async function readBuiltin(dir: string): Promise<Set<string>> {
  const text = await readFile(join(dir, 'modules.builtin'), 'utf8').catch(orElse('', 'readFile', 'ENOENT'));
  return new Set(text.split('\n').filter(Boolean).map(moduleName));
}

/** Copy `wanted` and their dependencies from `from` to `to` with a modules.dep naming only them. */
async function keepModules(from: string, to: string, wanted: string[]): Promise<void> {
  const md = parseModulesDep(await readFile(join(from, 'modules.dep'), 'utf8'));
  const builtin = await readBuiltin(from);
  const files = loadOrder(md, builtin, wanted, from);
  const kept = new Set(files);
  for (const f of files) {
    await mkdir(dirname(join(to, f)), { recursive: true });
    await copyFile(join(from, f), join(to, f));
  }
  const dep = (await readFile(join(from, 'modules.dep'), 'utf8'))
    .split('\n')
    .filter((l) => kept.has(l.slice(0, l.indexOf(':'))))
    .join('\n');
  await writeFile(join(to, 'modules.dep'), `${dep}\n`);
  for (const f of ['modules.builtin', 'modules.order']) {
    if (existsSync(join(from, f))) await copyFile(join(from, f), join(to, f));
  }
}

/** Copy into `to` the module files of `from` it lacks, then `from`'s modules.dep over its own (atomically). */
async function addModules(from: string, to: string): Promise<void> {
  for (const rel of await listTree(from)) {
    const src = join(from, rel);
    if (!rel.endsWith('.ko') && !/\.ko\.(xz|zst|gz)$/.test(rel)) continue;
    if (existsSync(join(to, rel))) continue;
    await mkdir(dirname(join(to, rel)), { recursive: true });
    await copyFile(src, `${join(to, rel)}.tmp`);
    await rename(`${join(to, rel)}.tmp`, join(to, rel));
  }
  await copyFile(join(from, 'modules.dep'), join(to, 'modules.dep.tmp'));
  await rename(join(to, 'modules.dep.tmp'), join(to, 'modules.dep'));
}

/** The host's static busybox, which runs the guest's /init whatever the image has. */
async function staticBusybox(): Promise<string> {
  const bb = (await which('busybox')) ?? '/bin/busybox';
  if (!existsSync(bb) || isDynamicElf(bb)) {
    throw new SnaplabError(
      'DRIVER_UNAVAILABLE',
      `the guest's /init needs a static busybox; ${existsSync(bb) ? `${bb} is dynamically linked` : 'none found'}`,
      'apt-get install busybox-static',
    );
  }
  return bb;
}

export interface InitramfsOptions {
  home: string;
  kernel: GuestKernel;
  /** the static agent, native/build/snaplab-agent */
  agent: string;
  machine: Machine;
  /** capabilities the agent lets commands keep (default: the namespaces driver's set) */
  caps?: readonly string[];
}

/** Fixed mtime for the archive's entries, so that a build does not change between runs. */
const STAGE_MTIME = new Date(0);

const inflightInitramfs = new Map<string, Promise<string>>();

/**
 * The gzip'd initramfs every VM boots with: /init, the agent at /sbin/snaplab-agent, the virtio,
 * block and ext4 modules for `machine` (and modules.dep), and the busybox /init runs under. It
 * holds nothing of the image (the root filesystem is the VM's disk), so it is built once per
 * kernel, agent, busybox and settings, and cached under `${home}/qemu/initrd/` by their hash;
 * written atomically, so a crash leaves no half file.
 */
export async function ensureInitramfs(opts: InitramfsOptions): Promise<string> {
  if (!existsSync(opts.agent)) {
    throw new SnaplabError(
      'INTERNAL',
      `agent binary not found at ${opts.agent}`,
      'build it: make -C native (or npm run build:agent)',
    );
  }
  if (isDynamicElf(opts.agent))
    throw new SnaplabError(
      'INTERNAL',
      `${opts.agent} is dynamically linked; the guest has no libc for it`,
      'rebuild it: make -C native',
    );
  const busybox = await staticBusybox();
  const { kernel } = opts;
  const md = parseModulesDep(await readFile(join(kernel.modulesDir, 'modules.dep'), 'utf8'));
  const builtin = await readBuiltin(kernel.modulesDir);
  const base = loadOrder(md, builtin, GUEST_MODULES[opts.machine], kernel.modulesDir);
  // the network's, past what the base loads (virtio itself): loaded only by a VM with interfaces
  // (none in a kernel cached before them: the driver completes the cache for a VM with a NIC)
  const net = (await keepsAll(kernel.modulesDir, NET_MODULES))
    ? loadOrder(md, builtin, NET_MODULES, kernel.modulesDir).filter((m) => !base.includes(m))
    : [];
  const modules = [...base, ...net];
  const guestModulesDir = `/lib/modules/${kernel.version}`;
  const inGuest = (l: string[]): string[] => l.map((m) => `${guestModulesDir}/${m}`);
  const init = initScript({
    modules: inGuest(base),
    netModules: inGuest(net),
    caps: opts.caps ?? SANDBOX_CAPABILITIES,
  });
  const key = createHash('sha256')
    .update(JSON.stringify([kernel.version, opts.machine, init]))
    .update(await readFile(opts.agent))
    .update(await readFile(busybox))
    .digest('hex')
    .slice(0, 24);
  const out = join(opts.home, 'qemu', 'initrd', `${key}.cpio.gz`);
  if (existsSync(out)) return out;
  let p = inflightInitramfs.get(out);
  if (!p) {
    p = writeInitramfs(opts, { out, init, busybox, modules, guestModulesDir }).finally(() =>
      inflightInitramfs.delete(out),
    );
    inflightInitramfs.set(out, p);
  }
  return p;
}

async function writeInitramfs(
  opts: InitramfsOptions,
  b: { out: string; init: string; busybox: string; modules: string[]; guestModulesDir: string },
): Promise<string> {
  const { kernel } = opts;
  await mkdir(join(opts.home, 'qemu', 'tmp'), { recursive: true });
  const tmp = await mkdtemp(join(opts.home, 'qemu', 'tmp', 'initramfs-'));
  const outTmp = `${b.out}.tmp-${process.pid}-${Date.now()}`;
  try {
    const stage = join(tmp, 'stage');
    const put = async (rel: string, from: string | { text: string }, mode: number): Promise<void> => {
      const dst = join(stage, rel);
      await mkdir(dirname(dst), { recursive: true });
      if (typeof from === 'string') await copyFile(from, dst);
      else await writeFile(dst, from.text);
      await chmod(dst, mode);
    };
    await put('init', { text: b.init }, 0o755);
    await put(GUEST_AGENT_PATH.slice(1), opts.agent, 0o755);
    await put(INIT_BUSYBOX.slice(1), b.busybox, 0o755);
    for (const m of b.modules) await put(`${b.guestModulesDir.slice(1)}/${m}`, join(kernel.modulesDir, m), 0o644);
    const dep = (await readFile(join(kernel.modulesDir, 'modules.dep'), 'utf8'))
      .split('\n')
      .filter((l) => b.modules.includes(l.slice(0, l.indexOf(':'))))
      .join('\n');
    await put(`${b.guestModulesDir.slice(1)}/modules.dep`, { text: `${dep}\n` }, 0o644);
    for (const rel of [...(await listTree(stage)), '.'].reverse())
      await utimes(join(stage, rel), STAGE_MTIME, STAGE_MTIME);
    await writeNewc(stage, await listTree(stage), join(tmp, 'snaplab.cpio'), { rootOwner: true });
    await mkdir(dirname(b.out), { recursive: true });
    await gzipConcat([join(tmp, 'snaplab.cpio')], outTmp, 1);
    await rename(outTmp, b.out);
    return b.out;
  } finally {
    await rm(outTmp, { force: true });
    await rm(tmp, { recursive: true, force: true });
  }
}

let tscKhz: number | undefined | null = null;
/** The host's TSC frequency in kHz from /proc/cpuinfo's `cpu MHz` (undefined when it has none). */
export function hostTscKhz(): number | undefined {
  if (tscKhz === null) {
    const m = /^cpu MHz\s*:\s*([\d.]+)/m.exec(readFileSync('/proc/cpuinfo', 'utf8'));
    tscKhz = m ? Math.round(Number(m[1]) * 1000) || undefined : undefined;
  }
  return tscKhz;
}

/**
 * The guest kernel's command line (the driver appends `snaplab.hostname=NAME`). tsc_early_khz:
 * microvm under TCG hangs calibrating the TSC without it (no HPET/PM timer), and pc is spared
 * the calibration. init_on_free=1: freed pages are zero, so memory snapshots stay small.
 */
export function qemuKernelArgs(machine: Machine): string {
  // the same for both machines today (measured: microvm powers off and panics out of QEMU with
  // -no-reboot without reboot=t); the parameter keeps the call sites honest for when they differ
  void machine;
  const khz = hostTscKhz();
  return ['console=ttyS0', 'quiet', 'panic=-1', ...(khz ? [`tsc_early_khz=${khz}`] : []), 'init_on_free=1'].join(' ');
}
