import { SnaplabError } from '../../errors.js';

/** The environment every command starts with; `--env` entries add to or replace it. */
export const DEFAULT_ENV = [
  'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
  'HOME=/root',
  'TERM=xterm',
];

/**
 * KEY=VALUE entries (an environment, labels) as an object; a missing KEY or `=` is BAD_INPUT. An
 * environment's later entry wins; labels and label filters (`unique`) name each key once (a second
 * `env=b` beside `env=a` was kept alone, and a filter then matched what it did not say). Every key is
 * an own property, `__proto__` too: assigned, it set the prototype and vanished, and a filter of
 * `__proto__=x` was the empty filter, which `rm --label` read as every sandbox.
 */
export function keyValues(
  entries: string[],
  what = 'environment entry',
  o: { unique?: boolean } = {},
): Record<string, string> {
  const out: Record<string, string> = {};
  for (const kv of entries) {
    const i = kv.indexOf('=');
    if (i <= 0) throw new SnaplabError('BAD_INPUT', `invalid ${what} ${JSON.stringify(kv)}`, 'write it as KEY=VALUE');
    const key = kv.slice(0, i);
    if (o.unique && Object.hasOwn(out, key))
      throw new SnaplabError('BAD_INPUT', `${what} ${JSON.stringify(key)} given twice`, 'give each key once');
    Object.defineProperty(out, key, { value: kv.slice(i + 1), enumerable: true, writable: true, configurable: true });
  }
  return out;
}

/** Merge KEY=VALUE entries over the defaults (later wins). */
export function mergeEnv(extra: Record<string, string> | string[] | undefined): string[] {
  const map = new Map<string, string>();
  const add = (kv: string): void => {
    const [k] = Object.keys(keyValues([kv]));
    map.set(k!, kv);
  };
  DEFAULT_ENV.forEach(add);
  if (Array.isArray(extra)) extra.forEach(add);
  else if (extra) for (const [k, v] of Object.entries(extra)) add(`${k}=${v}`);
  return [...map.values()];
}
