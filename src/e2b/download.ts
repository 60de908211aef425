/**
 * What envd's `GET /files` says of a file besides its bytes, as Go's http.ServeContent says it: its
 * type (from its name's extension, Go's own table, else sniffed from its first bytes as
 * http.DetectContentType does), `Content-Disposition: inline` with its name, and one byte range
 * when asked (`Range: bytes=…`: 206 with `Content-Range`, 416 past its end).
 */
import { Transform, type TransformCallback } from 'node:stream';
import { posix } from 'node:path';

/** Go's built-in extension table (mime.TypeByExtension before the system's files). */
const BY_EXTENSION: Record<string, string> = {
  '.avif': 'image/avif',
  '.css': 'text/css; charset=utf-8',
  '.gif': 'image/gif',
  '.htm': 'text/html; charset=utf-8',
  '.html': 'text/html; charset=utf-8',
  '.jpeg': 'image/jpeg',
  '.jpg': 'image/jpeg',
  '.js': 'text/javascript; charset=utf-8',
  '.json': 'application/json',
  '.mjs': 'text/javascript; charset=utf-8',
  '.pdf': 'application/pdf',
  '.png': 'image/png',
  '.svg': 'image/svg+xml',
  '.wasm': 'application/wasm',
  '.webp': 'image/webp',
  '.xml': 'text/xml; charset=utf-8',
};

/**
 * The common exact signatures of http.DetectContentType (not its fonts other than WOFF, MP4, AIFF
 * or .snd, which come out as octet-stream here). Its byte-order marks need four bytes (below).
 */
const SIGNATURES: [prefix: string, type: string, offset?: number][] = [
  ['%PDF-', 'application/pdf'],
  ['%!PS-Adobe-', 'application/postscript'],
  ['\x00\x00\x01\x00', 'image/x-icon'],
  ['\x00\x00\x02\x00', 'image/x-icon'],
  ['BM', 'image/bmp'],
  ['GIF87a', 'image/gif'],
  ['GIF89a', 'image/gif'],
  ['\x89PNG\r\n\x1A\n', 'image/png'],
  ['\xFF\xD8\xFF', 'image/jpeg'],
  ['WEBPVP', 'image/webp', 8],
  ['WAVE', 'audio/wave', 8],
  ['AVI ', 'video/avi', 8],
  ['ID3', 'audio/mpeg'],
  ['OggS\x00', 'application/ogg'],
  ['MThd\x00\x00\x00\x06', 'audio/midi'],
  ['\x1A\x45\xDF\xA3', 'video/webm'],
  ['Rar!\x1A\x07\x00', 'application/x-rar-compressed'],
  ['Rar!\x1A\x07\x01\x00', 'application/x-rar-compressed'],
  ['\x1F\x8B\x08', 'application/x-gzip'],
  ['PK\x03\x04', 'application/zip'],
  ['\x00asm', 'application/wasm'],
  ['wOFF', 'font/woff'],
  ['wOF2', 'font/woff2'],
];

const BOMS: [string, string][] = [
  ['\xFE\xFF', 'text/plain; charset=utf-16be'],
  ['\xFF\xFE', 'text/plain; charset=utf-16le'],
  ['\xEF\xBB\xBF', 'text/plain; charset=utf-8'],
];

/** The tags http.DetectContentType takes for HTML, each followed by a space or `>`. */
const HTML_TAGS = [
  '<!DOCTYPE HTML',
  '<HTML',
  '<HEAD',
  '<SCRIPT',
  '<IFRAME',
  '<H1',
  '<DIV',
  '<FONT',
  '<TABLE',
  '<A',
  '<STYLE',
  '<TITLE',
  '<B',
  '<BODY',
  '<BR',
  '<P',
  '<!--',
];

const startsAt = (b: Buffer, s: string, at = 0): boolean =>
  b.length >= at + s.length && b.subarray(at, at + s.length).equals(Buffer.from(s, 'latin1'));

