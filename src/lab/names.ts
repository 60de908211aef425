import { SnaplabError } from '../errors.js';

/** what a name may be (checkName); a bulk create checks its longest before making any */
export const NAME = /^[a-z0-9][a-z0-9_.-]{0,62}$/i;

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

export { defaultName, newId } from '../names.js';
