/** Where a lab keeps its state unless SNAPLAB_HOME says otherwise. */
export const DEFAULT_HOME = '/var/lib/snaplab';
