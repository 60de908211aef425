import { randomBytes, randomInt } from 'node:crypto';
import { readFileSync, realpathSync, statSync } from 'node:fs';
import { link, mkdir, open, readdir, readFile, rename, rmdir, stat, unlink, writeFile } from 'node:fs/promises';
import { dirname, isAbsolute, join, resolve } from 'node:path';
import { SnaplabError } from '../../errors.js';
import { USERNS_MIN_SIZE, USERNS_SIZE, USERNS_SLOTS, slotBase, slotOf, tierSlots } from './id-ranges.js';
import { pidAlive } from '../procs.js';
import { noted, orElse } from '../../cleanup.js';

/**
 * Which user namespace ranges are in use, host-wide: one file per claimed range, named by its first
 * id and linked into place whole (link fails when the name exists), so that two processes, or two snaplab homes on one host, never get the
 * same range (each home's state.db alone could not know the other's). On tmpfs, so a reboot (which
 * ends every sandbox) frees them all. Each file names the home and sandbox that hold it; a home's
 * gc removes the files of its sandboxes that are gone.
 */
export const REGISTRY = '/run/snaplab/userns';

interface Holder {
  home: string;
  id: string;
  /** the process that claimed it */
  pid?: number;
}

const FOREIGN: [number, number] = [0x7ffe_0000, 0x7ffe_ffff];

/** the ids the account files named when last read (each a [first, last] range), and when they were last looked at */
let named: { ranges: [number, number][]; mtimes: string; at: number } | undefined;
/** accounts, and the subordinate ranges given to users (their rootless containers' ids: newuidmap) */
const ACCOUNT_FILES = ['/etc/passwd', '/etc/group', '/etc/subuid', '/etc/subgid'];
/** how often a process looks whether the account files changed (a daemon runs for months) */
const ACCOUNTS_CHECK_MS = 5000;
const LOWEST = 0x7000_0000;

/**
 * The ids the host's account files name at or above LOWEST, as ranges (a sandbox's range must not
 * contain a real account, nor ids a user was given for containers of their own: they would share
 * host ids with it), read again when a file changed. Accounts only an NSS service knows (sssd,
 * LDAP) are not seen: docs/security.md.
 */
function hostIds(): [number, number][] {
  const now = Date.now();
  if (named && now - named.at < ACCOUNTS_CHECK_MS) return named.ranges;
  const mtimes = ACCOUNT_FILES.map((f) => {
    try {
      return String(statSync(f).mtimeMs);
    } catch {
      return '-';
    }
  }).join(' ');
  if (named?.mtimes === mtimes) {
    named.at = now;
    return named.ranges;
  }
  named = { ranges: ACCOUNT_FILES.flatMap((f) => namedIn(f)), mtimes, at: now };
  return named.ranges;
}

/** The ranges one account file names at or above LOWEST: NAME:x:ID:… (passwd, group), NAME:FIRST:COUNT (subuid, subgid). */
export function namedIn(file: string, text = readAccounts(file)): [number, number][] {
  const sub = file.endsWith('/subuid') || file.endsWith('/subgid');
  const out: [number, number][] = [];
  for (const line of text.split('\n')) {
    const f = line.split(':');
    const first = Number(f[sub ? 1 : 2]);
    const count = sub ? Number(f[2]) : 1;
    if (!f[0] || !Number.isSafeInteger(first) || first < 0 || !Number.isSafeInteger(count) || count < 1) continue;
    if (first + count - 1 >= LOWEST) out.push([first, first + count - 1]);
  }
  return out;
}

function readAccounts(file: string): string {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return ''; // (no such file: nothing named; subuid and subgid are often absent)
  }
}

const overlaps = (base: number, lo: number, hi: number): boolean => base <= hi && base + USERNS_SIZE - 1 >= lo;

/** The slots no one may have: they hold an account, a user's subordinate ids, or systemd's foreign range. */
function unusable(base: number): boolean {
  return overlaps(base, FOREIGN[0], FOREIGN[1]) || hostIds().some(([lo, hi]) => overlaps(base, lo, hi));
}

/** A name of this process's in the registry (a claim being written, one moved aside): gc removes those of dead pids. */
const tmpName = (): string => join(REGISTRY, `.tmp-${process.pid}-${randomBytes(4).toString('hex')}`);

