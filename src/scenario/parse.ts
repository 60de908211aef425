import { createHash } from 'node:crypto';
import { readFile, stat } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { isMap, isScalar, isSeq, LineCounter, parseDocument, visit, type Document } from 'yaml';
import type * as z from 'zod';
import { SnaplabError } from '../errors.js';
import { buildSpec } from './build.js';
import { keyText, label, Locator, type Path } from './locate.js';
import { allowedKeys, ScenarioFile } from './schema.js';
import type { LoadedScenario, ScenarioSpec } from './spec.js';

export type { LoadedScenario, ScenarioSpec } from './spec.js';

/**
 * Parse and validate a scenario file (docs/scenario-file.md). Throws SnaplabError
 * SCENARIO_INVALID as `file:line:col: what is wrong` at the first problem found. `dir` is where
 * copy paths are resolved (the file's directory).
 */
export function parseScenario(text: string, opts: { file: string; dir: string }): ScenarioSpec {
  const lines = new LineCounter();
  const doc = parseDocument(text, {
    lineCounter: lines,
    uniqueKeys: false,
    prettyErrors: false,
    keepSourceTokens: true,
  });
  const at = new Locator(doc, lines, opts.file);
  const syntax = doc.errors[0];
  if (syntax)
    throw at.error(
      syntax.pos[0],
      `YAML syntax: ${syntax.message.split('\n')[0]}`,
      'fix the YAML syntax (indentation, quotes, brackets)',
    );
  prepare(doc, at);

  // the yaml library throws for what it parses but cannot resolve (an alias with no anchor, too
  // many aliases: a billion-laughs document); found by test/fuzz.test.ts
  let value: unknown;
  try {
    value = doc.toJS({ maxAliasCount: 1000 });
  } catch (e) {
    // at the first alias whose anchor is not there, when that is the cause
    let pos = 0;
    visit(doc, {
      Alias: (_k, node) => {
        if (node.resolve(doc)) return undefined;
        pos = node.range?.[0] ?? 0;
        return visit.BREAK;
      },
    });
    throw at.error(
      pos,
      `YAML: ${(e as Error).message}`,
      'define each anchor (&name) before its alias (*name), and keep aliases few',
    );
  }
  const r = ScenarioFile.safeParse(value, { reportInput: true });
  if (!r.success) throw firstIssue(r.error.issues, at);
  return buildSpec(r.data, at, opts.dir);
}

