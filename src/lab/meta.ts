import { SnaplabError } from '../errors.js';
import type { SandboxMeta } from '../store/records.js';
import type { LabContext } from './context.js';

const LABEL_KEY = /^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$/;

/** The labels and lifetime of a sandbox without a sandbox_meta row: none. */
export const noMeta = (id: string): SandboxMeta => ({
  id,
  labels: {},
  metadata: {},
  owner: null,
  timeoutS: null,
  onTimeout: null,
  expiresAt: null,
});

/** A sandbox's labels and lifetime; one without a row has none. */
export function metaOf(ctx: LabContext, id: string): SandboxMeta {
  return ctx.store.getMeta(id) ?? noMeta(id);
}

export function updateMeta(ctx: LabContext, id: string, patch: Partial<Omit<SandboxMeta, 'id'>>): SandboxMeta {
  const m = { ...metaOf(ctx, id), ...patch };
  ctx.store.putMeta(m);
  return m;
}

/** Labels select (list filters); metadata is free text kept with the sandbox. Both: string to string. */
export function checkLabels(
  what: 'label' | 'metadata',
  m: Record<string, unknown> | undefined,
): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(m ?? {})) {
    if (!LABEL_KEY.test(k))
      throw new SnaplabError(
        'BAD_INPUT',
        `invalid ${what} key ${JSON.stringify(k)}`,
        'use 1-63 letters, digits, ".", "_", "/" or "-", starting with a letter or digit',
      );
    if (typeof v !== 'string' || v.length > (what === 'label' ? 253 : 4096))
      throw new SnaplabError(
        'BAD_INPUT',
        `${what} ${k} must be a string of at most ${what === 'label' ? 253 : 4096} characters`,
        'give strings, e.g. {"team": "infra"}',
      );
    out[k] = v;
  }
  return out;
}

/** Does a sandbox's label set hold every key=value of the filter? */
export const matches = (labels: Record<string, string>, filter: Record<string, string> | undefined): boolean =>
  Object.entries(filter ?? {}).every(([k, v]) => labels[k] === v);