/**
 * Random slots tried by link() before one readdir of the registry. Each try that finds its slot
 * taken costs a failed link (a thread-pool round trip and an Error); a scan reads the registry once
 * and knows every free slot. 8: while at most half the tier is taken, 1 claim in 256 scans; in a
 * dense tier the scan comes early, and what it found free serves this process's next claims.
 */
const TRIES = 8;

/**
 * What this process learnt of a tier at its last scan, for whole-slot claims: the slots then free,
 * tried before random ones (another process may have taken one since: that try fails like a random
 * one), so that a dense tier costs one readdir for that many claims, not TRIES failed links each;
 * and when the scan found none. A tier found full is skipped for FULL_RECHECK_MS, or until this
 * process frees a slot in it, when a later tier can take the claim (the last is always looked at:
 * a create never fails on what this process saw earlier). Before, with the low tier full (~2 600
 * sandboxes on the host), every create made ~24 failed tries and a scan of it first: ~50 link
 * calls, ~3.4 ms of the loop's CPU (docs/benchmarks.md "Density").
 */
interface TierView {
  from: number;
  to: number;
  free: number[];
  fullAt?: number;
}
const FULL_RECHECK_MS = 10_000;
const views = new Map<string, TierView>();
function viewOf(from: number, to: number): TierView {
  const key = `${from}-${to}`;
  let v = views.get(key);
  if (!v) views.set(key, (v = { from, to, free: [] }));
  return v;
}

/** How many times this process read the registry whole to claim (a test reads it). */
export const claimEffort = { scans: 0 };

const errno = (e: unknown): string | undefined => (e as NodeJS.ErrnoException).code;

/** A range's size as a create may ask (`ids`): a power of two from USERNS_MIN_SIZE to USERNS_SIZE. */
export function checkRangeSize(size: number): number {
  if (!Number.isInteger(size) || size < USERNS_MIN_SIZE || size > USERNS_SIZE || (size & (size - 1)) !== 0)
    throw new SnaplabError(
      'BAD_INPUT',
      `invalid ids ${size}`,
      `give a power of two from ${USERNS_MIN_SIZE} to ${USERNS_SIZE} (the default; a system machine needs it)`,
    );
  return size;
}

/**
 * Claim a free range of `size` ids for sandbox `id` of `home`, host-wide. The registry holds one
 * name per slot: a file for a slot claimed whole, or a directory for a slot split into ranges of
 * one size, each a file `<first id>.<size>` in it. mkdir and link fail when the name exists, so a
 * whole claim and a split slot exclude each other; a split slot's size is what its files say
 * (claimInSlot). Tiers in order (the stretch below 2^31 first); in each, random slots are tried
 * (a split one first, where the last claim of that size went), and only when TRIES of them fail
 * is the registry read whole.
 */
export async function claimRange(home: string, id: string, size = USERNS_SIZE): Promise<number> {
  checkRangeSize(size);
  await mkdir(REGISTRY, { recursive: true, mode: 0o700 });
  const holder: Holder = { home, id, pid: process.pid };
  // written whole first, then linked into place (link fails if the name exists): no reader, and no
  // crash, ever leaves a claim without its holder
  const tmp = tmpName();
  await writeFile(tmp, JSON.stringify(holder), { mode: 0o600 });
  try {
    const tiers = tierSlots();
    const passed: [number, number][] = [];
    for (const [t, [from, to]] of tiers.entries()) {
      const view = size === USERNS_SIZE ? viewOf(from, to) : undefined;
      const last = t === tiers.length - 1;
      if (view?.fullAt !== undefined && performance.now() - view.fullAt < FULL_RECHECK_MS && !last) {
        passed.push([from, to]);
        continue;
      }
      const got =
        (view && (await claimKnown(tmp, view))) ??
        (await claimByTries(tmp, size, from, to)) ??
        (await claimByScan(tmp, size, from, to, view));
      if (got !== undefined) return got;
    }
    // every tier looked at is full: those passed over are looked at again before a create fails
    // (another process may have freed a slot there since)
    for (const [from, to] of passed) {
      const got = await claimByScan(tmp, size, from, to, viewOf(from, to));
      if (got !== undefined) return got;
    }
  } finally {
    await unlink(tmp).catch(noted(`remove ${tmp}`, 'ENOENT'));
  }
  throw new SnaplabError(
    'NO_USERNS_SLOT',
    `every user namespace range is in use (${USERNS_SLOTS} of ${USERNS_SIZE} ids on this host)`,
    'remove sandboxes (`snaplab rm`, `snaplab gc`), create with a smaller range (--ids 4096), or use --no-userns',
  );
}

