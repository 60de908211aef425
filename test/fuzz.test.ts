/**
 * Property-based fuzzing (fast-check) of the parsers that take a user's or an image's bytes: the
 * scenario file parser, and the image archive reader (tar index, docker save and OCI manifests).
 * The property is the same for each: any input gives a result or a SnaplabError with a code and
 * a hint, never another exception (a TypeError is a parser bug), and in bounded time. Seeds are
 * the checked-in example scenarios and archives the tests write entry by entry; the inputs are
 * mutations and recombinations of them. Each run is bounded by time (SNAPLAB_FUZZ_SECONDS per
 * property, default 4): `SNAPLAB_FUZZ_SECONDS=600 npx vitest run test/fuzz.test.ts` is the long run.
 */
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { afterAll, describe, expect, it } from 'vitest';
import { SnaplabError } from '../src/errors.js';
import { resolveImage, tarBlobs } from '../src/image/oci.js';
import { parseScenario } from '../src/scenario/parse.js';
import { dockerSave, tar } from './image-archives.js';

const SECONDS = Number(process.env.SNAPLAB_FUZZ_SECONDS ?? 4) || 4;
const dir = mkdtempSync(join(tmpdir(), 'snaplab-test-fuzz-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Run a property until the time is up (a failure is shrunk and reported); returns how many inputs it ran. */
async function fuzz<T>(arb: fc.Arbitrary<T>, check: (v: T) => void | Promise<void>): Promise<number> {
  let n = 0;
  await fc.assert(
    fc.asyncProperty(arb, async (v) => {
      n++;
      await check(v);
    }),
    { numRuns: 1e9, interruptAfterTimeLimit: SECONDS * 1000, markInterruptAsFailure: false },
  );
  return n;
}

/** A failure is a SnaplabError with a code and a hint; anything else thrown is a bug found. */
function expectCleanError(e: unknown, codes: string[]): void {
  if (!(e instanceof SnaplabError)) throw new Error(`not a SnaplabError: ${(e as Error)?.stack ?? String(e)}`);
  expect(codes).toContain(e.code);
  expect(e.message.length).toBeGreaterThan(0);
}

// the seeds: every example scenario, as lines
const examples = join(import.meta.dirname, '..', 'examples', 'scenarios');
const seeds = readdirSync(examples).map((d) => ({
  dir: join(examples, d),
  lines: readFileSync(join(examples, d, 'scenario.yaml'), 'utf8').split('\n'),
}));

/** Lines of a seed, some dropped, duplicated, swapped or given a fragment of another line or a value of another kind. */
const scenarioText = fc
  .tuple(
    fc.constantFrom(...seeds),
    fc.array(fc.tuple(fc.nat(), fc.nat(), fc.constantFrom('drop', 'dup', 'swap', 'cut', 'value', 'indent', 'junk')), {
      maxLength: 8,
    }),
    fc.constantFrom(
      '1',
      '-1',
      '0x10',
      '1e400',
      'null',
      '~',
      '[]',
      '{}',
      '"',
      "'",
      '*a',
      '&a',
      '!!binary x',
      '<<: *a',
      '10.0.0.0/33',
      '999G',
      '-1s',
      'é',
      '\t',
      ': :',
      '- - -',
    ),
  )
  .map(([seed, ops, value]) => {
    const l = [...seed.lines];
    for (const [i, j, op] of ops) {
      if (!l.length) break;
      const a = i % l.length;
      const b = j % l.length;
      if (op === 'drop') l.splice(a, 1);
      else if (op === 'dup') l.splice(a, 0, l[a]!);
      else if (op === 'swap') [l[a], l[b]] = [l[b]!, l[a]!];
      else if (op === 'cut') l[a] = l[a]!.slice(0, j % (l[a]!.length + 1));
      else if (op === 'value') l[a] = l[a]!.replace(/:\s*(\S.*)?$/, `: ${value}`);
      else if (op === 'indent') l[a] = ' '.repeat(j % 7) + l[a]!.trimStart();
      else l[a] = `${l[a]!}${value}`;
    }
    return { text: l.join('\n'), dir: seed.dir };
  });

describe('fuzzing', () => {
  const LIMIT = SECONDS * 1000 + 30_000;
  it(
    `the scenario parser: any text is a spec or SCENARIO_INVALID with a hint (${SECONDS} s)`,
    async () => {
      let ok = 0;
      let invalid = 0;
      const n = await fuzz(
        fc.oneof(
          { weight: 9, arbitrary: scenarioText },
          { weight: 1, arbitrary: fc.string({ maxLength: 400 }).map((text) => ({ text, dir })) },
        ),
        (input) => {
          const t0 = performance.now();
          try {
            parseScenario(input.text, { file: 's.yaml', dir: input.dir });
            ok++;
          } catch (e) {
            expectCleanError(e, ['SCENARIO_INVALID']);
            invalid++;
          }
          expect(performance.now() - t0).toBeLessThan(2000);
        },
      );
      console.log(`scenario parser: ${n} inputs, ${ok} parsed, ${invalid} refused with a located error`);
      expect(n).toBeGreaterThan(100);
      expect(ok).toBeGreaterThan(0); // the mutations keep some inputs valid: the parse path is reached too
    },
    LIMIT,
  );

  it(
    `the image archive reader: any bytes are an image or BAD_IMAGE with a hint (${SECONDS} s)`,
    async () => {
      // seeds: a docker save archive of each layout, a layer with links, and an OCI-looking tar
      const layer = tar([
        { name: 'etc/', type: 'dir' },
        { name: 'etc/hostname', data: 'x\n' },
        { name: 'bin/sh', type: 'symlink', link: 'busybox' },
      ]);
      const archives = [
        dockerSave({ layers: [layer], legacy: false }),
        dockerSave({ layers: [layer], legacy: true }),
        tar([
          { name: 'index.json', data: '{"manifests":[]}' },
          { name: 'oci-layout', data: '{}' },
        ]),
      ];
      const file = join(dir, 'image.tar');
      let ok = 0;
      let refused = 0;
      // most mutations land in a header, whose checksum the reader checks first: most inputs get
      // their headers' checksums made right again, so the fields behind it are reached too
      const mutated = fc
        .tuple(
          fc.constantFrom(...archives),
          fc.array(
            fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 }), fc.constantFrom('set', 'cut', 'zero', 'digit')),
            { minLength: 1, maxLength: 6 },
          ),
          fc.boolean(),
        )
        .map(([seed, ops, fixSums]) => {
          let b = Buffer.from(seed);
          for (const [at, v, op] of ops) {
            const i = at % b.length;
            if (op === 'set') b[i] = v;
            else if (op === 'cut') b = b.subarray(0, i);
            else if (op === 'zero') b.fill(0, i, Math.min(b.length, i + (v % 64)));
            else b[i] = 0x30 + (v % 10); // an octal size or a digest digit: the fields parsers trust
            if (!b.length) break;
          }
          if (fixSums) {
            for (let h = 0; h + 512 <= b.length; h += 512) {
              if (b.toString('latin1', h + 257, h + 262) !== 'ustar') continue;
              b.fill(0x20, h + 148, h + 156);
              let sum = 0;
              for (let k = h; k < h + 512; k++) sum += b[k]!;
              b.write(`${sum.toString(8).padStart(6, '0')}\0 `, h + 148, 'latin1');
            }
          }
          return b;
        });
      const n = await fuzz(mutated, async (bytes) => {
        writeFileSync(file, bytes);
        const t0 = performance.now();
        try {
          await resolveImage(await tarBlobs(file));
          ok++;
        } catch (e) {
          expectCleanError(e, [
            'BAD_IMAGE',
            'IMAGE_UNSAFE',
            'IMAGE_TOO_LARGE',
            'IMAGE_DIGEST_MISMATCH',
            'IMAGE_IO',
            'IMAGE_NOT_FOUND',
          ]);
          refused++;
        }
        expect(performance.now() - t0).toBeLessThan(2000);
      });
      console.log(`image archive reader: ${n} inputs, ${ok} read, ${refused} refused`);
      expect(n).toBeGreaterThan(100);
      expect(ok).toBeGreaterThan(0);
    },
    LIMIT,
  );
});
