import { randomBytes } from 'node:crypto';
import { SnaplabError } from '../errors.js';

const NAME = /^[a-z0-9][a-z0-9_.-]{0,62}$/i;

/** Names of images, sandboxes and snapshots: safe as file names, hostnames and CLI arguments. */
export function checkName(kind: string, name: string): string {
  if (!NAME.test(name)) {
    throw new SnaplabError(
      'BAD_NAME',
      `invalid ${kind} name ${JSON.stringify(name)}`,
      'use 1-63 letters, digits, ".", "_" or "-", starting with a letter or digit',
    );
  }
  return name;
}

/** What a sandbox is looked up by: an id or a name, `SCENARIO/MACHINE` being sandbox SCENARIO.MACHINE. */
export const sandboxKey = (idOrName: string): string =>
  idOrName.includes('/') ? idOrName.replace('/', '.') : idOrName;

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