async function claimByTries(tmp: string, size: number, from: number, to: number): Promise<number | undefined> {
  const hint = size < USERNS_SIZE ? await readHint(size) : undefined;
  // (a hint names a slot that was usable then: an account added since may fall in it)
  if (hint !== undefined && hint >= slotBase(from) && hint <= slotBase(to - 1) && !unusable(hint)) {
    const got = await claimInSlot(tmp, hint, size);
    if (got !== undefined) return got;
  }
  for (let i = 0; i < TRIES; i++) {
    const base = slotBase(from + randomInt(to - from));
    if (unusable(base)) continue;
    const got = await claimInSlot(tmp, base, size);
    if (got !== undefined) return got;
  }
  return undefined;
}

/**
 * A whole slot among those the last scan of the tier found free. After TRIES of them are found
 * taken the list is stale (other processes, other homes took them): it is dropped, and the claim
 * goes on as one with no list, so a long-lived daemon never pays a failed link per stale entry.
 */
async function claimKnown(tmp: string, view: TierView): Promise<number | undefined> {
  for (let failed = 0; view.free.length; ) {
    if (failed === TRIES) {
      view.free = [];
      break;
    }
    const i = randomInt(view.free.length);
    const base = view.free[i]!;
    view.free[i] = view.free[view.free.length - 1]!;
    view.free.pop();
    if (unusable(base)) continue;
    const got = await claimInSlot(tmp, base, USERNS_SIZE);
    if (got !== undefined) return got;
    failed++;
  }
  return undefined;
}

/**
 * Every slot of the tier that is free, or split (a small claim packs into one of those first). For
 * a whole claim, what is left free is kept for the next (`view`), and a tier with none is marked.
 */
async function claimByScan(
  tmp: string,
  size: number,
  from: number,
  to: number,
  view?: TierView,
): Promise<number | undefined> {
  claimEffort.scans++;
  const names = new Map((await readdir(REGISTRY, { withFileTypes: true })).map((d) => [d.name, d.isDirectory()]));
  const split: number[] = [];
  const free: number[] = [];
  for (let n = from; n < to; n++) {
    const base = slotBase(n);
    const dir = names.get(String(base));
    if (dir === false || unusable(base)) continue;
    (dir ? split : free).push(base);
  }
  for (const list of size < USERNS_SIZE ? [split, free] : [[...split, ...free]]) {
    while (list.length) {
      const i = randomInt(list.length);
      const got = await claimInSlot(tmp, list[i]!, size);
      list[i] = list[list.length - 1]!;
      list.pop();
      if (got !== undefined) {
        if (view) {
          // (the split ones left are in use: no whole claim is made there)
          view.free = list.filter((b) => !names.get(String(b)));
          view.fullAt = undefined;
        }
        return got;
      }
    }
  }
  // (a monotonic clock: a wall clock stepped back would keep the tier passed over that much longer)
  if (view) view.fullAt = performance.now();
  return undefined;
}

/** The first id of the range claimed in slot `base`, or undefined when the slot has none to give. */
async function claimInSlot(tmp: string, base: number, size: number): Promise<number | undefined> {
  const path = join(REGISTRY, String(base));
  if (size === USERNS_SIZE) {
    if (await linked(tmp, path)) return base;
    // a split slot with nothing in it: taken away (a claimer about to link into it gets ENOENT),
    // then claimed; a claim (a file: ENOTDIR) or a split slot in use is no slot to try again
    const emptied = await rmdir(path).then(
      () => true,
      orElse(false, `remove empty ${path}`, 'ENOENT', 'ENOTEMPTY', 'ENOTDIR', 'EEXIST'),
    );
    return emptied && (await linked(tmp, path)) ? base : undefined;
  }
  await mkdir(path, { mode: 0o700 }).catch(noted(`split ${path}`, 'EEXIST'));
  const names = await readdir(path).catch(orElse(undefined, `read ${path}`, 'ENOTDIR', 'ENOENT'));
  if (!names || names.some((n) => sizeOfPart(n) !== size)) return undefined;
  const taken = new Set(names);
  const free: number[] = [];
  for (let b = base; b < base + USERNS_SIZE; b += size) if (!taken.has(`${b}.${size}`)) free.push(b);
  while (free.length) {
    const i = randomInt(free.length);
    const part = join(path, `${free[i]}.${size}`);
    try {
      await link(tmp, part);
    } catch (e) {
      // the slot was emptied and removed meanwhile (ENOENT), and perhaps claimed whole since (ENOTDIR)
      if (errno(e) === 'ENOENT' || errno(e) === 'ENOTDIR') return undefined;
      if (errno(e) !== 'EEXIST') throw e;
      free[i] = free[free.length - 1]!;
      free.pop();
      continue;
    }
    // two first claims of different sizes in one empty slot: each looks after linking, and one that
    // sees another size gives way (of two, at least the later one sees the earlier: never both kept)
    if ((await readdir(path)).some((n) => sizeOfPart(n) !== size)) {
      await unlink(part);
      await rmdir(path).catch(noted(`remove empty ${path}`, 'ENOENT', 'ENOTEMPTY', 'EEXIST'));
      return undefined;
    }
    await writeHint(size, base);
    return free[i]!;
  }
  return undefined;
}

