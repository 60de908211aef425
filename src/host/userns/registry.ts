import { randomBytes, randomInt } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { link, mkdir, readdir, readFile, rename, stat, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SnaplabError } from '../../errors.js';
import { USERNS_SIZE, USERNS_SLOTS, slotBase } from './id-ranges.js';
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

let named: number[] | undefined;
/** uids and gids the host's account files name (a range must not contain a real account). */
function hostIds(): number[] {
  if (named) return named;
  const ids: number[] = [];
  for (const f of ['/etc/passwd', '/etc/group']) {
    let text = '';
    try {
      text = readFileSync(f, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n')) {
      const n = Number(line.split(':')[2]);
      if (Number.isInteger(n) && n >= 0x7000_0000) ids.push(n);
    }
  }
  named = ids;
  return named;
}

const overlaps = (base: number, lo: number, hi: number): boolean => base <= hi && base + USERNS_SIZE - 1 >= lo;

/** The ranges no one may have: they hold an account, or systemd's foreign range. */
function unusable(base: number): boolean {
  return overlaps(base, FOREIGN[0], FOREIGN[1]) || hostIds().some((id) => overlaps(base, id, id));
}

/**
 * Claim a free range for sandbox `id` of `home`: drawn at random among the free ones, so that
 * concurrent claims seldom meet; one that another claimed first is skipped.
 */
export async function claimRange(home: string, id: string): Promise<number> {
  await mkdir(REGISTRY, { recursive: true, mode: 0o700 });
  const taken = new Set(await readdir(REGISTRY));
  const free: number[] = [];
  for (let n = 0; n < USERNS_SLOTS; n++) {
    const base = slotBase(n);
    if (!taken.has(String(base)) && !unusable(base)) free.push(base);
  }
  const holder: Holder = { home, id, pid: process.pid };
  // written whole first, then linked into place (link fails if the name exists): no reader, and no
  // crash, ever leaves a claim without its holder
  const tmp = join(REGISTRY, `.tmp-${process.pid}-${randomBytes(4).toString('hex')}`);
  await writeFile(tmp, JSON.stringify(holder), { mode: 0o600 });
  try {
    while (free.length) {
      const i = randomInt(free.length);
      const base = free[i]!;
      try {
        await link(tmp, join(REGISTRY, String(base)));
        return base;
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
        free[i] = free[free.length - 1]!;
        free.pop();
      }
    }
  } finally {
    await unlink(tmp).catch(noted(`remove ${tmp}`, 'ENOENT'));
  }
  throw new SnaplabError(
    'NO_USERNS_SLOT',
    `every user namespace range is in use (${USERNS_SLOTS} on this host)`,
    'remove sandboxes (`snaplab rm`, `snaplab gc`), or use --no-userns',
  );
}

/**
 * Give back the range at `base` if `home`'s `id` still holds it: a stale caller (a record read
 * hours ago, a second release of the same range) must not free a claim someone else made since.
 */
export async function releaseRange(base: number, home: string, id: string): Promise<void> {
  const path = join(REGISTRY, String(base));
  const h = await readFile(path, 'utf8').then(parseHolder, () => undefined);
  if (h?.home !== home || h.id !== id) return;
  await unlink(path).catch(noted(`release uid range ${path}`, 'ENOENT'));
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
 * Claims a process began and never linked into place: it died between creating its `.tmp-PID-…`
 * file and removing it (a test worker torn down mid-create left empty ones). Removed once that
 * pid is gone; they hold no range.
 */
export async function removeDeadClaimWrites(): Promise<string[]> {
  const removed: string[] = [];
  for (const f of await readdir(REGISTRY).catch(orElse([] as string[], 'readdir', 'ENOENT'))) {
    const m = /^\.tmp-(\d+)-/.exec(f);
    if (!m || (await pidAlive(Number(m[1])))) continue;
    await unlink(join(REGISTRY, f)).catch(noted(`remove stale ${f}`, 'ENOENT'));
    removed.push(join(REGISTRY, f));
  }
  return removed;
}

interface Claim extends Holder {
  base: number;
  ageMs: number;
}

async function claims(): Promise<Claim[]> {
  const out: Claim[] = [];
  for (const f of await readdir(REGISTRY).catch(orElse([] as string[], 'readdir', 'ENOENT'))) {
    const path = join(REGISTRY, f);
    if (!/^\d+$/.test(f)) continue; // a claim being written (.tmp-…)
    const h = await readFile(path, 'utf8').then(parseHolder, () => undefined);
    const age = await stat(path).then(
      (st) => Date.now() - st.mtimeMs,
      () => 0,
    );
    if (h) out.push({ ...h, base: Number(f), ageMs: age });
  }
  return out;
}

/** The ranges `home` holds in the registry, first id → holder (a sandbox id, or a scenario machine's). */
export async function rangesOf(home: string): Promise<Map<number, string>> {
  return new Map((await claims()).filter((c) => c.home === home).map((c) => [c.base, c.id]));
}

/**
 * The claims gc may give back: `home`'s whose holder `isHeld` denies, unless the claim is young and
 * its claimer alive, this process included (a create claims its range a moment before it writes
 * its record); and any home's that no longer exists, once nothing of the holder runs (`running`).
 */
export async function staleClaims(
  home: string,
  isHeld: (id: string) => boolean,
  running: (id: string) => boolean,
  graceMs: number,
): Promise<Claim[]> {
  const stale: Claim[] = [];
  for (const c of await claims()) {
    if (c.home === home) {
      if (isHeld(c.id)) continue;
      if (c.ageMs < graceMs && c.pid !== undefined && (await pidAlive(c.pid))) continue;
      stale.push(c);
    } else if (!existsSync(c.home) && !running(c.id)) stale.push(c);
  }
  return stale;
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
  if (h?.home !== home || h.id !== from) return;
  const tmp = join(REGISTRY, `.tmp-${process.pid}-${randomBytes(4).toString('hex')}`);
  await writeFile(tmp, JSON.stringify({ ...h, id: to, pid: process.pid }), { mode: 0o600 });
  await rename(tmp, path);
}
