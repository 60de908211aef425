import { SnaplabError } from '../errors.js';

/** The environment every command starts with; `--env` entries add to or replace it. */
export const DEFAULT_ENV = [
  'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
  'HOME=/root',
  'TERM=xterm',
];

/** Merge KEY=VALUE entries over the defaults (later wins). */
export function mergeEnv(extra: Record<string, string> | string[] | undefined): string[] {
  const map = new Map<string, string>();
  const add = (kv: string): void => {
    const i = kv.indexOf('=');
    if (i <= 0) throw new SnaplabError('BAD_INPUT', `invalid environment entry ${JSON.stringify(kv)}`, 'write it as KEY=VALUE');
    map.set(kv.slice(0, i), kv);
  };
  DEFAULT_ENV.forEach(add);
  if (Array.isArray(extra)) extra.forEach(add);
  else if (extra) for (const [k, v] of Object.entries(extra)) add(`${k}=${v}`);
  return [...map.values()];
}