async function linked(tmp: string, path: string): Promise<boolean> {
  try {
    await link(tmp, path);
    return true;
  } catch (e) {
    if (errno(e) !== 'EEXIST') throw e;
    return false;
  }
}

/** The size of a range in a split slot, from its file's name (`<first id>.<size>`); NaN for anything else. */
const sizeOfPart = (name: string): number => Number(/^\d+\.(\d+)$/.exec(name)?.[1] ?? Number.NaN);

/** Where the last claim of `size` went (a hint only: every claim checks the slot itself). */
const hintPath = (size: number): string => join(REGISTRY, `.open-${size}`);
async function readHint(size: number): Promise<number | undefined> {
  const n = Number(await readFile(hintPath(size), 'utf8').catch(orElse('', 'read hint', 'ENOENT')));
  return Number.isSafeInteger(n) && n > 0 && slotOf(n) === n ? n : undefined;
}
async function writeHint(size: number, base: number): Promise<void> {
  if ((await readHint(size)) === base) return;
  const tmp = tmpName();
  await writeFile(tmp, String(base), { mode: 0o600 });
  await rename(tmp, hintPath(size));
}

/** Where the claim of the range at `base` of `size` ids is (claimRange). */
function claimPath(base: number, size: number): string {
  return size === USERNS_SIZE ? join(REGISTRY, String(base)) : join(REGISTRY, String(slotOf(base)), `${base}.${size}`);
}

/**
 * Give back the range at `base` (of `size` ids) if `home`'s `id` still holds it: a stale caller (a
 * record read hours ago, a second release of the same range) must not free a claim someone else
 * made since. A split slot left empty is removed (rmdir: only if empty, so never under a claim).
 */
export async function releaseRange(
  base: number,
  home: string,
  id: string,
  ids: number | null = USERNS_SIZE,
): Promise<void> {
  const size = ids ?? USERNS_SIZE;
  const path = claimPath(base, size);
  const read = await readClaim(path);
  if (!read || !sameHome(read.holder.home, home) || read.holder.id !== id) return;
  // moved aside, then checked to be the claim read: two releases of one claim at once (rm and gc)
  // must not free a claim made between one's read and the other's unlink
  const aside = tmpName();
  const moved = await rename(path, aside).then(() => true, noted(`release uid range ${path}`, 'ENOENT'));
  if (!moved) return; // released meanwhile
  const ours = (await stat(aside)).ino === read.ino;
  if (!ours) await link(aside, path).catch(noted(`put back the claim at ${path}`, 'ENOENT'));
  await unlink(aside).catch(noted(`remove ${aside}`, 'ENOENT'));
  if (size < USERNS_SIZE)
    await rmdir(dirname(path)).catch(noted(`remove empty ${path}`, 'ENOENT', 'ENOTEMPTY', 'EEXIST'));
  // its tier is no longer full as far as this process knows, and a whole slot is free again: its
  // next claim may take it back (a split one may have been emptied: a scan will say)
  for (const v of views.values())
    if (base >= slotBase(v.from) && base <= slotBase(v.to - 1)) {
      if (size === USERNS_SIZE && ours) v.free.push(base);
      v.fullAt = undefined;
    }
}

/**
 * Make sure `home`'s `id` holds the range at `base` of `size` ids, as its record says: a stopped
 * machine keeps its range, but the registry is on tmpfs, so after a reboot its claim is gone and
 * its start claims that range again. Resolves with who holds it when another does (then nothing is
 * claimed), else undefined.
 */
