import { SnaplabError } from '../../errors.js';

/** The environment every command starts with; `--env` entries add to or replace it. */
export const DEFAULT_ENV = [
  'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
  'HOME=/root',
  'TERM=xterm',
];

/** KEY=VALUE entries (an environment, labels) as an object; a missing KEY or `=` is BAD_INPUT. */
export function keyValues(entries: string[], what = 'environment entry'): Record<string, string> {
  const out: Record<string, string> = {};
  for (const kv of entries) {
    const i = kv.indexOf('=');
    if (i <= 0) throw new SnaplabError('BAD_INPUT', `invalid ${what} ${JSON.stringify(kv)}`, 'write it as KEY=VALUE');
    out[kv.slice(0, i)] = kv.slice(i + 1);
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
