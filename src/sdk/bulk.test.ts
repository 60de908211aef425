import { describe, expect, it } from 'vitest';
import { SnaplabError } from '../errors.js';
import type { LabApi } from './api.js';
import { BulkError, createMany, LeftError, removeMany } from './bulk.js';

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

describe('createMany', () => {
  it('refuses a prefix whose longest name is too long before making any (it made 99, then failed)', async () => {
    let creates = 0;
    const lab = {
      create: async () => {
        creates++;
        throw new SnaplabError('INTERNAL', 'not to be called');
      },
      get: async () => undefined,
    } as unknown as Pick<LabApi, 'create' | 'get'>;
    await expect(createMany(lab, 100, { name: 'p'.repeat(60) })).rejects.toMatchObject({
      code: 'BAD_NAME',
      message: expect.stringMatching(/ to "p{60}-100"$/),
    });
    expect(creates).toBe(0);
    await expect(createMany(lab, 100, { name: 'bad/name' })).rejects.toMatchObject({ code: 'BAD_NAME' });
    expect(creates).toBe(0);
  });
});

describe("createMany's cleanup", () => {
  it('names every sandbox it could not remove (the message five): LeftError.left, in its JSON too', async () => {
    let made = 0;
    const box = (name: string) => ({
      id: name,
      name,
      close: () => undefined,
      destroy: async () => {
        throw new SnaplabError('INTERNAL', `cannot remove ${name}`);
      },
    });
    const lab = {
      create: async (o: { name: string }) => {
        if (++made > 8) throw new SnaplabError('SANDBOX_EXISTS', 'taken');
        return box(o.name);
      },
      get: async (id: string) => box(id),
    } as unknown as Pick<LabApi, 'create' | 'get'>;
    const e = await createMany(lab, 20, { name: 'j' }, { parallel: 1 }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(LeftError);
    expect((e as LeftError).left).toEqual(Array.from({ length: 8 }, (_, i) => `j-${i + 1}`));
    expect((e as LeftError).message).toMatch(/^8 made, 8 of them not removed \(j-1, j-2, j-3, j-4, j-5, …\): taken$/);
    expect((e as LeftError).toJSON()).toMatchObject({ code: 'SANDBOX_EXISTS', left: (e as LeftError).left });
  });
});

describe('removeMany interrupted', () => {
  it('says what it removed by name, ABORTED', async () => {
    const stop = new AbortController();
    const lab = {
      get: async (id: string) => ({
        destroy: async () => {
          if (id === 'a') stop.abort();
          return undefined;
        },
      }),
    } as unknown as Pick<LabApi, 'get'>;
    const boxes = ['a', 'b', 'c'].map((id) => ({ id, name: id }));
    const e = await removeMany(lab, boxes, { parallel: 1, signal: stop.signal }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(BulkError);
    expect(e).toMatchObject({ code: 'ABORTED', removed: ['a'], failed: [], notBegun: 2 });
    expect((e as BulkError).message).toBe(
      '2 of 3 sandboxes not removed (1 removed; 2 not begun: interrupted): the removal was interrupted',
    );
  });
});
