/**
 * E2B's network options (`allow_internet_access`, `network.allowOut`/`denyOut`) as snaplab egress
 * lists (docs/egress.md). The two models differ:
 *  - E2B: everything is allowed unless denied, and an `allowOut` entry always wins over a `denyOut`
 *    entry;
 *  - snaplab: deny wins, and an allow list means "only these".
 * So:
 *  - denying all traffic (`denyOut` holding 0.0.0.0/0, or `allow_internet_access: false`) with
 *    `allowOut` is snaplab's allow list;
 *  - denying all with no `allowOut` is no egress at all;
 *  - otherwise `denyOut` is snaplab's deny list, less what `allowOut` takes back (prefixes
 *    subtracted).
 */
import { SnaplabError } from '../errors.js';
import { checkEntry, isHostName } from '../host/net/egress-rules.js';
import type { EgressRequest } from '../sdk/api.js';

export const ALL_TRAFFIC = '0.0.0.0/0';

/** What E2B's create or network update asked, as its SDK reads it back. */
export interface E2bNetwork {
  allowOut?: string[];
  denyOut?: string[];
  internet: boolean;
}

function list(v: unknown, what: string): string[] | undefined {
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v) || v.some((x) => typeof x !== 'string'))
    throw new SnaplabError('BAD_INPUT', `network.${what} must be a list of strings`, 'e.g. ["8.8.8.8/32"]');
  return v as string[];
}

/** The body's network options, checked; `internet` defaults to E2B's (true). */
export function e2bNetwork(body: { allow_internet_access?: unknown; network?: unknown }): E2bNetwork {
  const net = body.network ?? {};
  if (typeof net !== 'object' || net === null || Array.isArray(net))
    throw new SnaplabError('BAD_INPUT', 'network must be an object', 'e.g. {"allowOut": ["1.1.1.1"]}');
  const n = net as Record<string, unknown>;
  if (body.allow_internet_access !== undefined && typeof body.allow_internet_access !== 'boolean')
    throw new SnaplabError('BAD_INPUT', 'allow_internet_access must be true or false', 'e.g. false');
  const allowOut = list(n.allowOut, 'allowOut');
  const denyOut = list(n.denyOut, 'denyOut');
  for (const d of denyOut ?? [])
    if (isHostName(d.trim()))
      throw new SnaplabError(
        'BAD_INPUT',
        `denyOut entry ${d} is a host name`,
        'denyOut takes IP addresses and CIDR blocks',
      );
  return {
    ...(allowOut ? { allowOut } : {}),
    ...(denyOut ? { denyOut } : {}),
    internet: body.allow_internet_access !== false,
  };
}

/** The snaplab egress for E2B's options: false (loopback only), true, or lists. */
export function egressFor(n: E2bNetwork): boolean | EgressRequest {
  const allow = (n.allowOut ?? []).map(checkEntry);
  const deny = (n.denyOut ?? []).map(checkEntry);
  if (!n.internet || deny.includes(ALL_TRAFFIC)) return allow.length ? { allow } : false;
  const addresses = allow.filter((a) => !isHostName(a));
  const left = deny.flatMap((d) => subtractAll(d, addresses));
  return left.length ? { deny: left } : true;
}

const ip4 = (s: string): number => s.split('.').reduce((n, p) => n * 256 + Number(p), 0);
const dotted = (n: number): string => [24, 16, 8, 0].map((s) => Math.floor(n / 2 ** s) % 256).join('.');

function prefix(cidr: string): { base: number; len: number } {
  const [a, l] = cidr.split('/');
  return { base: ip4(a!), len: l === undefined ? 32 : Number(l) };
}
const text = (p: { base: number; len: number }): string =>
  p.len === 32 ? dotted(p.base) : `${dotted(p.base)}/${p.len}`;

/** `from` less every prefix of `take`: the prefixes left, each a CIDR (at most 32 per subtraction). */
function subtractAll(from: string, take: string[]): string[] {
  let left = [prefix(from)];
  for (const t of take.map(prefix)) left = left.flatMap((p) => subtract(p, t));
  return left.map(text);
}

function subtract(p: { base: number; len: number }, t: { base: number; len: number }): { base: number; len: number }[] {
  const size = (len: number): number => 2 ** (32 - len);
  const inside = (x: { base: number; len: number }, y: { base: number; len: number }): boolean =>
    x.len >= y.len && Math.floor(x.base / size(y.len)) === Math.floor(y.base / size(y.len));
  if (inside(p, t)) return []; // all of p is taken
  if (!inside(t, p)) return [p]; // they do not meet
  // split p in halves until t is one of them: keep the other half each time
  const out: { base: number; len: number }[] = [];
  let cur = p;
  while (cur.len < t.len) {
    const len = cur.len + 1;
    const lo = { base: cur.base, len };
    const hi = { base: cur.base + size(len), len };
    const [toward, away] = inside(t, lo) ? [lo, hi] : [hi, lo];
    out.push(away);
    cur = toward;
  }
  return out;
}
