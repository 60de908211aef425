/**
 * Image archives written by the tests themselves, entry by entry: tar layers (including hostile
 * ones no tar program would write), OCI image layouts and `docker save` tarballs.
 */
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';

export interface Entry {
  name: string;
  type?: 'file' | 'dir' | 'symlink' | 'link' | 'fifo' | 'char';
  data?: string | Buffer;
  mode?: number;
  uid?: number;
  gid?: number;
  mtime?: number;
  /** symlink or hard link target */
  link?: string;
  xattrs?: Record<string, Buffer | string>;
  /** a pax `path` record (names past ustar's 255 bytes) */
  pax?: boolean;
  /** the size in a pax record only, the header's size field 0 (Go's archive/tar past 8 GiB) */
  paxSize?: boolean;
  /** more pax records, in a second pax header of their own */
  extraPax?: Record<string, string>;
}

const TYPE = { file: '0', link: '1', symlink: '2', char: '3', dir: '5', fifo: '6' } as const;

function header(name: string, type: string, size: number, e: Entry): Buffer {
  const h = Buffer.alloc(512);
  const put = (s: string, at: number, len: number): void => void h.write(s.slice(0, len), at, len, 'utf8');
  const oct = (n: number, at: number, len: number): void => put(n.toString(8).padStart(len - 1, '0'), at, len - 1);
  put(name, 0, 100);
  oct(e.mode ?? (type === '5' ? 0o755 : 0o644), 100, 8);
  oct(e.uid ?? 0, 108, 8);
  oct(e.gid ?? 0, 116, 8);
  oct(size, 124, 12);
  oct(e.mtime ?? 1_700_000_000, 136, 12);
  h.write(type, 156);
  put(e.link ?? '', 157, 100);
  h.write('ustar\0', 257, 'latin1');
  h.write('00', 263, 'latin1');
  h.fill(' ', 148, 156);
  let sum = 0;
  for (const b of h) sum += b;
  put(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 8);
  return h;
}

const pad = (b: Buffer): Buffer => Buffer.concat([b, Buffer.alloc((512 - (b.length % 512)) % 512)]);

function paxRecord(key: string, value: Buffer): Buffer {
  const body = Buffer.concat([Buffer.from(` ${key}=`), value, Buffer.from('\n')]);
  let len = body.length + 1;
  while (String(len).length + body.length !== len) len = String(len).length + body.length;
  return Buffer.concat([Buffer.from(String(len)), body]);
}

/** A tar archive of exactly these entries, in this order. */
export function tar(entries: Entry[]): Buffer {
  const parts: Buffer[] = [];
  for (const e of entries) {
    const type = TYPE[e.type ?? 'file'];
    const data = Buffer.from(e.data ?? '');
    const records: Buffer[] = [];
    if (e.pax || Buffer.byteLength(e.name) > 100) records.push(paxRecord('path', Buffer.from(e.name)));
    if (e.paxSize) records.push(paxRecord('size', Buffer.from(String(data.length))));
    for (const [k, v] of Object.entries(e.xattrs ?? {})) records.push(paxRecord(`SCHILY.xattr.${k}`, Buffer.from(v)));
    if (records.length) {
      const body = Buffer.concat(records);
      parts.push(header('PaxHeader', 'x', body.length, { name: 'PaxHeader' }), pad(body));
    }
    if (e.extraPax) {
      const body = Buffer.concat(Object.entries(e.extraPax).map(([k, v]) => paxRecord(k, Buffer.from(v))));
      parts.push(header('PaxHeader2', 'x', body.length, { name: 'PaxHeader2' }), pad(body));
    }
    parts.push(header(e.name, type, type === '0' && !e.paxSize ? data.length : 0, e));
    if (type === '0') parts.push(pad(data));
  }
  parts.push(Buffer.alloc(1024));
  return Buffer.concat(parts);
}

const sha = (b: Buffer): string => createHash('sha256').update(b).digest('hex');

export type Compress = 'none' | 'gzip' | 'zstd';

export function compress(b: Buffer, how: Compress): Buffer {
  if (how === 'gzip') return gzipSync(b);
  if (how === 'zstd') {
    const r = spawnSync('zstd', ['-q', '-c'], { input: b, maxBuffer: 1 << 30 });
    if (r.status !== 0) throw new Error(`zstd: ${r.stderr}`);
    return r.stdout;
  }
  return b;
}

export interface ImageSpec {
  layers: Buffer[];
  compress?: Compress;
  config?: Record<string, unknown>;
  /** change one byte of this layer's blob after its digest was taken */
  corruptLayer?: number;
  /** the layers the config's diff_ids are taken from (default: `layers`) */
  diffIdsOf?: Buffer[];
  tag?: string;
}

