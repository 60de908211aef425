/** Output collected into a result is capped: a command printing without end must not take the host's memory. */
export const MAX_COLLECTED = 16 * 1024 * 1024;

export interface Collected {
  chunks: Buffer[];
  bytes: number;
}

/** Keep what fits under the cap; true when something was dropped. */
export function collected(c: Collected, b: Buffer): boolean {
  const room = MAX_COLLECTED - c.bytes;
  if (room <= 0) return b.length > 0;
  const keep = b.length <= room ? b : b.subarray(0, room);
  c.chunks.push(keep);
  c.bytes += keep.length;
  return keep.length < b.length;
}