/** Read, hash and parse a scenario file; a directory means its scenario.yaml. */
export async function loadScenario(path: string): Promise<LoadedScenario> {
  let file = resolve(path);
  let shown = path;
  try {
    if ((await stat(file)).isDirectory()) {
      file = join(file, 'scenario.yaml');
      shown = join(path, 'scenario.yaml');
    }
  } catch {
    // reported below, by the read
  }
  let bytes: Buffer;
  try {
    bytes = await readFile(file);
  } catch (e) {
    const why = (e as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file' : (e as Error).message;
    throw new SnaplabError(
      'SCENARIO_INVALID',
      `cannot read scenario file ${shown}: ${why}`,
      'give the path of a scenario YAML file, e.g. examples/scenarios/tiny-service/scenario.yaml',
      { cause: e },
    );
  }
  const text = bytes.toString('utf8');
  const dir = dirname(file);
  const spec = parseScenario(text, { file: shown, dir });
  return { spec, path: file, dir, text, hash: createHash('sha256').update(bytes).digest('hex') };
}

/**
 * Reports duplicate keys (YAML itself would only say "Map keys must be unique": say what is
 * duplicated and where it was first) and keeps arguments and environment values as written:
 * YAML would read `VERSION: 1.10` as the number 1.1.
 */
function prepare(doc: Document, at: Locator): void {
  const walk = (node: unknown, path: Path): void => {
    if (
      isScalar(node) &&
      (typeof node.value === 'number' || typeof node.value === 'boolean') &&
      node.source !== undefined &&
      isText(path)
    ) {
      node.value = node.source;
    }
    if (isSeq(node)) for (const [i, n] of node.items.entries()) walk(n, [...path, i]);
    if (!isMap(node)) return;
    const seen = new Map<string, number>();
    for (const pair of node.items) {
      const k = keyText(pair);
      const offset = (pair.key as { range?: number[] } | null)?.range?.[0] ?? 0;
      const first = seen.get(k);
      if (first !== undefined) {
        throw at.error(
          offset,
          `duplicate ${what(path)} "${k}" (first at line ${at.where(first).line})`,
          'each name may appear once in a map: rename or merge them',
        );
      }
      seen.set(k, offset);
      walk(pair.value, [...path, k]);
    }
  };
  walk(doc.contents, []);
}

const TEXT_PATHS = [
  'machines * env *',
  'machines * steps # env *',
  'machines * steps # run #',
  'machines * steps # run argv #',
  'machines * steps # run env *',
  'machines * ready # command #',
].map((p) => p.split(' '));

/** Is the scalar at `path` an argument or an environment value? ("*" any key, "#" any index.) */
function isText(path: Path): boolean {
  return TEXT_PATHS.some(
    (pattern) =>
      pattern.length === path.length &&
      pattern.every((want, i) => {
        const seg = path[i];
        if (want === '#') return typeof seg === 'number';
        if (want === '*') return typeof seg === 'string';
        if (want === 'steps') return seg === 'provision' || seg === 'start';
        return seg === want;
      }),
  );
}

function what(path: Path): string {
  if (path.length === 1 && path[0] === 'machines') return 'machine';
  if (path.length === 1 && path[0] === 'networks') return 'network';
  if (path.length === 3 && path[0] === 'machines' && path[2] === 'networks') return 'network';
  if (path.length === 3 && path[2] === 'env') return 'environment variable';
  return `key in ${label(path)}:`;
}

function where(path: Path): string {
  const [top, name, sub, net] = path;
  if (path.length === 0) return 'the top level';
  if (top === 'networks' && path.length === 2) return `network "${name}"`;
  if (top === 'machines' && path.length === 2) return `machine "${name}"`;
  if (top === 'machines' && sub === 'networks' && path.length === 4) return `machine "${name}", network "${net}"`;
  return label(path);
}

/** The zod issue earliest in the file, as a SnaplabError at its node. */
function firstIssue(issues: z.core.$ZodIssue[], at: Locator): SnaplabError {
  let best: { offset: number; message: string; hint?: string | undefined } | undefined;
  const consider = (offset: number, message: string, hint?: string) => {
    if (!best || offset < best.offset) best = { offset, message, hint };
  };
  for (const issue of issues) {
    const path = issue.path.filter((s): s is string | number => typeof s !== 'symbol');
    if (issue.code === 'unrecognized_keys') {
      const allowed = allowedKeys(path);
      for (const k of issue.keys) {
        consider(
          at.offset([...path, k], true),
          `unknown key "${k}" in ${where(path)}`,
          allowed.length ? `allowed keys here: ${allowed.join(', ')}${suggest(k, allowed)}` : undefined,
        );
      }
    } else if (issue.code === 'invalid_type' && issue.input === undefined) {
      const key = path[path.length - 1];
      consider(at.offset(path), `missing ${JSON.stringify(key)} in ${where(path.slice(0, -1))}`, `add ${String(key)}:`);
    } else {
      const params = (issue.code === 'custom' ? issue.params : undefined) ?? {};
      consider(
        at.offset(path, params.key === true),
        `${label(path)}: ${issue.message}`,
        params.hint as string | undefined,
      );
    }
  }
  return at.error(best?.offset ?? 0, best?.message ?? 'invalid scenario', best?.hint);
}

function suggest(k: string, allowed: string[]): string {
  const near = allowed.find((a) => distance(a, k) <= 2);
  return near ? ` (did you mean "${near}"?)` : '';
}

function distance(a: string, b: string): number {
  const d = Array.from({ length: a.length + 1 }, (_, i) => [i, ...Array<number>(b.length).fill(0)]);
  for (let j = 1; j <= b.length; j++) d[0]![j] = j;
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      d[i]![j] = Math.min(d[i - 1]![j]! + 1, d[i]![j - 1]! + 1, d[i - 1]![j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1));
    }
  }
  return d[a.length]![b.length]!;
}
