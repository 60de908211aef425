import { join } from 'node:path';

/**
 * The `snaplab` command as a user runs it: native/build/snaplab, which set-up links from
 * /usr/local/bin (exec's fast path in C, every other command the Node CLI in dist/bin).
 */
export const SNAPLAB = join(import.meta.dirname, '..', 'native', 'build', 'snaplab');
