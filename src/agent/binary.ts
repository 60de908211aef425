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
  return built('snaplab-agent');
}

/**
 * The agent's programs as the host runs them on bytes a machine made (a copy's untar, a VM's
 * relay): the same sources linked with glibc and fortified, where the machine's agent links musl,
 * which has no _FORTIFY_SOURCE (native/Makefile).
 */
export function hostAgentBinaryPath(): string {
  return built('snaplab-agent-host');
}

function built(name: string): string {
  const p = join(packageRoot(), 'native', 'build', name);
  if (!existsSync(p)) {
    throw new SnaplabError(
      'INTERNAL',
      `${name} not found at ${p}`,
      'build it: make -C native (or npm run build:agent)',
    );
  }
  return p;
}
