/**
 * The built-in templates: images snaplab knows how to build under a fixed name, from Debian's
 * archive, the first time a sandbox asks for one (or ahead of time with `snaplab image build
 * NAME`). They are shaped as E2B's templates of the same names (docs/e2b.md "Templates"): a
 * Debian with bash, coreutils, python3, tput and sudo, and a login user `user` beside root.
 */
import type { DebianSpec } from './debian.js';

export interface TemplateRecipe {
  readonly name: string;
  readonly description: string;
  readonly spec: DebianSpec;
}

/**
 * E2B's base: what `commands.run` expects to find (bash -l, tput for a terminal, sudo, python3).
 * systemd-sysv makes its machines system machines (the image's systemd is PID 1; docs/architecture.md
 * "System machines"): the only machines whose commands run without no_new_privs, which sudo needs.
 * It costs about half a second a create (a boot); a pool of the image makes a create a take.
 */
const BASE_PACKAGES = [
  'bash',
  'ca-certificates',
  'coreutils',
  'ncurses-bin',
  'procps',
  'python3',
  'sudo',
  'systemd-sysv',
];

/** What deploy/code-interpreter/server.py needs (python3, ipykernel, jupyter_client), and what plots and tables use. */
const INTERPRETER_PACKAGES = [
  'python3-ipykernel',
  'python3-jupyter-client',
  'python3-matplotlib',
  'python3-numpy',
  'python3-pandas',
];

const debian = (packages: string[]): DebianSpec => ({ suite: 'bookworm', variant: 'minbase', packages, user: 'user' });

export const TEMPLATES: readonly TemplateRecipe[] = [
  {
    name: 'base',
    description: "E2B's default template: Debian bookworm, bash, python3, sudo, systemd, user `user`",
    spec: debian(BASE_PACKAGES),
  },
  {
    name: 'code-interpreter-v1',
    description: "E2B's code interpreter: base with Jupyter's Python kernel, matplotlib, numpy and pandas",
    spec: debian([...BASE_PACKAGES, ...INTERPRETER_PACKAGES]),
  },
];

/** The built-in template of this name, or undefined. */
export function templateRecipe(name: string): TemplateRecipe | undefined {
  return TEMPLATES.find((t) => t.name === name);
}