function configOf(layers: Buffer[], spec: ImageSpec): Buffer {
  return Buffer.from(
    JSON.stringify({
      architecture: 'amd64',
      os: 'linux',
      config: spec.config ?? {},
      rootfs: { type: 'layers', diff_ids: (spec.diffIdsOf ?? layers).map((l) => `sha256:${sha(l)}`) },
    }),
  );
}

/** An OCI image layout directory (what `skopeo copy … oci:DIR` writes); returns its blobs by digest. */
export function ociLayout(dir: string, spec: ImageSpec): void {
  const how = spec.compress ?? 'gzip';
  const blobs = join(dir, 'blobs', 'sha256');
  mkdirSync(blobs, { recursive: true });
  const put = (b: Buffer): { digest: string; size: number } => {
    writeFileSync(join(blobs, sha(b)), b);
    return { digest: `sha256:${sha(b)}`, size: b.length };
  };
  const layerType = `application/vnd.oci.image.layer.v1.tar${how === 'none' ? '' : `+${how}`}`;
  const layers = spec.layers.map((l, i) => {
    const stored = compress(l, how);
    const d = { mediaType: layerType, ...put(stored) };
    if (spec.corruptLayer === i) {
      stored[stored.length - 1] = stored[stored.length - 1]! ^ 0xff;
      writeFileSync(join(blobs, d.digest.slice(7)), stored);
    }
    return d;
  });
  const config = { mediaType: 'application/vnd.oci.image.config.v1+json', ...put(configOf(spec.layers, spec)) };
  const manifest = put(
    Buffer.from(
      JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json', config, layers }),
    ),
  );
  // a nested index, as multi-platform images have: one entry for another platform, one for this one
  const other = put(
    Buffer.from(
      JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json', config, layers: [] }),
    ),
  );
  const nested = put(
    Buffer.from(
      JSON.stringify({
        schemaVersion: 2,
        mediaType: 'application/vnd.oci.image.index.v1+json',
        manifests: [
          {
            mediaType: 'application/vnd.oci.image.manifest.v1+json',
            ...other,
            platform: { os: 'linux', architecture: 's390x' },
          },
          {
            mediaType: 'application/vnd.oci.image.manifest.v1+json',
            ...manifest,
            platform: { os: 'linux', architecture: 'amd64' },
          },
        ],
      }),
    ),
  );
  writeFileSync(join(dir, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));
  writeFileSync(
    join(dir, 'index.json'),
    JSON.stringify({
      schemaVersion: 2,
      manifests: [
        {
          mediaType: 'application/vnd.oci.image.index.v1+json',
          ...nested,
          annotations: { 'org.opencontainers.image.ref.name': spec.tag ?? 'latest' },
        },
      ],
    }),
  );
}

/**
 * A `docker save` tarball: `legacy` is the layout before Docker 25 (`<id>/layer.tar`, `<id>.json`),
 * otherwise Docker 25+'s (an OCI layout plus manifest.json, blobs named by digest).
 */
export function dockerSave(spec: ImageSpec & { legacy: boolean; paxSizes?: boolean }): Buffer {
  const entries: Entry[] = [];
  const config = configOf(spec.layers, spec);
  const tags = [`${spec.tag ?? 'test/image'}:latest`];
  if (spec.legacy) {
    const layerNames = spec.layers.map((l, i) => {
      const id = sha(Buffer.from(`layer ${i} ${sha(l)}`));
      entries.push(
        { name: `${id}/`, type: 'dir' },
        { name: `${id}/VERSION`, data: '1.0' },
        { name: `${id}/layer.tar`, data: compress(l, spec.compress ?? 'none') },
      );
      return `${id}/layer.tar`;
    });
    entries.push({ name: `${sha(config)}.json`, data: config });
    entries.push({
      name: 'manifest.json',
      data: JSON.stringify([{ Config: `${sha(config)}.json`, RepoTags: tags, Layers: layerNames }]),
    });
    return tar(entries);
  }
  entries.push({ name: 'blobs/', type: 'dir' }, { name: 'blobs/sha256/', type: 'dir' });
  const layerNames = spec.layers.map((l) => {
    const stored = compress(l, spec.compress ?? 'none');
    entries.push({ name: `blobs/sha256/${sha(stored)}`, data: stored, paxSize: spec.paxSizes });
    return `blobs/sha256/${sha(stored)}`;
  });
  entries.push({ name: `blobs/sha256/${sha(config)}`, data: config });
  entries.push({
    name: 'manifest.json',
    data: JSON.stringify([{ Config: `blobs/sha256/${sha(config)}`, RepoTags: tags, Layers: layerNames }]),
  });
  entries.push({ name: 'oci-layout', data: JSON.stringify({ imageLayoutVersion: '1.0.0' }) });
  return tar(entries);
}
