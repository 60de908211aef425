import { open } from 'node:fs/promises';
import { posix } from 'node:path';
import { SnaplabError } from '../errors.js';
import { failureMeans } from '../cleanup.js';

/** Where one member's bytes lie in an uncompressed tar file. */
export interface TarMember {
  offset: number;
  size: number;
}

const BLOCK = 512;

const bad = (msg: string): SnaplabError =>
  new SnaplabError(
    'BAD_IMAGE',
    `not a readable image archive: ${msg}`,
    'give a `docker save` tarball, an OCI image layout (directory or tar), or a rootfs tarball',
  );

function octal(h: Buffer, at: number, len: number): number {
  if (h[at]! & 0x80) {
    let v = 0;
    for (let i = at + 1; i < at + len; i++) v = v * 256 + h[i]!;
    return v;
  }
  const s = h
    .subarray(at, at + len)
    .toString('latin1')
    .replace(/[\0 ]+$/, '')
    .trim();
  if (!/^[0-7]*$/.test(s)) throw bad('a header field is not a number');
  return s ? parseInt(s, 8) : 0;
}

const cstr = (h: Buffer, at: number, len: number): string => {
  const b = h.subarray(at, at + len);
  const z = b.indexOf(0);
  return (z < 0 ? b : b.subarray(0, z)).toString('utf8');
};

/** Archive names are looked up, never used as host paths: normalized as strings, in the archive's own namespace. */
export function memberName(name: string): string {
  return posix.normalize(`/${name}`).slice(1).replace(/\/$/, '');
}

/** One header as a tar reader sees it (pax and GNU long names already folded in). */
export interface TarHeader {
  name: string;
  type: string;
  size: number;
  link: string;
  /** where the member's data starts */
  data: number;
}

/** Reads `len` bytes at `pos`; fewer at the end of what is there. */
type ReadAt = (pos: number, len: number) => Promise<Buffer>;

/**
 * Walk the headers of an uncompressed tar without reading the members' data. `visit` returns
 * false to stop. Only ustar/pax/GNU headers with a valid checksum are taken.
 */
export async function walkTar(read: ReadAt, visit: (h: TarHeader) => boolean): Promise<void> {
  let pos = 0;
  let longName: string | undefined;
  let longLink: string | undefined;
  let pax: { path?: string; linkpath?: string; size?: number } = {};
  for (;;) {
    const h = await read(pos, BLOCK);
    if (h.length < BLOCK || h.every((b) => b === 0)) return;
    let sum = 0;
    for (let i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? 32 : h[i]!;
    if (sum !== octal(h, 148, 8)) throw bad(`bad header checksum at byte ${pos}`);
    const type = String.fromCharCode(h[156]!);
    const meta = type === 'L' || type === 'K' || type === 'x' || type === 'g';
    // Go's archive/tar (docker save) writes members of 8 GiB and more with the size in pax only
    const size = !meta && pax.size !== undefined ? pax.size : octal(h, 124, 12);
    const data = pos + BLOCK;
    pos = data + Math.ceil(size / BLOCK) * BLOCK;
    if (type === 'L' || type === 'K' || type === 'x') {
      if (size > 1 << 20) throw bad('an oversized long-name or pax header');
      const body = await read(data, size);
      if (body.length < size) return;
      if (type === 'L') longName = cstr(body, 0, size);
      else if (type === 'K') longLink = cstr(body, 0, size);
      else {
        for (const m of body.toString('utf8').matchAll(/^\d+ (path|linkpath|size)=(.*)$/gm)) {
          if (m[1] === 'size') {
            if (!/^\d{1,15}$/.test(m[2]!)) throw bad('a pax size record is not a number');
            pax.size = Number(m[2]);
          } else pax[m[1] as 'path' | 'linkpath'] = m[2];
        }
      }
      continue;
    }
    if (type === 'g') continue;
    const ustar = h.subarray(257, 263).toString('latin1') === 'ustar\0';
    const prefix = ustar ? cstr(h, 345, 155) : '';
    const raw = pax.path ?? longName ?? (prefix ? `${prefix}/${cstr(h, 0, 100)}` : cstr(h, 0, 100));
    const link = pax.linkpath ?? longLink ?? cstr(h, 157, 100);
    longName = longLink = undefined;
    pax = {};
    if (!visit({ name: memberName(raw), type, size, link, data })) return;
  }
}

/**
 * Index the regular files (and links, resolved inside the archive) of an uncompressed tar file:
 * an image archive is never extracted, its blobs are read in place by offset.
 */
export async function indexTar(file: string): Promise<Map<string, TarMember>> {
  const fh = await open(file, 'r');
  const members = new Map<string, TarMember>();
  const links = new Map<string, string>();
  try {
    const { size: total } = await fh.stat();
    const buf = Buffer.alloc(1 << 20);
    await walkTar(
      async (pos, len) => {
        const b = len <= buf.length ? buf.subarray(0, len) : Buffer.alloc(len);
        const { bytesRead } = await fh.read(b, 0, len, pos);
        return b.subarray(0, bytesRead);
      },
      (h) => {
        if (h.data + h.size > total) throw bad(`truncated: ${h.name} ends past the end of the file`);
        if (h.type === '0' || h.type === '\0' || h.type === '7') members.set(h.name, { offset: h.data, size: h.size });
        else if (h.type === '2') links.set(h.name, memberName(posix.join(posix.dirname(h.name), h.link)));
        else if (h.type === '1') links.set(h.name, memberName(h.link));
        return true;
      },
    );
  } finally {
    await fh.close();
  }
  // docker save links a layer shared by two images to the first copy
  for (const [name, target] of links) {
    let t = target;
    for (let hops = 0; hops < 8 && !members.has(t) && links.has(t); hops++) t = links.get(t)!;
    const m = members.get(t);
    if (m) members.set(name, m);
  }
  return members;
}

/** Names that only image archives (docker save, OCI layouts) hold at their top. */
const IMAGE_MARKER =
  /^(oci-layout|index\.json|manifest\.json|blobs\/sha256\/[0-9a-f]{64}|[0-9a-f]{64}(\.json|\.tar|\/layer\.tar|\/json|\/VERSION))$/;
const IMAGE_DIR = /^(|blobs|blobs\/sha256|[0-9a-f]{64}|repositories)$/;

/**
 * Is this tar (the first bytes of it, uncompressed) an image archive or a root filesystem? The
 * first name that only an image archive has says image; the first that none has says rootfs.
 */
export async function looksLikeImageArchive(prefix: Buffer): Promise<boolean | undefined> {
  let verdict: boolean | undefined;
  await walkTar(
    async (pos, len) => prefix.subarray(pos, pos + len),
    (h) => {
      if (IMAGE_MARKER.test(h.name)) verdict = true;
      else if (!IMAGE_DIR.test(h.name)) verdict = false;
      return verdict === undefined;
    },
  ).catch(failureMeans(undefined)); // a prefix that ends mid-archive: the verdict so far stands
  return verdict;
}
