import { Readable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { contentTypeOf, dispositionOf, rangeOf, sliceOf, sniff } from './download.js';

describe("GET /files' headers, as Go's ServeContent", () => {
  it('types a file by its extension, else by its first bytes', () => {
    expect(contentTypeOf('/a/b.JSON', Buffer.from('x'))).toBe('application/json');
    expect(contentTypeOf('/a/page', Buffer.from('  <html><body>'))).toBe('text/html; charset=utf-8');
    expect(sniff(Buffer.from('<?xml version="1.0"?>'))).toBe('text/xml; charset=utf-8');
    expect(sniff(Buffer.from('\x89PNG\r\n\x1a\n....', 'latin1'))).toBe('image/png');
    expect(sniff(Buffer.from('RIFF\x00\x00\x00\x00WEBPVP8 ', 'latin1'))).toBe('image/webp');
    expect(sniff(Buffer.from('%PDF-1.7'))).toBe('application/pdf');
    expect(sniff(Buffer.from('plain words\n\tand an ESC \x1b'))).toBe('text/plain; charset=utf-8');
    expect(sniff(Buffer.from([0x41, 0x00, 0x42]))).toBe('application/octet-stream');
    expect(sniff(Buffer.alloc(0))).toBe('text/plain; charset=utf-8');
    // Go's byte-order marks are four-byte patterns; its <?xml is case-sensitive
    expect(sniff(Buffer.from('\xFE\xFF', 'latin1'))).toBe('text/plain; charset=utf-8');
    expect(sniff(Buffer.from('\xFE\xFF\x00A', 'latin1'))).toBe('text/plain; charset=utf-16be');
    expect(sniff(Buffer.from('<?XML x'))).toBe('text/plain; charset=utf-8');
    // a tag must end with a space or '>'
    expect(sniff(Buffer.from('<Bogus'))).toBe('text/plain; charset=utf-8');
  });

  it('names it inline, quoted or RFC 2231-encoded where a token would not do', () => {
    expect(dispositionOf('/x/report.pdf')).toBe('inline; filename=report.pdf');
    expect(dispositionOf('/x/my "file".txt')).toBe('inline; filename="my \\"file\\".txt"');
    expect(dispositionOf('/x/résumé.txt')).toBe("inline; filename*=utf-8''r%C3%A9sum%C3%A9.txt");
  });

  it('reads one range; several are the whole file; one past the end, reversed or malformed is unsatisfiable', () => {
    expect(rangeOf('bytes=2-5', 12)).toEqual({ start: 2, end: 5 });
    expect(rangeOf('bytes=2-', 12)).toEqual({ start: 2, end: 11 });
    expect(rangeOf('bytes=-5', 12)).toEqual({ start: 7, end: 11 });
    expect(rangeOf('bytes=-50', 12)).toEqual({ start: 0, end: 11 });
    expect(rangeOf('bytes=3-100', 12)).toEqual({ start: 3, end: 11 });
    expect(rangeOf('bytes=12-', 12)).toBe('unsatisfiable');
    expect(rangeOf('bytes=-0', 12)).toBe('unsatisfiable');
    expect(rangeOf('bytes=0-1,4-5', 12)).toBeUndefined();
    expect(rangeOf('bytes=5-2', 12)).toBe('unsatisfiable');
    expect(rangeOf('lines=1-2', 12)).toBe('unsatisfiable');
    expect(rangeOf('bytes=x-', 12)).toBe('unsatisfiable');
    expect(rangeOf(undefined, 12)).toBeUndefined();
  });

  it('slices a stream across its chunks and says when it has all it needs', async () => {
    let done = 0;
    const chunks = ['abc', 'def', 'ghi', 'jkl'].map((c) => Buffer.from(c));
    const out: Buffer[] = [];
    for await (const b of Readable.from(chunks).pipe(sliceOf(2, 7, () => done++))) out.push(b as Buffer);
    expect([Buffer.concat(out).toString(), done]).toEqual(['cdefgh', 1]);
  });
});
