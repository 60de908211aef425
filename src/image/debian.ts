import { createHash } from 'node:crypto';
import { lstat, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SnaplabError } from '../errors.js';
import { orElse } from '../cleanup.js';

/** What a Debian image is built from; the build cache's key is the hash of all of it. */
export interface DebianSpec {
  suite: string;
  variant: string;
  packages: string[];
  /** one mirror URL instead of the host's apt sources */
  mirror?: string;
  /**
   * a login user made beside root, as E2B's templates have one: uid 1000, home /home/NAME, shell
   * /bin/bash, passwordless sudo (sudo must be among the packages)
   */
  user?: string;
}

export const VARIANTS = [
  'extract',
  'custom',
  'essential',
  'apt',
  'required',
  'minbase',
  'buildd',
  'important',
  'debootstrap',
  'standard',
];

const SUITE = /^[a-z][a-z0-9.-]{1,40}$/;
const PACKAGE = /^[a-z0-9][a-z0-9+.-]+$/;
/** Debian's adduser's default NAME_REGEX, and never root */
const USER = /^[a-z][a-z0-9_-]{0,30}$/;

export function checkSpec(s: DebianSpec): DebianSpec {
  if (!SUITE.test(s.suite))
    throw new SnaplabError(
      'BAD_INPUT',
      `invalid suite ${JSON.stringify(s.suite)}`,
      'a Debian codename or suite: bookworm, trixie, stable, sid',
    );
  if (!VARIANTS.includes(s.variant))
    throw new SnaplabError(
      'BAD_INPUT',
      `unknown variant ${JSON.stringify(s.variant)}`,
      `one of ${VARIANTS.join(', ')}`,
    );
  for (const p of s.packages) {
    if (!PACKAGE.test(p))
      throw new SnaplabError(
        'BAD_INPUT',
        `invalid package name ${JSON.stringify(p)}`,
        'Debian package names: lower case letters, digits, + - .',
      );
  }
  if (s.user !== undefined && (!USER.test(s.user) || s.user === 'root'))
    throw new SnaplabError(
      'BAD_INPUT',
      `invalid user name ${JSON.stringify(s.user)}`,
      'a login name other than root: lower case letters, digits, _ and -, starting with a letter',
    );
  if (s.mirror !== undefined && !/^(https?|file):\/\/[^\s]+$/.test(s.mirror)) {
    throw new SnaplabError(
      'BAD_INPUT',
      `invalid mirror ${JSON.stringify(s.mirror)}`,
      'a URL: http://deb.debian.org/debian, file:///srv/mirror',
    );
  }
  return { ...s, packages: [...new Set(s.packages)].sort() };
}

interface Source {
  uris: string[];
  suites: string[];
  components: string[];
  signedBy?: string;
}

/** Debian's one-line sources.list entries and deb822 .sources stanzas (binary entries only). */
export function parseSources(text: string, deb822: boolean): Source[] {
  const out: Source[] = [];
  if (!deb822) {
    for (const raw of text.split('\n')) {
      const line = raw.replace(/#.*/, '').trim();
      const m = /^deb\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)\s*(.*)$/.exec(line);
      if (!m) continue;
      const signedBy = /signed-by=(\S+)/.exec(m[1] ?? '')?.[1];
      out.push({ uris: [m[2]!], suites: [m[3]!], components: m[4]!.split(/\s+/).filter(Boolean), signedBy });
    }
    return out;
  }
  for (const stanza of text.split(/\n\s*\n/)) {
    const f = new Map<string, string>();
    let key = '';
    for (const raw of stanza.split('\n')) {
      if (raw.startsWith('#')) continue;
      if (/^\s/.test(raw) && key) f.set(key, `${f.get(key)} ${raw.trim()}`);
      else {
        const m = /^([A-Za-z-]+):\s*(.*)$/.exec(raw);
        if (m) f.set((key = m[1]!.toLowerCase()), m[2]!.trim());
      }
    }
    if (!(f.get('types') ?? '').split(/\s+/).includes('deb') || /^no$/i.test(f.get('enabled') ?? '')) continue;
    const words = (k: string): string[] => (f.get(k) ?? '').split(/\s+/).filter(Boolean);
    out.push({
      uris: words('uris'),
      suites: words('suites'),
      components: words('components'),
      signedBy: f.get('signed-by'),
    });
  }
  return out;
}

