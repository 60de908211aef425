import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { realpath, stat } from 'node:fs/promises';
import { join, sep } from 'node:path';
import { SnaplabError } from '../errors.js';
import { indexTar, memberName, type TarMember } from './tar-index.js';
import type { FileRange } from './unpack.js';
import { readAt } from './read-at.js';

/** What `docker run` takes from an image's config, kept with the image. */
export interface ImageConfig {
  env: string[];
  workingDir?: string;
  user?: string;
  entrypoint?: string[];
  cmd?: string[];
  labels: Record<string, string>;
  stopSignal?: string;
  exposedPorts?: string[];
}

/** One layer to apply, in order, with what it must hash to. */
export interface LayerRef {
  name: string;
  /** digest of the stored blob, where the archive names one */
  digest?: string;
  diffId: string;
}

export interface ResolvedImage {
  format: 'oci' | 'docker-archive';
  /** the tag or ref name the image was picked by, if it had one */
  ref?: string;
  manifestDigest?: string;
  configDigest: string;
  architecture?: string;
  os?: string;
  created?: string;
  config: ImageConfig;
  layers: LayerRef[];
}

/** Read access to an image archive's members: a directory, or an uncompressed tar read in place. */
export interface Blobs {
  has(name: string): boolean;
  range(name: string): Promise<FileRange>;
  read(name: string, limit: number): Promise<Buffer>;
}

const MAX_JSON = 4 << 20;
const DIGEST = /^sha256:[0-9a-f]{64}$/;

const badImage = (msg: string, cause?: unknown): SnaplabError =>
  new SnaplabError(
    'BAD_IMAGE',
    msg,
    'give a `docker save` tarball or an OCI image layout (`skopeo copy … oci:DIR` writes one)',
    cause === undefined ? undefined : { cause },
  );

export async function tarBlobs(file: string): Promise<Blobs> {
  const members = await indexTar(file);
  const get = (name: string): TarMember => {
    const m = members.get(memberName(name));
    if (!m) throw badImage(`the archive has no ${name}`);
    return m;
  };
  return {
    has: (name) => members.has(memberName(name)),
    range: async (name) => ({ file, ...get(name) }),
    read: async (name, limit) => {
      const m = get(name);
      if (m.size > limit) throw badImage(`${name} is ${m.size} bytes, over the limit of ${limit} for a JSON document`);
      return readAt(file, m.offset, m.size);
    },
  };
}

/** A layout directory: names resolve inside it, links in it are not followed out of it. */
export async function dirBlobs(dir: string): Promise<Blobs> {
  const root = await realpath(dir);
  const path = (name: string): string => join(root, memberName(name));
  const inside = async (name: string): Promise<string> => {
    const p = await realpath(path(name)).catch((e: unknown) => {
      throw badImage(`the layout has no ${name}`, e);
    });
    if (!p.startsWith(root + sep))
      throw new SnaplabError(
        'IMAGE_UNSAFE',
        `${name} in ${dir} leads outside the layout`,
        'an image layout must hold its own blobs',
      );
    return p;
  };
  return {
    has: (name) => existsSync(path(name)),
    range: async (name) => ({ file: await inside(name) }),
    read: async (name, limit) => {
      const p = await inside(name);
      const st = await stat(p);
      if (st.size > limit)
        throw badImage(`${name} is ${st.size} bytes, over the limit of ${limit} for a JSON document`);
      return readAt(p, 0, st.size);
    },
  };
}

const sha256 = (b: Buffer): string => `sha256:${createHash('sha256').update(b).digest('hex')}`;

async function json<T>(blobs: Blobs, name: string, digest?: string): Promise<T> {
  const b = await blobs.read(name, MAX_JSON);
  if (digest && sha256(b) !== digest) {
    throw new SnaplabError(
      'IMAGE_DIGEST_MISMATCH',
      `${name} does not match its digest ${digest}`,
      'the archive is corrupt or was altered; export it again',
    );
  }
  try {
    return JSON.parse(b.toString('utf8')) as T;
  } catch (e) {
    throw badImage(`${name} is not valid JSON`, e);
  }
}

const blobName = (digest: string): string => {
  if (!DIGEST.test(digest)) throw badImage(`unsupported or malformed digest ${JSON.stringify(digest).slice(0, 100)}`);
  return `blobs/sha256/${digest.slice(7)}`;
};