/** http.DetectContentType's answer for a file's first bytes (at most 512 are looked at). */
export function sniff(data: Buffer): string {
  const b = data.subarray(0, 512);
  // Go's byte-order marks are masked four-byte patterns: a shorter file is not one
  if (b.length >= 4) for (const [mark, type] of BOMS) if (startsAt(b, mark)) return type;
  // RIFF's kinds are told at offset 8, behind "RIFF" and a length
  for (const [prefix, type, offset] of SIGNATURES)
    if (offset === undefined ? startsAt(b, prefix) : startsAt(b, 'RIFF') && startsAt(b, prefix, offset)) return type;
  let i = 0;
  while (i < b.length && [0x09, 0x0a, 0x0c, 0x0d, 0x20].includes(b[i]!)) i++;
  const text = b.subarray(i).toString('latin1').toUpperCase();
  for (const tag of HTML_TAGS) {
    const after = text.charCodeAt(tag.length);
    if (text.startsWith(tag) && (after === 0x20 || after === 0x3e)) return 'text/html; charset=utf-8';
  }
  if (b.subarray(i).toString('latin1').startsWith('<?xml')) return 'text/xml; charset=utf-8'; // (its case, as Go's)
  // a control byte other than whitespace and ESC makes it binary
  const binary = b.some((c) => c <= 0x08 || c === 0x0b || (c >= 0x0e && c <= 0x1a) || (c >= 0x1c && c <= 0x1f));
  return binary ? 'application/octet-stream' : 'text/plain; charset=utf-8';
}

/** A file's Content-Type as envd's ServeContent gives it: by its extension, else by its first bytes. */
export function contentTypeOf(path: string, head: Buffer): string {
  return BY_EXTENSION[posix.extname(path).toLowerCase()] ?? sniff(head);
}

/** `inline` with the file's name, as Go's mime.FormatMediaType writes it (RFC 2231 for a name beyond ASCII). */
export function dispositionOf(path: string): string {
  const name = posix.basename(path);
  if (/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(name)) return `inline; filename=${name}`;
  if (/^[\x20-\x7e]*$/.test(name)) return `inline; filename="${name.replace(/["\\]/g, '\\$&')}"`;
  const encoded = [...Buffer.from(name, 'utf8')]
    .map((c) =>
      /[!#$&+.^_`|~0-9A-Za-z-]/.test(String.fromCharCode(c))
        ? String.fromCharCode(c)
        : `%${c.toString(16).toUpperCase().padStart(2, '0')}`,
    )
    .join('');
  return `inline; filename*=utf-8''${encoded}`;
}

export type Wanted = { start: number; end: number } | 'unsatisfiable' | undefined;

/**
 * One range of a `Range: bytes=…` header against a file of `size` bytes (`end` inclusive), as
 * ServeContent reads it: undefined for none, or for several ranges (the whole file is sent, where
 * Go sends them as multipart/byteranges: RFC 9110 lets a server ignore Range); 'unsatisfiable'
 * (416) for one past the end, reversed or malformed, as Go's parseRange refuses them.
 */
export function rangeOf(header: string | undefined, size: number): Wanted {
  if (header === undefined || header === '') return undefined;
  if (/^bytes=[^,]*,/.test(header)) return undefined;
  const m = /^bytes=\s*(\d*)\s*-\s*(\d*)\s*$/.exec(header);
  if (!m || (m[1] === '' && m[2] === '')) return 'unsatisfiable';
  if (m[1] === '') {
    // the last N bytes
    const n = Number(m[2]);
    if (n === 0) return 'unsatisfiable';
    return { start: Math.max(0, size - n), end: size - 1 };
  }
  const start = Number(m[1]);
  const end = m[2] === '' ? size - 1 : Math.min(Number(m[2]), size - 1);
  if (!Number.isSafeInteger(start) || start >= size) return 'unsatisfiable';
  if (end < start) return 'unsatisfiable';
  return { start, end };
}

/** Passes on bytes start..end (inclusive) of what goes through it, then ends (`done` is called once). */
export function sliceOf(start: number, end: number, done: () => void): Transform {
  let at = 0;
  let finished = false;
  return new Transform({
    transform(chunk: Buffer, _enc, cb: TransformCallback): void {
      const from = Math.max(0, start - at);
      const to = Math.min(chunk.length, end + 1 - at);
      at += chunk.length;
      if (to > from && !finished) this.push(chunk.subarray(from, to));
      if (at > end && !finished) {
        finished = true;
        this.push(null);
        done();
      }
      cb();
    },
  });
}
