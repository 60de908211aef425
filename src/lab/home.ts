/** Where a lab keeps its state unless SNAPLAB_HOME says otherwise. */
export const DEFAULT_HOME = '/var/lib/snaplab';

/** The home SNAPLAB_HOME names; set but empty is unset, as a shell's `${SNAPLAB_HOME:-…}` reads it. */
export function envHome(env: NodeJS.ProcessEnv = process.env): string {
  return env.SNAPLAB_HOME || DEFAULT_HOME;
}