/** `blobs/sha256/<hex>` and `<hex>.json` name their own digest. */
const digestOfName = (name: string): string | undefined => {
  const m = /^(?:blobs\/sha256\/([0-9a-f]{64})|([0-9a-f]{64})\.json)$/.exec(memberName(name));
  return m ? `sha256:${m[1] ?? m[2]}` : undefined;
};

interface Descriptor {
  mediaType?: string;
  digest: string;
  size?: number;
  platform?: { os?: string; architecture?: string; variant?: string };
  annotations?: Record<string, string>;
}

interface RawConfig {
  architecture?: string;
  os?: string;
  created?: string;
  config?: {
    Env?: string[];
    WorkingDir?: string;
    User?: string;
    Entrypoint?: string[] | null;
    Cmd?: string[] | null;
    Labels?: Record<string, string> | null;
    StopSignal?: string;
    ExposedPorts?: Record<string, unknown>;
  };
  rootfs?: { type?: string; diff_ids?: string[] };
}

/** The host's architecture as OCI names it. */
export function hostArch(): string {
  return (
    (
      {
        x64: 'amd64',
        arm64: 'arm64',
        arm: 'arm',
        ia32: '386',
        ppc64: 'ppc64le',
        s390x: 's390x',
        riscv64: 'riscv64',
      } as Record<string, string>
    )[process.arch] ?? process.arch
  );
}

function configOf(
  raw: RawConfig,
  configDigest: string,
  layerNames: { name: string; digest?: string }[],
): Omit<ResolvedImage, 'format'> {
  const diffIds = raw.rootfs?.diff_ids ?? [];
  if (diffIds.length !== layerNames.length) {
    throw badImage(
      `the config lists ${diffIds.length} layer digests (diff_ids) but the manifest ${layerNames.length} layers`,
    );
  }
  for (const d of diffIds) if (!DIGEST.test(d)) throw badImage(`malformed diff_id ${JSON.stringify(d).slice(0, 100)}`);
  const c = raw.config ?? {};
  const strings = (v: unknown): string[] | undefined =>
    Array.isArray(v) && v.every((x) => typeof x === 'string') ? v : undefined;
  return {
    configDigest,
    architecture: raw.architecture,
    os: raw.os,
    created: raw.created,
    config: {
      env: strings(c.Env) ?? [],
      workingDir: c.WorkingDir || undefined,
      user: c.User || undefined,
      entrypoint: strings(c.Entrypoint),
      cmd: strings(c.Cmd),
      labels: c.Labels && typeof c.Labels === 'object' ? c.Labels : {},
      stopSignal: c.StopSignal || undefined,
      exposedPorts: c.ExposedPorts ? Object.keys(c.ExposedPorts) : undefined,
    },
    layers: layerNames.map((l, i) => ({ ...l, diffId: diffIds[i]! })),
  };
}

function checkPlatform(raw: RawConfig, what: string): void {
  if ((raw.os && raw.os !== 'linux') || (raw.architecture && raw.architecture !== hostArch())) {
    throw new SnaplabError(
      'BAD_IMAGE',
      `${what} is for ${raw.os}/${raw.architecture}, this host runs linux/${hostArch()}`,
      'export the image for this platform (docker save --platform, skopeo --override-arch)',
    );
  }
}

/** `docker save`: manifest.json, legacy (`<id>/layer.tar`) or Docker 25+ (`blobs/sha256/…`). */
async function dockerArchive(blobs: Blobs, tag?: string): Promise<ResolvedImage> {
  const list = await json<{ Config: string; RepoTags?: string[] | null; Layers: string[] }[]>(blobs, 'manifest.json');
  if (!Array.isArray(list) || list.length === 0) throw badImage('manifest.json lists no image');
  const tags = (e: (typeof list)[number]): string[] => e.RepoTags ?? [];
  const matches =
    tag === undefined
      ? list
      : list.filter((e) => tags(e).some((t) => t === tag || t.endsWith(`/${tag}`) || t === `${tag}:latest`));
  if (matches.length !== 1) {
    const all = list.flatMap(tags);
    throw new SnaplabError(
      'BAD_INPUT',
      tag === undefined ? `the archive holds ${list.length} images` : `no image tagged ${tag} in the archive`,
      `pick one with --tag (${all.join(', ') || 'untagged'})`,
    );
  }
  const m = matches[0]!;
  if (typeof m.Config !== 'string' || !Array.isArray(m.Layers))
    throw badImage('manifest.json is not a docker save manifest');
  const configDigest = digestOfName(m.Config) ?? sha256(await blobs.read(m.Config, MAX_JSON));
  const raw = await json<RawConfig>(blobs, m.Config, configDigest);
  checkPlatform(raw, 'the image');
  return {
    format: 'docker-archive',
    ref: tags(m)[0],
    ...configOf(
      raw,
      configDigest,
      m.Layers.map((name) => ({ name, digest: digestOfName(name) })),
    ),
  };
}

