import { join } from 'node:path';
import type { Availability } from '../../host/probe-types.js';
import { run } from '../../host/run.js';
import { toolsVerdict } from '../../host/tools.js';
import { noted, orElse } from '../../cleanup.js';
import { buildKey, checkSpec, type DebianSpec, fixUp, hostSources, sourcesFor } from '../debian.js';
import { runMmdebstrap } from '../mmdebstrap.js';
import { useCache } from '../package-cache.js';
import type { ImagePlan, ImageSource, ProduceInto, Produced } from '../source.js';

export interface DebianInput {
  spec: DebianSpec;
  /** where mmdebstrap's log is kept (named by the build key), for the user to read after a failure */
  logDir: string;
  /** Debian packages kept between builds (package-cache.ts); none: every package is fetched */
  packageCache?: string;
}

export interface DebianPlan extends ImagePlan {
  /** the spec as checked: packages sorted, each once */
  readonly spec: DebianSpec;
  readonly buildKey: string;
  /** mmdebstrap's log */
  readonly log: string;
  readonly packageCache?: string;
}

async function produce(plan: DebianPlan, sources: string, into: ProduceInto): Promise<Produced> {
  const { spec } = plan;
  const v = await run('mmdebstrap', ['--version'], { allowFail: true }).catch(
    orElse({ stdout: '', stderr: '', code: 1 }, 'mmdebstrap --version', 'ENOENT'),
  );
  const version = `${v.stdout}${v.stderr}`.trim();
  const asked = plan.packageCache ? await useCache(plan.packageCache, spec.suite) : undefined;
  if (asked && 'off' in asked) into.onProgress?.(`package cache not used: ${asked.off}`);
  const cache = asked && 'args' in asked ? asked : undefined;
  try {
    await runMmdebstrap(into.root, spec, sources, into.scratch, plan.log, into.onProgress, into.signal, cache?.args);
  } catch (e) {
    await cache?.drop().catch(noted("remove the build's package cache directory"));
    throw e;
  }
  // the image is built: a cache that cannot keep its packages costs the next build a download only
  const kept = await cache?.keep().catch(orElse(0, 'keep the packages in the package cache'));
  if (kept) into.onProgress?.(`kept ${kept} new packages in the package cache`);
  into.onProgress?.('fixing up the tree for machines');
  await fixUp(into.root, into.name);
  const build = {
    suite: spec.suite,
    variant: spec.variant,
    packages: spec.packages,
    ...(spec.user ? { user: spec.user } : {}),
    mirror: spec.mirror ?? 'host apt sources',
    key: plan.buildKey,
    mmdebstrap: version,
  };
  return { provenance: { kind: 'debian', source: `mmdebstrap ${spec.suite}`, build, notes: [] } };
}

/**
 * A Debian tree from Debian's archive (mmdebstrap), from the host's apt sources or one mirror.
 * The build key is everything that decides what the build makes (the lab caches by it).
 */
export const debianSource: ImageSource<DebianInput, DebianPlan> = {
  kind: 'debian',
  feature: 'image-build',
  async probe(): Promise<Availability> {
    return (await toolsVerdict('image-build', 'image build')) ?? { ok: true, reason: 'mmdebstrap found' };
  },
  async plan({ spec: input, logDir, packageCache }: DebianInput): Promise<DebianPlan> {
    const spec = checkSpec(input);
    const sources = sourcesFor(spec, spec.mirror ? [] : await hostSources());
    const key = buildKey(spec, sources);
    const plan: DebianPlan = {
      source: `debian:${spec.suite}`,
      spec,
      buildKey: key,
      log: join(logDir, `${key.slice(0, 16)}.log`),
      packageCache,
      produce: (into) => produce(plan, sources, into),
    };
    return plan;
  },
};
