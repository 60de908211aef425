/**
 * multipart/form-data (RFC 7578) as E2B's SDK uploads files: each part a file, its filename the
 * full path in the sandbox. The body is whole in memory (uploads are bounded by the caller).
 */
import { SnaplabError } from '../errors.js';

export interface Part {
  name: string | undefined;
  filename: string | undefined;
  data: Buffer;
}

function boundaryOf(contentType: string): string {
  const m = /boundary=(?:"([^"]+)"|([^;\s]+))/i.exec(contentType);
  const b = m?.[1] ?? m?.[2];
  if (!b) throw new SnaplabError('BAD_INPUT', 'a multipart body without its boundary', 'send multipart/form-data');
  return b;
}

/** A header's parameter (`name="x"`), unquoted, with `filename*=` (RFC 5987) preferred. */
function param(header: string, key: string): string | undefined {
  const ext = new RegExp(`;\\s*${key}\\*=([^;]+)`, 'i').exec(header);
  if (ext) {
    const v = ext[1]!.trim();
    const i = v.indexOf("''");
    return decodeURIComponent(i >= 0 ? v.slice(i + 2) : v);
  }
  const m = new RegExp(`;\\s*${key}=(?:"((?:[^"\\\\]|\\\\.)*)"|([^;]+))`, 'i').exec(header);
  if (!m) return undefined;
  return m[1] !== undefined ? m[1].replace(/\\(.)/g, '$1') : m[2]!.trim();
}

export function parseMultipart(contentType: string, body: Buffer): Part[] {
  const delim = Buffer.from(`--${boundaryOf(contentType)}`);
  const parts: Part[] = [];
  let at = body.indexOf(delim);
  if (at < 0) throw new SnaplabError('BAD_INPUT', 'a multipart body without parts', 'send multipart/form-data');
  for (;;) {
    at += delim.length;
    if (body.subarray(at, at + 2).toString() === '--') break;
    const headEnd = body.indexOf('\r\n\r\n', at);
    const next = body.indexOf(Buffer.concat([Buffer.from('\r\n'), delim]), at);
    if (headEnd < 0 || next < 0 || headEnd > next)
      throw new SnaplabError('BAD_INPUT', 'a malformed multipart body', 'send multipart/form-data');
    const head = body.subarray(at, headEnd).toString('utf8');
    const disposition = /^content-disposition:(.*)$/im.exec(head)?.[1] ?? '';
    parts.push({
      name: param(disposition, 'name'),
      filename: param(disposition, 'filename'),
      data: body.subarray(headEnd + 4, next),
    });
    at = next + 2;
  }
  return parts;
}
