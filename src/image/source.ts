/**
 * The image source contract (issue #29, DESIGN.md "backends"): every way an image's root tree is
 * made (the built-in busybox, a Debian build, an archive import) is an ImageSource, held to one
 * suite (src/image/contract.test.ts), as drivers and storage backends are. The lab names no kind:
 * it plans, then produces through `produceImage`, then records.
 */
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { noted } from '../cleanup.js';
import type { Availability } from '../host/probe-types.js';
import type { Feature } from '../host/tools.js';
import { removeTree } from '../storage/tree.js';
import type { Trace } from '../timing/trace.js';
import type { Compression } from './decompress.js';
import type { ImageConfig } from './oci.js';
import { initOf, skeleton } from './skeleton.js';

/** Where an image came from and what it was made of; kept with the image (`image inspect`). */
export interface Provenance {
  kind: 'builtin' | 'rootfs' | 'directory' | 'oci' | 'docker-archive' | 'debian';
  source: string;
  ref?: string;
  manifestDigest?: string;
  configDigest?: string;
  layers?: { digest: string; diffId: string; compression: Compression; bytes: number }[];
  /** what the import left out, and why */
  notes: string[];
  /** for built images: what it was built from */
  build?: Record<string, unknown>;
  /** the image's own init, found in its tree: machines of it boot it by default (--init) */
  init?: 'systemd';
}

/** What a source made besides the tree. */
export interface Produced {
  provenance: Provenance;
  /** the image's run config (OCI and docker images) */
  config?: ImageConfig;
}

export interface ProduceOptions {
  /** the image's name (a Debian tree's hostname is its image's name) */
  name: string;
  trace?: Trace;
  /** an abort rejects with the signal's reason once the step under way stops, leaving nothing running */
  signal?: AbortSignal;
  onProgress?: (s: string) => void;
}

/** Where `produce` works: both directories exist and are empty, and are the caller's to remove. */
export interface ProduceInto extends ProduceOptions {
  /** the image's root tree */
  root: string;
  /** for the source's own temporary files (a decompressed archive, mmdebstrap's sources) */
  scratch: string;
}

/** A checked input: what the image will be recorded as, and how to make it. */
export interface ImagePlan {
  /** what the image record names as its source */
  readonly source: string;
  /** the same key, the same tree: a build cache may copy an image of this key instead (none: not cached) */
  readonly buildKey?: string;
  /**
   * Fill `into.root`. Failure is a SnaplabError with a hint; on failure or abort nothing the
   * source started runs on and nothing is left mounted under `root` (the caller removes the tree).
   */
  produce(into: ProduceInto): Promise<Produced>;
}

export interface ImageSource<Input, Plan extends ImagePlan = ImagePlan> {
  /** a name for messages and the contract suite; the lab does not branch on it */
  readonly kind: string;
  /** the host programs it runs: host/tools.json's entries for this feature */
  readonly feature: Feature;
  /** whether it can work on this host, with the reason, and the fix when not */
  probe(): Promise<Availability>;
  /** Check `input` and settle what it names; throws a SnaplabError (code and hint) before anything is made. */
  plan(input: Input): Promise<Plan>;
}

/**
 * Produce `plan`'s image in `dir` (made here; its parent must exist): `dir/rootfs` is the tree,
 * with the directories every image gets (skeleton) and the facts read from it (its own init).
 * On failure or abort, `dir` is gone when this rejects.
 */
export async function produceImage(plan: ImagePlan, dir: string, opts: ProduceOptions): Promise<Produced> {
  opts.signal?.throwIfAborted();
  const root = join(dir, 'rootfs');
  const scratch = join(dir, 'scratch');
  await mkdir(root, { recursive: true });
  try {
    await mkdir(scratch);
    const got = await plan.produce({ ...opts, root, scratch });
    await removeTree(scratch);
    await skeleton(root);
    const init = await initOf(root);
    if (init) got.provenance.init = init;
    return got;
  } catch (e) {
    // what is mounted there stays (removeTree refuses), and gc tries again
    await removeTree(dir).catch(noted(`remove ${dir}`, 'ENOENT'));
    throw e;
  }
}

/** `trace.phase`, or just `fn` when there is no trace. */
export function phase<T>(trace: Trace | undefined, name: string, fn: () => Promise<T>): Promise<T> {
  return trace ? trace.phase(name, fn) : fn();
}
