import { parseSize } from '../lab/sizes.js';

/** A value in the file is wrong; the parser turns it into SCENARIO_INVALID at the value's position. */
export class Problem extends Error {
  constructor(
    message: string,
    readonly hint?: string,
  ) {
    super(message);
  }
}

const DURATION_UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
const DURATION_HINT = 'write a duration such as 5s, 500ms, 2m, or a number of seconds';

/** "5s", "500ms", "2m", "1h", or a number of seconds (fractions allowed) → milliseconds. */
export function parseDuration(v: string | number): number {
  let ms: number;
  if (typeof v === 'number') ms = v * 1000;
  else {
    const m = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$/.exec(v);
    ms = m ? Number(m[1]) * DURATION_UNITS[m[2] ?? 's']! : NaN;
  }
  ms = Math.round(ms);
  if (!Number.isSafeInteger(ms) || ms <= 0) throw new Problem(`invalid timeout ${JSON.stringify(v)}`, DURATION_HINT);
  return ms;
}

const MIN_MEMORY = 1024 ** 2;

/** A disk cap: "1G", a number of bytes, or 0 (none). */
export function parseDisk(v: string | number): number {
  if (v === 0 || v === '0' || v === 'none') return 0;
  try {
    return parseSize(String(v), 'disk');
  } catch {
    throw new Problem(
      `invalid disk ${JSON.stringify(v)}`,
      'write a size such as 512M or 2G (binary units), or 0 for no cap',
    );
  }
}

/** "128M", "1G", or a number of bytes. */
export function parseMemory(v: string | number): number {
  let bytes: number;
  try {
    bytes = parseSize(String(v), 'memory');
  } catch {
    throw new Problem(`invalid memory ${JSON.stringify(v)}`, 'write a size such as 128M or 1G (binary units)');
  }
  if (bytes < MIN_MEMORY) {
    throw new Problem(
      `memory ${JSON.stringify(v)} is ${bytes} bytes, too little for a machine`,
      `a bare number is bytes: write ${v}M for megabytes`,
    );
  }
  return bytes;
}

export function parsePort(v: string | number): number {
  const n = typeof v === 'number' ? v : /^\s*\d+\s*$/.test(v) ? Number(v) : NaN;
  if (!Number.isInteger(n) || n < 1 || n > 65535)
    throw new Problem(`invalid port ${JSON.stringify(v)}`, 'a port is a whole number from 1 to 65535');
  return n;
}

/** Dotted-quad IPv4 to a 32-bit unsigned number, or undefined. No leading zeros (they mean octal to some tools). */
export function parseIpv4(text: string): number | undefined {
  const parts = text.split('.');
  if (parts.length !== 4) return undefined;
  let n = 0;
  for (const p of parts) {
    if (!/^(0|[1-9]\d{0,2})$/.test(p) || Number(p) > 255) return undefined;
    n = n * 256 + Number(p);
  }
  return n;
}

export function formatIpv4(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
}

export interface Cidr {
  base: number;
  prefix: number;
  /** Number of addresses in the subnet, network and broadcast included. */
  size: number;
}

/** Parse an IPv4 CIDR for a scenario network: prefix 8..30, no host bits set. */
export function parseSubnet(text: string): Cidr {
  const m = /^([0-9.]+)\/(\d{1,2})$/.exec(text.trim());
  const base = m ? parseIpv4(m[1]!) : undefined;
  if (!m || base === undefined) {
    throw new Problem(`invalid subnet ${JSON.stringify(text)}`, 'write an IPv4 CIDR such as 10.77.1.0/24');
  }
  const prefix = Number(m[2]);
  if (prefix < 8 || prefix > 30) {
    throw new Problem(
      `subnet ${text} has prefix /${prefix}; scenario networks take /8 to /30`,
      'a /24 such as 10.77.1.0/24 suits most scenarios',
    );
  }
  const size = 2 ** (32 - prefix);
  if (base % size !== 0) {
    const fixed = `${formatIpv4(base - (base % size))}/${prefix}`;
    throw new Problem(`subnet ${text} has host bits set`, `did you mean ${fixed}?`);
  }
  return { base, prefix, size };
}

export function overlaps(a: Cidr, b: Cidr): boolean {
  return a.base < b.base + b.size && b.base < a.base + a.size;
}
