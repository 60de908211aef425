import { SnaplabError } from '../../errors.js';

export interface PortSpec {
  /** 0: any free port */
  local: number;
  remote: number;
}

/** `[LOCAL:]REMOTE`, as kubectl port-forward takes it (`8080:80`, `80`, `:80` for any local port). */
export function parsePortSpec(s: string): PortSpec {
  const m = /^(?:(\d*):)?(\d+)$/.exec(s.trim());
  const port = (v: string | undefined, dflt: number): number => (v === undefined || v === '' ? dflt : Number(v));
  if (m) {
    const remote = Number(m[2]);
    const local = m[1] === undefined ? remote : port(m[1], 0);
    if (remote >= 1 && remote <= 65535 && local >= 0 && local <= 65535) return { local, remote };
  }
  throw new SnaplabError(
    'BAD_INPUT',
    `invalid port ${JSON.stringify(s)}`,
    'give [LOCAL:]REMOTE, e.g. 8080:80, 80, or :80 for any free local port',
  );
}