const INDEX_TYPES = new Set([
  'application/vnd.oci.image.index.v1+json',
  'application/vnd.docker.distribution.manifest.list.v2+json',
]);
const MANIFEST_TYPES = new Set([
  'application/vnd.oci.image.manifest.v1+json',
  'application/vnd.docker.distribution.manifest.v2+json',
]);
const REF = (d: Descriptor): string | undefined =>
  d.annotations?.['org.opencontainers.image.ref.name'] ?? d.annotations?.['io.containerd.image.name'];

/** An OCI image layout: index.json, nested indexes, one manifest for linux/<host arch>. */
async function ociLayout(blobs: Blobs, tag?: string): Promise<ResolvedImage> {
  const top = await json<{ manifests?: Descriptor[] }>(blobs, 'index.json');
  let candidates = top.manifests ?? [];
  if (tag !== undefined) {
    candidates = candidates.filter((d) => {
      const r = REF(d);
      return r === tag || r?.endsWith(`:${tag}`) || r?.endsWith(`/${tag}`);
    });
    if (!candidates.length) {
      throw new SnaplabError(
        'BAD_INPUT',
        `no image named ${tag} in the layout`,
        `its names: ${(top.manifests ?? []).map(REF).filter(Boolean).join(', ') || 'none'}`,
      );
    }
  }
  const found: {
    desc: Descriptor;
    manifest: { config: Descriptor; layers: Descriptor[] };
    raw: RawConfig;
    ref?: string;
  }[] = [];
  const walk = async (descs: Descriptor[], ref: string | undefined, depth: number): Promise<void> => {
    if (depth > 4) throw badImage('indexes nest deeper than 4');
    for (const d of descs) {
      const p = d.platform;
      if (p && (p.os !== 'linux' || p.architecture !== hostArch())) continue; // another platform, or an attestation (unknown/unknown)
      const doc = await json<{
        mediaType?: string;
        manifests?: Descriptor[];
        config?: Descriptor;
        layers?: Descriptor[];
      }>(blobs, blobName(d.digest), d.digest);
      const type = d.mediaType ?? doc.mediaType;
      if ((type && INDEX_TYPES.has(type)) || doc.manifests) {
        await walk(doc.manifests ?? [], ref ?? REF(d), depth + 1);
      } else if ((!type || MANIFEST_TYPES.has(type)) && doc.config && Array.isArray(doc.layers)) {
        const raw = await json<RawConfig>(blobs, blobName(doc.config.digest), doc.config.digest);
        if ((raw.os ?? 'linux') !== 'linux' || (raw.architecture ?? hostArch()) !== hostArch()) continue;
        found.push({ desc: d, manifest: { config: doc.config, layers: doc.layers }, raw, ref: ref ?? REF(d) });
      }
    }
  };
  await walk(candidates, undefined, 0);
  if (found.length === 0)
    throw new SnaplabError(
      'BAD_IMAGE',
      `the layout has no image for linux/${hostArch()}`,
      'export the image for this platform',
    );
  if (found.length > 1) {
    throw new SnaplabError(
      'BAD_INPUT',
      `the layout holds ${found.length} images for linux/${hostArch()}`,
      `pick one with --tag (${found.map((f) => f.ref ?? f.desc.digest.slice(0, 19)).join(', ')})`,
    );
  }
  const f = found[0]!;
  const layers = f.manifest.layers.map((l) => ({ name: blobName(l.digest), digest: l.digest }));
  return {
    format: 'oci',
    ref: f.ref,
    manifestDigest: f.desc.digest,
    ...configOf(f.raw, f.manifest.config.digest, layers),
  };
}

/** Which image an archive holds, and everything needed to apply and check its layers. */
export async function resolveImage(blobs: Blobs, tag?: string): Promise<ResolvedImage> {
  if (blobs.has('manifest.json')) return dockerArchive(blobs, tag);
  if (blobs.has('index.json')) return ociLayout(blobs, tag);
  throw badImage('neither manifest.json (docker save) nor index.json (OCI layout) is in it');
}