export async function holdRange(
  base: number,
  home: string,
  id: string,
  ids: number | null = USERNS_SIZE,
): Promise<string | undefined> {
  const size = ids ?? USERNS_SIZE;
  const path = claimPath(base, size);
  const held = async (): Promise<string | undefined> => {
    const text = await readFile(path, 'utf8').catch(orElse(undefined, `read ${path}`, 'ENOENT', 'EISDIR', 'ENOTDIR'));
    if (text === undefined) return undefined;
    const h = parseHolder(text);
    return h && sameHome(h.home, home) && h.id === id
      ? ''
      : h
        ? `sandbox ${h.id} of ${h.home}`
        : `${path} (not a claim)`;
  };
  const now = await held();
  if (now !== undefined) return now || undefined;
  const slot = slotOf(base);
  if (slot === undefined) return 'no one: it is outside the ranges snaplab gives';
  if (unusable(slot)) return 'an account of the host (/etc/passwd, /etc/group) or systemd';
  await mkdir(REGISTRY, { recursive: true, mode: 0o700 });
  const tmp = tmpName();
  await writeFile(tmp, JSON.stringify({ home, id, pid: process.pid } satisfies Holder), { mode: 0o600 });
  try {
    // (a split slot emptied and removed between its mkdir and the link: once more)
    for (let attempt = 0; ; attempt++) {
      if (size < USERNS_SIZE) {
        const dir = dirname(path);
        await mkdir(dir, { mode: 0o700 }).catch(noted(`split ${dir}`, 'EEXIST'));
        const names = await readdir(dir).catch(orElse(undefined, `read ${dir}`, 'ENOTDIR', 'ENOENT'));
        if (!names) return `a claim of the whole slot ${dir}`;
        if (names.some((n) => sizeOfPart(n) !== size)) return `ranges of another size in ${dir}`;
      }
      try {
        await link(tmp, path);
        return undefined;
      } catch (e) {
        if (errno(e) === 'ENOENT' && size < USERNS_SIZE && attempt < 3) continue;
        if (errno(e) !== 'EEXIST' && errno(e) !== 'ENOENT' && errno(e) !== 'ENOTDIR') throw e;
        // claimed meanwhile: by this machine in another process (its own: fine), or by another
        const h = await held();
        return h === '' ? undefined : (h ?? `another claim at ${path}`);
      }
    }
  } finally {
    await unlink(tmp).catch(noted(`remove ${tmp}`, 'ENOENT'));
  }
}

/** A claim's holder and the inode read (which claim it was); undefined when there is none to read. */
async function readClaim(path: string): Promise<{ holder: Holder; ino: number } | undefined> {
  const fd = await open(path, 'r').catch(orElse(undefined, `open ${path}`, 'ENOENT', 'EISDIR', 'ENOTDIR'));
  if (!fd) return undefined;
  try {
    const [st, text] = await Promise.all([fd.stat(), fd.readFile('utf8')]);
    const holder = parseHolder(text);
    return holder ? { holder, ino: st.ino } : undefined;
  } finally {
    await fd.close();
  }
}

/** homes as claims spell them → their one spelling (realpath), each looked up once */
const spelt = new Map<string, string>();
/**
 * Is a claim's home `home` (spelt whole: LabContext.home)? Claims written before homes were spelt
 * whole (a trailing `/`, a link) are the same home; a relative one cannot be told and is not.
 */
function sameHome(claimed: string, home: string): boolean {
  if (claimed === home) return true;
  if (!isAbsolute(claimed)) return false;
  let whole = spelt.get(claimed);
  if (whole === undefined) {
    try {
      whole = realpathSync(claimed);
    } catch {
      whole = resolve(claimed);
    }
    if (spelt.size > 1000) spelt.clear();
    spelt.set(claimed, whole);
  }
  return whole === home;
}

