import list from './tools.json' with { type: 'json' };
import type { Availability } from './probe-types.js';
import { which } from './run.js';

/** What a host program is needed for: a driver, a storage backend, a feature, or set-up itself. */
export type Feature =
  | 'namespaces'
  | 'qemu'
  | 'btrfs'
  | 'overlay'
  | 'disk-cap'
  | 'dir'
  | 'busybox-image'
  | 'image'
  | 'image-build'
  | 'scenario'
  | 'egress'
  | 'ssh'
  | 'build'
  | 'test'
  | 'bench'
  | 'cluster';

/**
 * One entry of the list of host programs snaplab runs (tools.json): the program, the Debian
 * package that provides it, and what needs it. The one list: scripts/setup.sh installs from it,
 * doctor and the probes check it, and tools.test.ts fails when the source runs a program it
 * does not name.
 */
export interface HostTool {
  /** the command as run (looked up on PATH); absent for a package that is a library */
  program?: string;
  package: string;
  for: Feature[];
  why: string;
  /** snaplab works without it (a fallback exists); probes do not fail on it */
  optional?: boolean;
  /** false: named (it is run where present) but not installed by set-up */
  install?: boolean;
  /** run by another program, not by snaplab directly (npm runs gcc and make) */
  via?: string;
}

export const HOST_TOOLS: readonly HostTool[] = list as HostTool[];

/** The required programs for `feature` that are not on PATH. */
export async function missingTools(feature: Feature): Promise<HostTool[]> {
  const needed = HOST_TOOLS.filter((t) => t.program && !t.optional && t.for.includes(feature));
  const found = await Promise.all(needed.map((t) => which(t.program!)));
  return needed.filter((_, i) => !found[i]);
}

/** `apt-get install …` for the packages of `tools`, each named once. */
export function installFix(tools: readonly HostTool[]): string {
  return `apt-get install ${[...new Set(tools.map((t) => t.package))].join(' ')}`;
}

/**
 * A probe's verdict on the programs `feature` needs: undefined when all are there, else not ok,
 * naming each missing program and its package, with the install command as the fix.
 */
export async function toolsVerdict(feature: Feature, what: string): Promise<Availability | undefined> {
  const missing = await missingTools(feature);
  if (missing.length === 0) return undefined;
  const names = missing.map((t) => `${t.program} (${t.package}: ${t.why})`).join('; ');
  return { ok: false, reason: `${what} needs programs that are not installed: ${names}`, fix: installFix(missing) };
}
