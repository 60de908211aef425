import { SnaplabError } from '../errors.js';

const UNITS: Record<string, number> = { '': 1, b: 1, k: 1024, m: 1024 ** 2, g: 1024 ** 3, t: 1024 ** 4 };

/** Parse "256M", "1G", "512k", "1048576" (binary units) into bytes. */
export function parseSize(text: string, what = 'size'): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)(?:i?b)?\s*$/i.exec(text);
  const bytes = m ? Math.round(Number(m[1]) * UNITS[m[2]!.toLowerCase()]!) : NaN;
  if (!m || !Number.isSafeInteger(bytes) || bytes <= 0) {
    throw new SnaplabError(
      'BAD_SIZE',
      `invalid ${what} ${JSON.stringify(text)}`,
      'give a positive size such as 256M, 1G or 512k',
    );
  }
  return bytes;
}

export function parsePositiveInt(text: string, what: string): number {
  const n = Number(text);
  if (!/^\s*\d+\s*$/.test(text) || !Number.isSafeInteger(n) || n <= 0) {
    throw new SnaplabError(
      'BAD_INPUT',
      `invalid ${what} ${JSON.stringify(text)}`,
      `${what} must be a positive whole number`,
    );
  }
  return n;
}

export function parseCpus(text: string): number {
  const n = Number(text);
  if (!/^\s*\d+(\.\d+)?\s*$/.test(text) || !(n > 0)) {
    throw new SnaplabError(
      'BAD_INPUT',
      `invalid cpu count ${JSON.stringify(text)}`,
      'give a positive number of cores, e.g. 1 or 0.5',
    );
  }
  return n;
}

export function formatBytes(n: number): string {
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) {
    n /= 1024;
    i++;
  }
  return `${i === 0 ? n : n.toFixed(1)} ${u[i]}`;
}

/** Seconds (fractions allowed) to milliseconds. */
export function parseSeconds(text: string, what = 'timeout'): number {
  const n = Number(text);
  if (!/^\s*\d+(\.\d+)?\s*$/.test(text) || !(n > 0)) {
    throw new SnaplabError('BAD_INPUT', `invalid ${what} ${JSON.stringify(text)}`, `give seconds, e.g. 5 or 0.5`);
  }
  return Math.round(n * 1000);
}
