import { describe, expect, it } from 'vitest';
import { SnaplabError } from '../errors.js';
import type { LabApi } from './api.js';
import { BulkError, removeMany } from './bulk.js';

describe('removeMany', () => {
  it('counts what an abort left beside what failed', async () => {
    const stop = new AbortController();
    const lab = {
      get: async (id: string) => ({
        destroy: async () => {
          if (id !== 'b') return undefined;
          stop.abort(); // interrupted while this one fails
          throw new SnaplabError('INTERNAL', 'broke');
        },
      }),
    } as unknown as Pick<LabApi, 'get'>;
    const boxes = ['a', 'b', 'c', 'd'].map((id) => ({ id, name: id }));
    const e = await removeMany(lab, boxes, { parallel: 1, signal: stop.signal }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(BulkError);
    expect(e).toMatchObject({ removed: ['a'], notBegun: 2 });
    expect((e as BulkError).message).toMatch(
      /^3 of 4 sandboxes not removed \(1 removed; 2 not begun: interrupted\): b: broke/,
    );
  });
});
