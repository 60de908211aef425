import { readFileSync } from 'node:fs';

/** Is this ELF64 executable dynamically linked (has a PT_INTERP program header)? */
export function isDynamicElf(path: string): boolean {
  const b = readFileSync(path);
  if (b.length < 64 || b.readUInt32BE(0) !== 0x7f454c46 || b[4] !== 2) return false;
  const phoff = Number(b.readBigUInt64LE(0x20));
  const phentsize = b.readUInt16LE(0x36);
  const phnum = b.readUInt16LE(0x38);
  for (let i = 0; i < phnum; i++) {
    const off = phoff + i * phentsize;
    if (off + 4 <= b.length && b.readUInt32LE(off) === 3) return true;
  }
  return false;
}
