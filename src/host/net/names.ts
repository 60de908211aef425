import { SnaplabError } from '../../errors.js';

/** Every namespace snaplab creates starts with this: it is the label `gc` looks for. */
export const NETNS_PREFIX = 'snaplab-';
export const NETNS_DIR = '/run/netns';
/**
 * Interface group of every link snaplab makes (bridges and both ends of veths). `ip link del group`
 * removes them all from a namespace in one call, synchronously, even while a process still holds it.
 */
export const NET_GROUP = 77;
export const DEFAULT_BRIDGE = 'br0';

export function netnsPath(name: string): string {
  checkNetnsName(name);
  return `${NETNS_DIR}/${name}`;
}

export function checkNetnsName(name: string): void {
  if (!name.startsWith(NETNS_PREFIX)) {
    throw new SnaplabError(
      'BAD_INPUT',
      `network namespace name "${name}" does not start with "${NETNS_PREFIX}"`,
      `snaplab only manages namespaces named ${NETNS_PREFIX}*, so that gc can find them; rename it`,
    );
  }
  if (!/^[A-Za-z0-9_.-]+$/.test(name) || name.length > 200) {
    throw new SnaplabError(
      'BAD_INPUT',
      `network namespace name "${name}" is not usable`,
      'use at most 200 letters, digits, ".", "_" or "-"',
    );
  }
}

/** Linux interface names: at most 15 bytes (IFNAMSIZ - 1), no "/", no spaces. */
export function checkIfName(name: string, what = 'interface'): void {
  if (!/^[A-Za-z0-9_.-]{1,15}$/.test(name) || name === '.' || name === '..') {
    throw new SnaplabError(
      'BAD_INPUT',
      `${what} name "${name}" is not a valid Linux interface name`,
      'use 1 to 15 letters, digits, ".", "_" or "-"',
    );
  }
}

function isIPv4(s: string): boolean {
  const parts = s.split('.');
  return parts.length === 4 && parts.every((p) => /^(0|[1-9]\d{0,2})$/.test(p) && Number(p) <= 255);
}

/** '10.77.1.10/24': an IPv4 address with its prefix length, as the machine's interface gets it. */
export function checkCidr(cidr: string): void {
  const [addr = '', len, ...rest] = cidr.split('/');
  if (rest.length || len === undefined || !isIPv4(addr) || !/^\d{1,2}$/.test(len) || Number(len) > 32) {
    throw new SnaplabError(
      'BAD_INPUT',
      `address "${cidr}" is not an IPv4 address with a prefix length`,
      'write it as ADDRESS/PREFIX, e.g. 10.77.1.10/24',
    );
  }
}

/** A peer to block: '10.77.1.11' (taken as /32) or a prefix '10.77.2.0/24'. Returns it with the length. */
export function hostPrefix(address: string): string {
  const withLen = address.includes('/') ? address : `${address}/32`;
  checkCidr(withLen);
  return withLen;
}

/**
 * The machine end's MAC, derived from its address (02:77 + the four bytes): a machine raised again
 * (reset, re-attach) keeps its MAC, so its peers' ARP caches stay right instead of sending to the
 * old MAC for the seconds a stale neighbour entry takes to be probed again.
 */
export function macFor(cidr: string): string {
  const addr = cidr.split('/')[0] ?? '';
  const bytes = addr.split('.').map((b) => Number(b).toString(16).padStart(2, '0'));
  return ['02', '77', ...bytes].join(':');
}