/** A claim file's holder; undefined for one that is not a snaplab claim (left alone, never freed). */
function parseHolder(text: string): Holder | undefined {
  try {
    const h = JSON.parse(text) as Partial<Holder>;
    return typeof h.home === 'string' && typeof h.id === 'string' ? (h as Holder) : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The registry's names, read once a pass (gc): every claim file, whole slots and the ranges in
 * split slots (named `<first id>` and `<slot>/<first id>.<size>`: nothing is read of them here),
 * the split slots it found empty, and the claims being written (`.tmp-PID-…`).
 */
export interface RegistryNames {
  claims: { path: string; base: number; size: number }[];
  emptySlots: string[];
  writes: { path: string; pid: number }[];
}

export async function registryNames(): Promise<RegistryNames> {
  const out: RegistryNames = { claims: [], emptySlots: [], writes: [] };
  for (const d of await readdir(REGISTRY, { withFileTypes: true }).catch(orElse([], 'readdir', 'ENOENT'))) {
    const path = join(REGISTRY, d.name);
    const tmp = /^\.tmp-(\d+)-/.exec(d.name);
    if (tmp) out.writes.push({ path, pid: Number(tmp[1]) });
    if (!/^\d+$/.test(d.name)) continue; // a claim being written (above), a hint (.open-…)
    if (!d.isDirectory()) {
      out.claims.push({ path, base: Number(d.name), size: USERNS_SIZE });
      continue;
    }
    const parts = await readdir(path).catch(orElse(undefined, `readdir ${path}`, 'ENOENT'));
    if (parts?.length === 0) out.emptySlots.push(path);
    for (const f of parts ?? []) {
      const m = /^(\d+)\.(\d+)$/.exec(f);
      if (m) out.claims.push({ path: join(path, f), base: Number(m[1]), size: Number(m[2]) });
    }
  }
  return out;
}

/**
 * Claims a process began and never linked into place: it died between creating its `.tmp-PID-…`
 * file and removing it (a test worker torn down mid-create left empty ones). Removed once that
 * pid is gone; they hold no range. And split slots with no range left in them (a claimer that gave
 * way, or died between mkdir and link): rmdir removes only an empty one.
 */
export async function removeDeadClaimWrites(names: RegistryNames): Promise<string[]> {
  const removed: string[] = [];
  for (const path of names.emptySlots) {
    const gone = await rmdir(path).then(
      () => true,
      orElse(false, `remove empty ${path}`, 'ENOENT', 'ENOTEMPTY', 'EEXIST'),
    );
    if (gone) removed.push(path);
  }
  for (const w of names.writes) {
    if (await pidAlive(w.pid)) continue;
    await unlink(w.path).catch(noted(`remove stale ${w.path}`, 'ENOENT'));
    removed.push(w.path);
  }
  return removed;
}

interface Claim extends Holder {
  base: number;
  /** ids in the range */
  size: number;
  /** its file in the registry */
  path: string;
}

/** claim files read between two turns of the event loop (each a few µs: the registry is on tmpfs) */
const READ_BATCH = 256;

/**
 * The claims among `names` (every one when `skip` is not given): their files read. The registry is
 * host-wide (every home's sandboxes: thousands), so its files are read synchronously, a batch per
 * turn of the event loop: a tiny file on tmpfs is read in microseconds, one awaited read at a time
 * took milliseconds each on a busy host.
 */
async function claims(
  names: RegistryNames['claims'],
  skip: (base: number, size: number) => boolean = () => false,
): Promise<Claim[]> {
  const out: Claim[] = [];
  let read = 0;
  for (const { path, base, size } of names) {
    if (skip(base, size)) continue;
    if (++read % READ_BATCH === 0) await new Promise<void>((r) => setImmediate(r));
    const h = readHolder(path);
    if (h) out.push({ ...h, base, size, path });
  }
  return out;
}

/** A claim file's holder, read synchronously (claims()); undefined when it is gone or not a claim. */
function readHolder(path: string): Holder | undefined {
  try {
    return parseHolder(readFileSync(path, 'utf8'));
  } catch {
    // released meanwhile, or unreadable now: either way not freed by this reading (as before)
    return undefined;
  }
}

/** How long ago a claim was written (0 when it is gone: a release is as young as it gets). */
async function ageOf(path: string): Promise<number> {
  const st = await stat(path).catch(orElse(null, 'stat', 'ENOENT'));
  return st ? Date.now() - st.mtimeMs : 0;
}

/** The ranges `home` holds in the registry, first id → holder (a sandbox id, or a scenario machine's). */
export async function rangesOf(home: string): Promise<Map<number, string>> {
  return new Map(
    (await claims((await registryNames()).claims)).filter((c) => sameHome(c.home, home)).map((c) => [c.base, c.id]),
  );
}

/**
 * The claims gc may give back: `home`'s whose holder `isHeld` denies, unless the claim is young and
 * its claimer alive, this process included (a create claims its range a moment before it writes
 * its record); and any home's that no longer exists, once nothing of the holder runs (`running`).
 * A claim of a range `recorded` says this home's records hold (first id and size: one claim per
 * range on the host, so it is theirs) is not read: a gc with nothing to do reads no claim of its
 * own sandboxes; what a crash leaves (a claim no record holds) is read and found as before.
 */
export async function staleClaims(
  home: string,
  names: RegistryNames,
  recorded: (base: number, size: number) => boolean,
  isHeld: (id: string) => boolean,
  running: (id: string) => Promise<boolean>,
  graceMs: number,
): Promise<Claim[]> {
  const stale: Claim[] = [];
  // whether another home still exists, asked once per home (thousands of claims name a few homes)
  const homes = new Map<string, boolean>();
  const exists = (h: string): boolean => homes.get(h) ?? homes.set(h, homeExists(h)).get(h)!;
  for (const c of await claims(names.claims, recorded)) {
    if (sameHome(c.home, home)) {
      if (isHeld(c.id)) continue;
      if (c.pid !== undefined && (await ageOf(c.path)) < graceMs && (await pidAlive(c.pid))) continue;
      stale.push(c);
    } else if (!exists(c.home) && !(await running(c.id))) stale.push(c);
  }
  return stale;
}

/**
 * Does another home still exist? Only its absence is evidence that it is gone (ENOENT, ENOTDIR): a
 * stat that fails otherwise (EACCES, ESTALE), or a path not absolute (a claim from before homes
 * were spelt whole, relative to a working directory not known here), says it may.
 */
function homeExists(home: string): boolean {
  if (!isAbsolute(home)) return true;
  try {
    statSync(home);
    return true;
  } catch (e) {
    return errno(e) !== 'ENOENT' && errno(e) !== 'ENOTDIR';
  }
}

/** A copy of a scenario's machines (scenario/names.ts Copy), as the registry spells it. */
export type MachineCopy = 'live' | 'standby' | 'aside';
const TAG: Record<MachineCopy, string> = { live: '', standby: 's', aside: 'x' };
const COPY_OF: Record<string, MachineCopy> = { '': 'live', s: 'standby', x: 'aside' };

/**
 * The holder name of machine `index` of scenario `sid`: its range is the scenario's, not a
 * sandbox's. A standby copy's machines hold `s<index>`, a set-aside copy's `x<index>`.
 */
export const machineHolder = (sid: string, index: number, copy: MachineCopy = 'live'): string =>
  `scenario:${sid}:${TAG[copy]}${index}`;

/** The scenario and machine a holder name names (machineHolder), or undefined for a sandbox's. */
export function machineOf(holder: string): { sid: string; index: number; copy: MachineCopy } | undefined {
  const m = /^scenario:([^:]+):([sx]?)(\d+)$/.exec(holder);
  return m ? { sid: m[1]!, index: Number(m[3]), copy: COPY_OF[m[2]!]! } : undefined;
}

/** The ranges scenario `sid` holds for one copy of its machines, machine index → first id. */
export async function scenarioRanges(
  home: string,
  sid: string,
  copy: MachineCopy = 'live',
): Promise<Map<number, number>> {
  const out = new Map<number, number>();
  for (const [base, id] of await rangesOf(home)) {
    const m = machineOf(id);
    if (m?.sid === sid && m.copy === copy) out.set(m.index, base);
  }
  return out;
}

/** Every range scenario `sid` holds, whichever copy: base → holder. */
export async function allScenarioRanges(home: string, sid: string): Promise<Map<number, string>> {
  return new Map([...(await rangesOf(home))].filter(([, id]) => machineOf(id)?.sid === sid));
}

/**
 * Hand the range at `base` from holder `from` to holder `to` of the same home (a swap makes the
 * standby's machines the live ones): the claim file is replaced whole (rename), never absent.
 * Nothing is done when `from` does not hold it (already handed over: a swap finished twice).
 */
export async function relabelRange(base: number, home: string, from: string, to: string): Promise<void> {
  const path = join(REGISTRY, String(base));
  const h = await readFile(path, 'utf8').then(parseHolder, () => undefined);
  if (!h || !sameHome(h.home, home) || h.id !== from) return;
  const tmp = tmpName();
  await writeFile(tmp, JSON.stringify({ ...h, id: to, pid: process.pid }), { mode: 0o600 });
  await rename(tmp, path);
}
