/**
 * Ids and readable default names of sandboxes: pure, below every layer, so a front (the daemon
 * draws the name of a create it tracks) and the core (lab/names) share one format.
 */
import { randomBytes } from 'node:crypto';

export function newId(): string {
  return randomBytes(6).toString('hex');
}

const ADJ = ['brisk', 'calm', 'eager', 'fair', 'keen', 'lucid', 'merry', 'nimble', 'quiet', 'swift', 'tidy', 'vivid'];
const NOUN = ['otter', 'heron', 'lynx', 'finch', 'marten', 'ibex', 'wren', 'vole', 'crane', 'stoat', 'tern', 'hare'];

/**
 * A readable default name, like `swift-otter-3fa2c1`. Six hex digits of the id (24 bits): with
 * four, 500 machines made through the daemon had four names taken twice (a birthday collision is
 * likely past ~300 of 65536), each a create failing with SANDBOX_EXISTS.
 */
export function defaultName(id: string): string {
  const n = parseInt(id.slice(0, 6), 16);
  return `${ADJ[n % ADJ.length]}-${NOUN[(n >> 4) % NOUN.length]}-${id.slice(0, 6)}`;
}
