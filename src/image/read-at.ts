import { open } from 'node:fs/promises';

/** Up to `length` bytes of `file` from `offset` (fewer at its end): one positioned read. */
export async function readAt(file: string, offset: number, length: number): Promise<Buffer> {
  const fh = await open(file, 'r');
  try {
    const b = Buffer.alloc(length);
    const { bytesRead } = await fh.read(b, 0, length, offset);
    return b.subarray(0, bytesRead);
  } finally {
    await fh.close();
  }
}
