import { isAlias, isMap, isScalar, isSeq, type Document, type LineCounter, type Node, type Pair } from 'yaml';
import { SnaplabError } from '../errors.js';

export type Path = readonly (string | number)[];

/** Turns a path in the parsed value back into a line and column of the file. */
export class Locator {
  constructor(
    private readonly doc: Document,
    private readonly lines: LineCounter,
    private readonly file: string,
  ) {}

  /**
   * Offset of the node at `path`; with `key`, of the map key that names it. A path that ends
   * below what the document holds (a missing key) points at the key of the deepest map found.
   */
  offset(path: Path, key = false): number {
    let node: unknown = this.doc.contents;
    let holder: Pair | undefined; // the pair whose value is `node`
    for (const seg of path) {
      node = this.deref(node);
      let next: { node: unknown; pair?: Pair } | undefined;
      if (isMap(node)) {
        const pair = node.items.find((p) => keyText(p) === String(seg));
        if (pair) next = { node: pair.value, pair };
      } else if (isSeq(node) && typeof seg === 'number' && seg < node.items.length) {
        next = { node: node.items[seg] };
      }
      if (!next) return start(holder?.key) ?? start(node) ?? 0;
      node = next.node;
      holder = next.pair;
    }
    if (key && holder) return start(holder.key) ?? 0;
    return start(this.deref(node)) ?? start(holder?.key) ?? 0;
  }

  /** The YAML node at `path`, if the document has one. */
  node(path: Path): Node | undefined {
    const n: unknown = this.doc.getIn(path as (string | number)[], true);
    return (isScalar(n) || isMap(n) || isSeq(n) || isAlias(n) ? n : undefined) as Node | undefined;
  }

  /** Map keys at `path` in file order (a JS object would put "1" before "a"). */
  keys(path: Path): string[] {
    const n = this.deref(this.doc.getIn(path as (string | number)[], true));
    return isMap(n) ? n.items.map((p) => keyText(p)) : [];
  }

  where(offset: number): { line: number; col: number } {
    return this.lines.linePos(offset);
  }

  error(offset: number, message: string, hint?: string): SnaplabError {
    const { line, col } = this.where(offset);
    return new SnaplabError(
      'SCENARIO_INVALID',
      `${this.file}:${line}:${col}: ${message}`,
      hint ?? 'see docs/scenario-file.md',
    );
  }

  fail(path: Path, message: string, hint?: string, key = false): never {
    throw this.error(this.offset(path, key), message, hint);
  }

  private deref(n: unknown): unknown {
    return isAlias(n) ? n.resolve(this.doc) : n;
  }
}

export function keyText(p: Pair): string {
  return isScalar(p.key) ? String(p.key.value) : String(p.key);
}

function start(n: unknown): number | undefined {
  const r = (n as { range?: [number, number, number] } | null | undefined)?.range;
  return r?.[0];
}

/** "machines.server.provision[0].copy.from" */
export function label(path: Path): string {
  let s = '';
  for (const seg of path) s += typeof seg === 'number' ? `[${seg}]` : s ? `.${seg}` : seg;
  return s || 'the file';
}