/** The host's apt sources (/etc/apt/sources.list and sources.list.d). */
export async function hostSources(etcApt = '/etc/apt'): Promise<Source[]> {
  const out: Source[] = [];
  const main = await readFile(join(etcApt, 'sources.list'), 'utf8').catch(orElse('', 'readFile', 'ENOENT'));
  out.push(...parseSources(main, false));
  for (const f of (
    await readdir(join(etcApt, 'sources.list.d')).catch(orElse([] as string[], 'readdir', 'ENOENT'))
  ).sort()) {
    if (!/\.(list|sources)$/.test(f)) continue;
    const text = await readFile(join(etcApt, 'sources.list.d', f), 'utf8').catch(orElse('', 'readFile', 'ENOENT'));
    out.push(...parseSources(text, f.endsWith('.sources')));
  }
  return out;
}

/** Suites with no -updates and -security companions. */
const ROLLING = new Set(['sid', 'unstable', 'experimental', 'rc-buggy']);

/**
 * The sources.list (deb822) a build uses and that stays in the image: the host's Debian
 * entries with their codename swapped for the suite asked for (bookworm-updates becomes
 * trixie-updates), or one mirror URL.
 */
export function sourcesFor(spec: DebianSpec, host: Source[]): string {
  const stanza = (uris: string[], suites: string[], components: string[], signedBy?: string): string =>
    [
      `Types: deb`,
      `URIs: ${uris.join(' ')}`,
      `Suites: ${suites.join(' ')}`,
      `Components: ${components.join(' ')}`,
      ...(signedBy ? [`Signed-By: ${signedBy}`] : []),
    ].join('\n');
  if (spec.mirror) return `${stanza([spec.mirror], [spec.suite], ['main'])}\n`;
  // the host's own codename: the suite of its first entry without a dash (bookworm, not bookworm-updates)
  const codename = host.flatMap((s) => s.suites).find((s) => !s.includes('-'));
  const debian = host.filter((s) => s.uris.some((u) => /debian/.test(u)));
  if (!codename || debian.length === 0) {
    throw new SnaplabError(
      'BAD_INPUT',
      'this host has no Debian apt sources to build from',
      'pass --mirror URL (e.g. http://deb.debian.org/debian)',
    );
  }
  const stanzas: string[] = [];
  for (const s of debian) {
    const suites = s.suites
      .filter((x) => x === codename || x.startsWith(`${codename}-`))
      .map((x) => spec.suite + x.slice(codename.length))
      .filter((x) => x === spec.suite || (!ROLLING.has(spec.suite) && /-(updates|security)$/.test(x)));
    if (suites.length) stanzas.push(stanza(s.uris, suites, s.components, s.signedBy));
  }
  return `${stanzas.join('\n\n')}\n`;
}

/** The cache key: everything that decides what the build makes. */
export function buildKey(spec: DebianSpec, sources: string): string {
  // (the user only when there is one: the keys of builds without one stay as they were)
  const { suite, variant, packages } = spec;
  const user = spec.user === undefined ? {} : { user: spec.user };
  return createHash('sha256')
    .update(JSON.stringify({ v: 1, suite, variant, packages, sources, ...user }))
    .digest('hex');
}

export function defaultName(spec: DebianSpec, key: string): string {
  return `debian-${spec.suite}${spec.variant === 'minbase' ? '' : `-${spec.variant}`}${spec.packages.length ? `-${key.slice(0, 8)}` : ''}`;
}

/**
 * Make the tree fit to be a machine: its own empty machine-id (systemd makes one at first boot),
 * its own hostname, and no copy of the build host's resolv.conf or hostname. Nothing is followed:
 * a symlink where one of these files should be is replaced.
 */
export async function fixUp(root: string, hostname: string): Promise<void> {
  const replace = async (rel: string, text: string | undefined): Promise<void> => {
    const p = join(root, rel);
    const st = await lstat(p).catch(orElse(undefined, `lstat ${p}`, 'ENOENT'));
    if (st && !st.isDirectory()) await rm(p);
    if (text !== undefined) await writeFile(p, text, { flag: 'wx', mode: 0o644 });
  };
  await replace('etc/machine-id', '');
  await replace('etc/hostname', `${hostname}\n`);
  await replace('etc/resolv.conf', undefined);
}
