/**
 * What a create may be given, checked once for every front: the embedded Lab, the daemon (and
 * through it a gateway's nodes) call this before they make anything.
 */
import { SnaplabError } from '../errors.js';
import type { LabCreateOptions } from './api.js';

/** A create's inputs as a daemon's request carries them: also a snapshot to restore. */
export type CreateInputs = LabCreateOptions & { snapshot?: string };

export function checkCreateInputs(o: CreateInputs): void {
  const sources = [o.image, o.snapshot, o.pool].filter((x) => x !== undefined).length;
  if (sources > 1)
    throw new SnaplabError(
      'BAD_INPUT',
      'give one of image, snapshot and pool',
      'a sandbox comes from an image (default busybox), a snapshot, or a pool standby',
    );
  if (o.pool !== undefined && (o.name !== undefined || o.limits || o.storage || o.driver)) {
    throw new SnaplabError(
      'BAD_INPUT',
      'a pool standby takes no name, limits, storage or driver',
      "they are the pool's; give labels, metadata and a timeout only",
    );
  }
  if (o.timeoutS !== undefined && (!Number.isSafeInteger(o.timeoutS) || o.timeoutS < 0))
    throw new SnaplabError('BAD_INPUT', `invalid timeoutS ${o.timeoutS}`, 'give whole seconds ≥ 0 (0: no timeout)');
}
