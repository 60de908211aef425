/**
 * A value checked against the API's schema (schemas.ts) where no HTTP request carries it: an
 * in-process keyed lab's call (keyed-lab.ts) is held to what the route with the same schema takes,
 * with the same answer (BAD_INPUT) for what it refuses.
 */
import { Compile } from 'typebox/compile';
import type { Static, TSchema } from 'typebox';
import { SnaplabError } from '../errors.js';

const validators = new WeakMap<TSchema, ReturnType<typeof Compile>>();

export function checked<T extends TSchema>(schema: T, value: unknown, what: string): Static<T> {
  let v = validators.get(schema);
  if (!v) validators.set(schema, (v = Compile(schema)));
  if (v.Check(value)) return value as Static<T>;
  const e = [...v.Errors(value)].at(-1);
  throw new SnaplabError(
    'BAD_INPUT',
    `invalid ${what}: ${e ? `${e.instancePath || 'the value'} ${e.message}` : 'not what it takes'}`,
    'see /openapi.json for what the endpoint takes',
  );
}
