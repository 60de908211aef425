/**
 * The reason a pool's standby carries while it is raised (and warmed): other holders count it as
 * coming (pools/runner.ts), and an rm leaves it to its raiser (lifecycle/teardown.ts).
 */
export const RAISING = 'raising a standby';
