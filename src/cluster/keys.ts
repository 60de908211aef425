/**
 * A cluster's API keys: kept in etcd (so every gateway knows them), made and shown once as a
 * single daemon's are (server/keys.ts): the store holds the key's sha256 only.
 */
import { SnaplabError } from '../errors.js';
import { checkName } from '../lab/names.js';
import { hashKey, newToken, SCOPES } from '../server/keys.js';
import type { KeyOptions } from '../lab/keys.js';
import { checkCeilings } from '../lab/ceilings.js';
import type { ClusterStore, KeyEntry } from './store.js';

export async function createKeyEntry(
  store: ClusterStore,
  name: string,
  opts: KeyOptions = {},
): Promise<{ token: string; key: KeyEntry }> {
  if (typeof name !== 'string') throw new SnaplabError('BAD_INPUT', 'a key needs a name', 'give {"name": "…"}');
  checkName('key', name);
  if (name === 'local')
    throw new SnaplabError('BAD_NAME', 'the key name "local" is the Unix socket\'s', 'pick another name');
  const scopes = opts.scopes ?? ['read', 'exec'];
  if (!Array.isArray(scopes) || !scopes.length || scopes.some((s) => !SCOPES.includes(s)))
    throw new SnaplabError('BAD_INPUT', `invalid scopes ${JSON.stringify(scopes)}`, `scopes are ${SCOPES.join(', ')}`);
  for (const q of [opts.maxSandboxes, opts.maxExecs])
    if (q !== undefined && (!Number.isSafeInteger(q) || q < 0))
      throw new SnaplabError('BAD_INPUT', `invalid quota ${q}`, 'give a whole number ≥ 0');
  const token = newToken(opts.e2b);
  const key: KeyEntry = {
    name,
    hash: hashKey(token),
    scopes: [...new Set(scopes)],
    maxSandboxes: opts.maxSandboxes ?? null,
    maxExecs: opts.maxExecs ?? null,
    ceilings: checkCeilings(opts.ceilings ?? {}),
    createdAt: Date.now(),
  };
  if (!(await store.insertKey(key)))
    throw new SnaplabError(
      'KEY_EXISTS',
      `a key named ${name} exists in the cluster`,
      `remove it first with \`snaplab key rm ${name} --cluster …\`, or pick another name`,
    );
  return { token, key };
}
