import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { SnaplabError } from '../errors.js';

/** Directory holding package.json, found by walking up from this module (src/ or dist/). */
export function packageRoot(from: string = dirname(fileURLToPath(import.meta.url))): string {
  let dir = from;
  for (;;) {
    if (existsSync(join(dir, 'package.json'))) return dir;
    const up = dirname(dir);
    if (up === dir) {
      throw new SnaplabError('INTERNAL', `no package.json above ${from}`, 'run snaplab from its installed package');
    }
    dir = up;
  }
}

/** Absolute path of the static agent binary; throws INTERNAL with the build command if it is missing. */
export function agentBinaryPath(): string {
  const p = join(packageRoot(), 'native', 'build', 'snaplab-agent');
  if (!existsSync(p)) {
    throw new SnaplabError(
      'INTERNAL',
      `agent binary not found at ${p}`,
      'build it: make -C native (or npm run build:agent)',
    );
  }
  return p;
}
