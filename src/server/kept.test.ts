/**
 * A kept command's tag comes back from inside its machine, whose root can write the agent's
 * memory: parseTag takes only the daemon's own shape, field by field.
 */
import { describe, expect, it } from 'vitest';
import { parseTag } from './kept.js';

const now = 1_800_000_000_000;
const good = { d: 1, id: '0123456789abcdef', tag: 'svc', argv: ['sh', '-c', 'x'], tty: false, at: now - 1000 };
const tag = (o: Record<string, unknown>): string => JSON.stringify({ ...good, ...o });

describe('parseTag', () => {
  it("takes the daemon's shape", () => {
    expect(parseTag(tag({}), now)).toEqual(good);
    expect(parseTag(tag({ tag: null }), now)?.tag).toBeNull();
    // 1024 characters as the routes count them (code points), not UTF-16 units
    expect(parseTag(tag({ tag: '😀'.repeat(1024) }), now)?.tag).toHaveLength(2048);
  });

  it('refuses anything else: not JSON, another shape, ids and times it never writes', () => {
    const bad: (string | null)[] = [
      null,
      '',
      'L1:x',
      '{"d":1',
      'null',
      '[1]',
      '"str"',
      tag({ d: 2 }),
      tag({ id: '../../etc' }),
      tag({ id: '0123456789ABCDEF' }),
      tag({ id: 7 }),
      tag({ tag: 'x'.repeat(1025) }),
      tag({ tag: 5 }),
      tag({ argv: [] }),
      tag({ argv: 'sh' }),
      tag({ argv: ['sh', 1] }),
      tag({ tty: 'yes' }),
      // a start new Date() cannot show, before the epoch, or in the future
      tag({ at: 8.7e15 }),
      tag({ at: -1 }),
      tag({ at: now + 3_600_000 }),
      tag({ at: 1.5 }),
    ];
    for (const b of bad) expect(parseTag(b, now), String(b)).toBeNull();
  });
});
